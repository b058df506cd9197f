/**
 * Property-based fuzzing of the safetensors header parser (shared by the importer and the
 * installer, which reads headers from the network): arbitrary bytes, and headers built from
 * valid and hostile parts, give a clear UserError or a header whose every tensor lies inside the
 * file, without overlaps, with as many bytes as its dtype and shape need. Never another
 * exception, never an allocation sized by the input. Runs: testkit/fuzz.ts (FUZZ_RUNS).
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { UserError } from "../errors.ts";
import { corpus, fuzz } from "../../testkit/fuzz.ts";
import {
  parseSafetensorsHeader,
  safetensorsHeaderLength,
  stDtypeSize,
  type StDType,
} from "./safetensors.ts";

const DTYPES: StDType[] = ["BOOL", "U8", "I8", "F16", "BF16", "F32", "I64", "F64", "F8_E4M3"];

/** The parser's contract for a header of `header` bytes in a file of `size` bytes. */
function check(header: Uint8Array, size: number): void {
  let parsed: ReturnType<typeof parseSafetensorsHeader>;
  try {
    parsed = parseSafetensorsHeader("fuzz.safetensors", "/fuzz", header, size);
  } catch (error) {
    if (!(error instanceof UserError)) throw error;
    expect(error.code).toBe("safetensors_invalid");
    expect(error.message).toMatch(/^fuzz\.safetensors: /);
    // A clear error: nothing computed from a missing or mistyped value.
    expect(error.message).not.toMatch(/\bNaN\b|\bundefined\b|function|\[object Object\]/);
    return;
  }
  const dataStart = 8 + header.byteLength;
  const regions: [number, number][] = [];
  for (const t of parsed.tensors.values()) {
    expect(t.start).toBeGreaterThanOrEqual(dataStart);
    expect(t.start + t.nbytes).toBeLessThanOrEqual(size);
    expect(t.nbytes).toBe(t.shape.reduce((a, b) => a * b, 1) * stDtypeSize(t.dtype));
    regions.push([t.start, t.start + t.nbytes]);
  }
  regions.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < regions.length; i++) {
    expect(regions[i]![0]).toBeGreaterThanOrEqual(regions[i - 1]![1]);
  }
  for (const v of Object.values(parsed.metadata)) expect(typeof v).toBe("string");
}

const dim = fc.oneof(
  fc.integer({ min: 0, max: 8 }),
  fc.constantFrom(-1, 1.5, 2 ** 31, 2 ** 53, 1e300, "4", null),
);
const offset = fc.oneof(
  fc.integer({ min: 0, max: 256 }),
  fc.constantFrom(-1, 0.5, 2 ** 53 + 2, "0", null),
);
const entry = fc.record(
  {
    dtype: fc.oneof(fc.constantFrom(...DTYPES), fc.constantFrom("toString", "", "f32", "Q4")),
    shape: fc.oneof(fc.array(dim, { maxLength: 4 }), fc.jsonValue()),
    data_offsets: fc.oneof(fc.tuple(offset, offset), fc.array(offset, { maxLength: 3 })),
  },
  { requiredKeys: [] },
);
const metadata = fc.oneof(
  fc.dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 8 })),
  fc.jsonValue(),
);
/** A JSON header: tensors built from valid and hostile parts, maybe metadata. */
const structuredHeader = fc
  .tuple(
    fc.dictionary(
      fc.oneof(fc.string({ maxLength: 8 }), fc.constantFrom("__proto__", "constructor")),
      fc.oneof(entry, fc.jsonValue()),
      { maxKeys: 5 },
    ),
    fc.option(metadata, { nil: undefined }),
  )
  .map(([tensors, meta]) =>
    JSON.stringify(meta === undefined ? tensors : { ...tensors, __metadata__: meta }),
  );

describe("safetensors header parser (fuzz)", () => {
  it("arbitrary bytes: a clear error or a consistent header", async () => {
    await fuzz(
      "safetensors header bytes",
      fc.record({ header: fc.uint8Array({ maxLength: 300 }), extra: fc.nat({ max: 4096 }) }),
      ({ header, extra }) => check(header, 8 + header.byteLength + extra),
      { runs: 5000 },
    );
  });

  it("structured headers from valid and hostile parts: a clear error or a consistent header", async () => {
    await fuzz(
      "safetensors header json",
      fc.record({
        text: fc.oneof(structuredHeader, fc.constantFrom(...corpus<string>("safetensors-header"))),
        extra: fc.oneof(fc.nat({ max: 512 }), fc.constant(0)),
      }),
      ({ text, extra }) => {
        const header = Buffer.from(text, "utf8");
        check(header, 8 + header.byteLength + extra);
      },
      {
        runs: 5000,
        examples: corpus<string>("safetensors-header").map((text) => ({ text, extra: 64 })),
      },
    );
  });

  it("the header length prefix never asks for more than the file holds", async () => {
    await fuzz(
      "safetensors header length",
      fc.record({ first8: fc.uint8Array({ minLength: 8, maxLength: 8 }), size: fc.nat() }),
      ({ first8, size }) => {
        try {
          const n = safetensorsHeaderLength("fuzz.safetensors", first8, size);
          expect(n).toBeGreaterThanOrEqual(0);
          expect(n).toBeLessThanOrEqual(Math.min(256 * 1024 * 1024, size - 8));
        } catch (error) {
          if (!(error instanceof UserError)) throw error;
        }
      },
      { runs: 5000 },
    );
  });
});
