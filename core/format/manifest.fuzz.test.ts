/**
 * Property-based fuzzing (fast-check) of the TypeScript manifest reader: whatever the text, it
 * returns a manifest or throws a UserError (never a TypeError, a RangeError or a hang), and what
 * it accepts is internally consistent (every size exact, every region inside its file).
 *
 * A short run is part of `npm test`; `node scripts/fuzz.mjs --seconds N` runs each property for
 * N seconds (REDWING_FUZZ_SECONDS) and prints the number of executions.
 */
import fc from "fast-check";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { UserError } from "../errors.ts";
import { isQuantized, type Manifest } from "./manifest.ts";
import { parseManifestText } from "./read.ts";

const CORPUS = join(import.meta.dirname, "..", "..", "fixtures", "manifest-corpus");
const SECONDS = Number(process.env.REDWING_FUZZ_SECONDS ?? "2");
const GOOD = ["good-moe", "good-dense"].map(
  (name) => JSON.parse(readFileSync(join(CORPUS, name, "manifest.json"), "utf8")) as unknown,
);

type Path = (string | number)[];

/** Every path to a value inside `value` (objects and arrays included). */
function paths(value: unknown, prefix: Path = []): Path[] {
  const out: Path[] = [prefix];
  if (Array.isArray(value)) value.forEach((v, i) => out.push(...paths(v, [...prefix, i])));
  else if (value !== null && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) out.push(...paths(v, [...prefix, k]));
  }
  return out;
}

function setAt(root: unknown, path: Path, value: unknown): unknown {
  if (path.length === 0) return value;
  const copy = structuredClone(root) as Record<string | number, unknown>;
  let node: unknown = copy;
  for (const key of path.slice(0, -1)) {
    // An earlier edit may have replaced a parent with a scalar: then this edit is dropped.
    if (node === null || typeof node !== "object") return copy;
    node = (node as Record<string | number, unknown>)[key];
  }
  if (node !== null && typeof node === "object") {
    (node as Record<string | number, unknown>)[path.at(-1)!] = value;
  }
  return copy;
}

/** Numbers that break unchecked arithmetic and unbounded fields. */
const nastyNumber = fc.constantFrom(
  0,
  -1,
  -64,
  1,
  63,
  64,
  2 ** 31,
  2 ** 32 + 1,
  2 ** 53,
  2 ** 53 - 1,
  2 ** 62,
  2 ** 64,
  1e30,
  1e300,
  1e-30,
  0.5,
  16384,
);
const replacement = fc.oneof(
  nastyNumber,
  fc.integer(),
  fc.double(),
  fc.jsonValue({ maxDepth: 2 }),
  fc.string({ maxLength: 8 }),
);

/** A good manifest with up to four values replaced. */
const mutatedManifest = fc
  .oneof(
    ...GOOD.map((good) =>
      fc
        .array(fc.tuple(fc.constantFrom(...paths(good)), replacement), {
          minLength: 1,
          maxLength: 4,
        })
        .map((edits) => edits.reduce((m, [path, value]) => setAt(m, path, value), good)),
    ),
  )
  .map((m) => JSON.stringify(m));

/** Arbitrary text near JSON: whole values, and good manifests cut or with bytes spliced in. */
const rawText = fc.oneof(
  fc.string({ unit: "binary", maxLength: 64 }),
  fc.jsonValue().map((v) => JSON.stringify(v)),
  fc
    .tuple(fc.constantFrom(...GOOD.map((g) => JSON.stringify(g))), fc.nat(), fc.string())
    .map(([t, at, insert]) => t.slice(0, at % t.length) + insert + t.slice(at % t.length)),
);

/** Checks what the reader accepted: every size exact and every region inside its file. */
function consistent(m: Manifest): void {
  const size = new Map(m.files.map((f) => [f.path, f.size]));
  const weights = size.get("weights.bin")!;
  for (const t of Object.values(m.tensors)) {
    const regions = isQuantized(t) ? [t.weight, t.scales, t.biases] : [t];
    for (const r of regions) {
      expect(Number.isSafeInteger(r.offset + r.nbytes)).toBe(true);
      expect(r.offset + r.nbytes).toBeLessThanOrEqual(weights);
    }
  }
  expect(Number.isFinite(m.architecture.embed_scale)).toBe(true);
  for (const layer of Object.values(m.experts?.layers ?? {})) {
    expect(size.get(layer.file)).toBe(layer.count * layer.stride);
  }
}

function fuzz(name: string, text: fc.Arbitrary<string>): void {
  it(`${name}: a manifest or a UserError, never a crash (${SECONDS} s)`, async () => {
    const property = fc.property(text, (t) => {
      let manifest: Manifest;
      try {
        manifest = parseManifestText(t, "fuzz/manifest.json");
      } catch (error) {
        if (!(error instanceof UserError)) throw error;
        expect(error.code).toMatch(/^model_/);
        return;
      }
      consistent(manifest);
    });
    // Slices of at most 5 s, each with its own seed, yielding in between: a long run must not
    // block the worker's event loop (vitest times out talking to a silent worker).
    const deadline = Date.now() + SECONDS * 1000;
    const seed = Date.now() % 2 ** 31;
    let executions = 0;
    for (let slice = 0; Date.now() < deadline; slice++) {
      const details = fc.check(property, {
        seed: seed + slice,
        numRuns: Number.MAX_SAFE_INTEGER,
        interruptAfterTimeLimit: Math.min(5000, deadline - Date.now()),
      });
      executions += details.numRuns;
      expect(details.failed, fc.defaultReportMessage(details) ?? "").toBe(false);
      await new Promise((resolve) => setImmediate(resolve));
    }
    console.log(`fuzz ${name}: ${executions} executions in ${SECONDS} s (seed ${seed})`);
    expect(executions).toBeGreaterThan(0);
  });
}

describe("the TypeScript manifest reader under fuzzing", () => {
  fuzz("mutated manifests", mutatedManifest);
  fuzz("raw text", rawText);
});
