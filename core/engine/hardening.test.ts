/**
 * Hostile input to the native engine, through every way in: a crafted model directory whose
 * expert byte sizes wrap around 64 bits, a model whose weights hold NaN, and protocol messages
 * with out-of-range numbers, to `redwing-engine`, `bin/redwing logits` and the decode service
 * (docs/security.md "Native engine and model directories").
 */
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync } from "node:fs";
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Manifest, QuantizedTensor } from "../format/manifest.ts";
import { importCheckpoint } from "../import/index.ts";
import { nativeBinary } from "../native.ts";
import { EngineClient, EngineError, SERVICE_BINARY } from "./client.ts";
import { EventSchema } from "./protocol.ts";

const ROOT = join(import.meta.dirname, "..", "..");
let work = "";
let model = "";
let env: NodeJS.ProcessEnv = {};
let copies = 0;

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), "redwing-hardening-"));
  model = join(work, "gemma4-moe");
  await importCheckpoint(join(ROOT, "fixtures", "gemma4-moe", "mlx"), model, { durable: false });
  // Lock files go under $REDWING_HOME/locks: kept inside the test's directory.
  env = { ...process.env, REDWING_HOME: join(work, "home") };
});

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

function readManifest(dir: string): Manifest {
  return JSON.parse(readFileSync(join(dir, "manifest.json"), "utf8")) as Manifest;
}

/** A copy of the fixture model with its manifest (and optionally weights.bin) edited. */
function craft(
  edit: (m: Manifest) => void,
  editWeights?: (weights: Buffer, m: Manifest) => void,
): string {
  const dir = join(work, `crafted-${copies++}`);
  cpSync(model, dir, { recursive: true });
  const m = readManifest(dir);
  edit(m);
  if (editWeights) {
    const weights = readFileSync(join(dir, "weights.bin"));
    editWeights(weights, m);
    writeFileSync(join(dir, "weights.bin"), weights);
    // Keep the manifest honest: the poisoned file's hash is the listed one.
    const entry = m.files.find((f) => f.path === "weights.bin")!;
    entry.sha256 = createHash("sha256").update(weights).digest("hex");
  }
  writeFileSync(join(dir, "manifest.json"), JSON.stringify(m));
  return dir;
}

/**
 * Expert parts [2^62, 64] and [64, 2^62] at 4 bits with group 32 and bf16 scales: each byte
 * count (rows * cols * 4 / 8, rows * cols / 32 * 2) is a multiple of 2^64, so in unchecked 64-bit
 * arithmetic zero-byte regions match the shapes, and the scratch sizes computed from them wrap
 * to a buffer a kernel then writes past.
 */
function wrappedExperts(m: Manifest): void {
  const huge = 2 ** 62;
  m.architecture.moe!.intermediate_size = huge;
  for (const layer of Object.values(m.experts!.layers)) {
    for (const [name, part] of Object.entries(layer.parts)) {
      part.shape = name === "down_proj" ? [64, huge] : [huge, 64];
      part.group_size = 32;
      part.scale_dtype = "bf16";
      part.weight = { offset: 0, nbytes: 0 };
      part.scales = { offset: 0, nbytes: 0 };
      part.biases = { offset: 0, nbytes: 0 };
    }
  }
}

function run(command: string, args: string[]): { status: number | null; stderr: string } {
  const r = spawnSync(command, args, { env, encoding: "utf8", timeout: 60_000 });
  return { status: r.status, stderr: r.stderr };
}

describe("a crafted model directory whose expert sizes wrap around 64 bits", () => {
  it("is refused by redwing-engine, bin/redwing logits and the service, naming the field", async () => {
    const dir = craft(wrappedExperts);
    const field = "architecture.moe.intermediate_size";
    for (const cmd of ["logits", "generate"]) {
      const args = [cmd, "--model", dir, "--tokens", "2,10,20", "--threads", "1"];
      const r = run(
        nativeBinary("redwing-engine"),
        cmd === "generate" ? [...args, "--max-new", "2"] : args,
      );
      expect(r.status).toBe(1);
      expect(r.stderr).toContain(field);
    }
    const cli = run(join(ROOT, "bin", "redwing"), [
      "logits",
      "--model",
      dir,
      "--tokens",
      "2,10",
      "--threads",
      "1",
    ]);
    expect(cli.status).not.toBe(0);
    expect(cli.stderr).toContain(field);

    const client = await EngineClient.start({ env });
    try {
      const refused = await client
        .load({ model: dir, context: 64, threads: 1 })
        .catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(EngineError);
      expect((refused as EngineError).code).toBe("load_failed");
      expect((refused as EngineError).message).toContain(field);
      const gen = await client
        .generateAll({ tokens: [2, 10], max_new_tokens: 2, sampling: { temperature: 0 } })
        .catch((e: unknown) => e);
      expect((gen as EngineError).code).toBe("not_loaded");
    } finally {
      await client.close();
    }
  });
});

