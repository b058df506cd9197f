/**
 * Measures the importer's peak memory on a large synthetic bf16 checkpoint shaped like
 * Gemma 4 26B-A4B (full 262144 x 2816 embedding, real layer widths, fewer layers and experts).
 *
 *   node --import tsx bench/import-rss.ts [work-dir] [--experts N] [--layers N]
 *
 * Writes <work-dir>/ckpt (about 2 GB with the defaults), runs `bin/redwing import` under
 * /usr/bin/time -v and prints the maximum resident set size and the wall time.
 */
import { spawnSync } from "node:child_process";
import { open, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { tinyConfig, type TinySpec } from "../testkit/checkpoints.ts";
import { checkpointTensors } from "./install.ts";

const args = process.argv.slice(2);
const flag = (name: string, fallback: number): number => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : fallback;
};
const work = args[0] && !args[0].startsWith("--") ? args[0] : join(tmpdir(), "redwing-import-rss");
const experts = flag("--experts", 16);
const layers = flag("--layers", 2);
const root = fileURLToPath(new URL("..", import.meta.url));

// Gemma 4 26B-A4B's widths (config.json), with `layers` layers and `experts` experts.
const model: TinySpec = {
  family: "gemma4",
  vocab: 262144,
  hidden: 2816,
  layers,
  heads: 16,
  kvHeads: 8,
  headDim: 256,
  intermediate: 2112,
  types: Array.from({ length: layers }, (_, i) =>
    i === layers - 1 || (i + 1) % 6 === 0 ? "F" : "S",
  ),
  slidingWindow: 1024,
  globalHeadDim: 512,
  globalKvHeads: 2,
  kEqV: true,
  moe: { experts, topK: Math.min(8, experts), intermediate: 704 },
};
const tensors = checkpointTensors(model, "bf16");
const config = tinyConfig(model, "nested");

async function writeCheckpoint(dir: string): Promise<number> {
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, "config.json"), JSON.stringify(config, null, 1));
  const header: Record<string, unknown> = {};
  let offset = 0;
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1) * 2;
    header[t.name] = { dtype: "BF16", shape: t.shape, data_offsets: [offset, offset + n] };
    offset += n;
  }
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  const handle = await open(join(dir, "model.safetensors"), "w");
  await handle.write(Buffer.concat([len, json]));
  // Random bf16 values around +-0.05 (xorshift; the importer's cost does not depend on them).
  const chunk = Buffer.alloc(16 * 1024 * 1024);
  let x = 0x9e3779b9;
  let left = offset;
  while (left > 0) {
    for (let i = 0; i < chunk.length; i += 2) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      // sign, exponent 2^-5..2^-4 region, random mantissa
      chunk.writeUInt16LE(((x >>> 16) & 0x8000) | 0x3d00 | (x & 0x01ff), i);
    }
    const n = Math.min(left, chunk.length);
    await handle.write(chunk.subarray(0, n));
    left -= n;
  }
  await handle.close();
  return offset + 8 + json.length;
}

const ckpt = join(work, "ckpt");
const out = join(work, "model");
await rm(work, { recursive: true, force: true });
const started = Date.now();
const bytes = await writeCheckpoint(ckpt);
console.log(
  `wrote ${ckpt}: ${(bytes / 1e9).toFixed(2)} GB in ${((Date.now() - started) / 1000).toFixed(1)} s`,
);
const run = spawnSync(
  "/usr/bin/time",
  ["-v", process.execPath, join(root, "bin", "redwing"), "import", ckpt, "--out", out],
  {
    encoding: "utf8",
    cwd: root,
  },
);
const stderr = run.stderr ?? "";
const rss = /Maximum resident set size \(kbytes\): (\d+)/.exec(stderr)?.[1];
const wall = /Elapsed \(wall clock\) time.*: (.*)/.exec(stderr)?.[1];
process.stdout.write(run.stdout ?? "");
if (run.status !== 0 || !rss) {
  console.error(stderr.slice(-3000));
  process.exit(1);
}
console.log(`import peak RSS: ${(Number(rss) / 1024).toFixed(0)} MiB, wall ${wall}`);