describe("a model whose weights hold NaN (valid manifest, poisoned bytes)", () => {
  const poisoned = (): string =>
    craft(
      () => {},
      (weights, m) => {
        // The embedding's scales (it is also the output head), bf16 NaN (0x7fc0): every logit
        // becomes NaN.
        const embed = m.tensors.embed_tokens! as QuantizedTensor;
        expect(embed.scale_dtype).toBe("bf16");
        for (let i = 0; i < embed.scales.nbytes; i += 2) {
          weights.writeUInt16LE(0x7fc0, embed.scales.offset + i);
        }
      },
    );

  it("stops generation with non_finite_logits in the service and the client", async () => {
    const dir = poisoned();
    const client = await EngineClient.start({ env });
    try {
      await client.load({ model: dir, context: 64, threads: 1 });
      const failed = await client
        .generateAll({ tokens: [2, 10, 20], max_new_tokens: 4, sampling: { temperature: 0 } })
        .catch((e: unknown) => e);
      expect(failed).toBeInstanceOf(EngineError);
      expect((failed as EngineError).code).toBe("non_finite_logits");
      expect((failed as EngineError).message).toContain("non-finite logit (NaN");
    } finally {
      await client.close();
    }
  });

  it("makes redwing-engine generate fail with a clear error", () => {
    const dir = poisoned();
    const r = run(nativeBinary("redwing-engine"), [
      "generate",
      "--model",
      dir,
      "--tokens",
      "2,10,20",
      "--max-new",
      "3",
      "--temperature",
      "0",
      "--threads",
      "1",
    ]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain("non-finite logit");
  });
});

/** A raw service process and a line-at-a-time reader of its events. */
function rawService(prefix: string[] = []) {
  const [command, ...args] =
    prefix.length > 0 ? [...prefix, nativeBinary(SERVICE_BINARY)] : [nativeBinary(SERVICE_BINARY)];
  const child = spawn(command!, args, { env, stdio: ["pipe", "pipe", "pipe"] });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  return {
    child,
    send: (line: string) => child.stdin.write(`${line}\n`),
    next: async () => {
      // load_progress events come before a load's answer; only the answer matters here.
      for (;;) {
        const event = EventSchema.parse(JSON.parse((await lines.next()).value as string));
        if (event.type !== "load_progress") return event;
      }
    },
  };
}

describe("the service's protocol parser", () => {
  it("refuses out-of-range numbers with bad_request naming the field, and 1e400 as bad_json", async () => {
    const s = rawService();
    try {
      const refused = async (line: string, code: string, text: string) => {
        s.send(line);
        const event = await s.next();
        expect(event).toMatchObject({ type: "error", code });
        expect((event as { message: string }).message).toContain(text);
      };
      await refused(
        '{"type":"load","id":1,"model":"/x","threads":100000}',
        "bad_request",
        '"threads"',
      );
      // 2^32 truncated to int is 0 (top-k off); 2^32 + 2 truncated is 2.
      await refused(
        '{"type":"generate","id":2,"tokens":[2],"sampling":{"top_k":4294967296}}',
        "bad_request",
        '"sampling.top_k"',
      );
      await refused(
        '{"type":"generate","id":3,"tokens":[2],"max_new_tokens":4294967298}',
        "bad_request",
        '"max_new_tokens"',
      );
      await refused(
        '{"type":"generate","id":4,"tokens":[2],"sampling":{"repetition_penalty":1e39}}',
        "bad_request",
        '"sampling.repetition_penalty"',
      );
      await refused('{"type":"hello","id":5,"protocol":1e400}', "bad_json", "1e400");
      await refused('{"type":"load","id":6,"model":"a\\u0000b"}', "bad_request", "NUL");
      s.send('{"type":"hello","id":7}');
      expect(await s.next()).toMatchObject({ type: "hello", id: 7 });
    } finally {
      s.child.kill("SIGKILL");
    }
  });

  it("creates no lock file for a directory that is not a model", async () => {
    const notModel = join(work, "not-a-model");
    mkdirSync(notModel, { recursive: true });
    const locks = join(work, "home", "locks");
    const before = existsSync(locks) ? readdirSync(locks) : [];
    const s = rawService();
    try {
      s.send(JSON.stringify({ type: "load", id: 1, model: notModel, threads: 1 }));
      expect(await s.next()).toMatchObject({ type: "error", code: "load_failed" });
      const after = existsSync(locks) ? readdirSync(locks) : [];
      expect(after).toEqual(before);
    } finally {
      s.child.kill("SIGKILL");
    }
  });

  it("reports a refused thread as an error and keeps serving (no abort)", async () => {
    // 1024 thread stacks (8 MiB each) do not fit in 2 GiB of address space.
    const s = rawService(["sh", "-c", 'ulimit -v 2000000 && exec "$0"']);
    try {
      s.send(JSON.stringify({ type: "load", id: 1, model, threads: 1024, context: 64 }));
      const event = await s.next();
      expect(event).toMatchObject({ type: "error", code: "load_failed" });
      expect((event as { message: string }).message).toContain("threads");
      s.send('{"type":"hello","id":2}');
      expect(await s.next()).toMatchObject({ type: "hello", id: 2 });
    } finally {
      s.child.kill("SIGKILL");
    }
  });
});
