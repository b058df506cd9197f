/**
 * Installer benchmark: generates a Gemma 4 MoE checkpoint of a few hundred MB (MLX 4-bit with
 * random bytes, and a smaller bf16 one that is quantized while installing), serves it from the
 * local test hub (testkit/test-hub.ts, 127.0.0.1 only), measures the server's raw
 * throughput with plain ranged GETs in the same run, then installs each checkpoint in a child
 * process and reports install throughput and the child's peak RSS. Writes
 * bench/results/install.json.
 *
 *   node --import tsx bench/install.ts [--mb 300]
 */
import { spawn } from "node:child_process";
import { randomFillSync } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import {
  tinyConfig,
  writeSafetensors,
  type StTensor,
  type TinySpec,
} from "../testkit/checkpoints.ts";
import { TestHub } from "../testkit/test-hub.ts";
import { writeResult } from "./stats.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
const MiB = 1024 * 1024;

export interface InstallBenchRow {
  checkpoint: string;
  /** Bytes of tensor data fetched by the installer. */
  fetchedBytes: number;
  /** Installer's own wall time (s), without process start-up. */
  seconds: number;
  installMBps: number;
  rawMBps: number;
  /** Install throughput as a fraction of the raw throughput. */
  fractionOfRaw: number;
  peakRssMB: number;
}

export interface InstallBenchReport {
  rows: InstallBenchRow[];
  concurrency: number;
  maxRangeMB: number;
}

/** A Gemma 4 MoE shape with real-ish widths: about 45 MB per layer in MLX 4-bit at 48 experts. */
export function spec(experts: number, layers: number): TinySpec {
  return {
    family: "gemma4",
    vocab: 32768,
    hidden: 1024,
    layers,
    heads: 8,
    kvHeads: 2,
    headDim: 128,
    intermediate: 2048,
    types: Array.from({ length: layers }, (_, i) => (i % 3 === 2 || i === layers - 1 ? "F" : "S")),
    slidingWindow: 512,
    globalHeadDim: 256,
    globalKvHeads: 1,
    kEqV: true,
    moe: { experts, topK: 4, intermediate: 512 },
  };
}

function random(n: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i += 65536) randomFillSync(b, i, Math.min(65536, n - i));
  return b;
}

/** A benchmark checkpoint's tensor without its bytes. */
export type TensorShape = Omit<StTensor, "data">;

/**
 * The tensors of a Gemma 4 MoE checkpoint for `s` (every layer MoE, K = V on full layers), named
 * and shaped like mlx-lm's (4-bit affine, the router 8-bit: U32 packed weights with bf16 scales
 * and biases) or transformers' bf16 checkpoints, and a vision tower tensor the importer skips.
 */
export function checkpointTensors(s: TinySpec, kind: "mlx" | "bf16"): TensorShape[] {
  const P = kind === "mlx" ? "language_model.model." : "model.language_model.";
  const out: TensorShape[] = [];
  const bf16 = (name: string, shape: number[]): void => {
    out.push({ name, dtype: "BF16", shape });
  };
  const mat = (name: string, rows: number, cols: number, bits = 4, lead: number[] = []): void => {
    if (kind === "bf16") {
      bf16(lead.length ? name : `${name}.weight`, [...lead, rows, cols]);
      return;
    }
    out.push({ name: `${name}.weight`, dtype: "U32", shape: [...lead, rows, (cols * bits) / 32] });
    bf16(`${name}.scales`, [...lead, rows, cols / 64]);
    bf16(`${name}.biases`, [...lead, rows, cols / 64]);
  };
  const H = s.hidden;
  mat(`${P}embed_tokens`, s.vocab, H);
  for (let i = 0; i < s.layers; i++) {
    const p = `${P}layers.${i}.`;
    const full = s.types[i] === "F";
    const hd = full ? s.globalHeadDim! : s.headDim;
    const kv = full ? s.globalKvHeads! : s.kvHeads;
    for (const n of [
      "input_layernorm",
      "post_attention_layernorm",
      "pre_feedforward_layernorm",
      "post_feedforward_layernorm",
      "pre_feedforward_layernorm_2",
      "post_feedforward_layernorm_1",
      "post_feedforward_layernorm_2",
    ])
      bf16(`${p}${n}.weight`, [H]);
    mat(`${p}self_attn.q_proj`, s.heads * hd, H);
    mat(`${p}self_attn.k_proj`, kv * hd, H);
    if (!full) mat(`${p}self_attn.v_proj`, kv * hd, H);
    mat(`${p}self_attn.o_proj`, H, s.heads * hd);
    bf16(`${p}self_attn.q_norm.weight`, [hd]);
    bf16(`${p}self_attn.k_norm.weight`, [hd]);
    mat(`${p}mlp.gate_proj`, s.intermediate, H);
    mat(`${p}mlp.up_proj`, s.intermediate, H);
    mat(`${p}mlp.down_proj`, H, s.intermediate);
    const e = s.moe!.experts;
    const mi = s.moe!.intermediate;
    mat(`${p}router.proj`, e, H, 8);
    bf16(`${p}router.scale`, [H]);
    bf16(`${p}router.per_expert_scale`, [e]);
    if (kind === "mlx") {
      mat(`${p}experts.switch_glu.gate_proj`, mi, H, 4, [e]);
      mat(`${p}experts.switch_glu.up_proj`, mi, H, 4, [e]);
      mat(`${p}experts.switch_glu.down_proj`, H, mi, 4, [e]);
    } else {
      mat(`${p}experts.gate_up_proj`, 2 * mi, H, 4, [e]);
      mat(`${p}experts.down_proj`, H, mi, 4, [e]);
    }
    bf16(`${p}layer_scalar`, [1]);
  }
  bf16(`${P}norm.weight`, [H]);
  // A vision tower (skipped by the importer; fetched for the whole-file hash in "full" mode).
  bf16(
    `${kind === "mlx" ? "" : "model."}vision_tower.encoder.layers.0.mlp.fc1.weight`,
    [2048, 1024],
  );
  return out;
}

/**
 * The checkpoint's tensors with random bytes (the importer copies or quantizes bytes; their values
 * do not matter here). bf16 values are kept finite by clearing the exponent's top bit.
 */
function tensors(s: TinySpec, kind: "mlx" | "bf16"): StTensor[] {
  return checkpointTensors(s, kind).map((t) => {
    const data = random(t.shape.reduce((a, b) => a * b, 1) * (t.dtype === "U32" ? 4 : 2));
    if (t.dtype === "BF16") for (let i = 1; i < data.length; i += 2) data[i]! &= 0xbf;
    return { ...t, data };
  });
}

/** Writes a benchmark checkpoint (3 shards + index) and returns its tensor bytes. */
export async function writeCheckpoint(
  dir: string,
  s: TinySpec,
  kind: "mlx" | "bf16",
): Promise<number> {
  await mkdir(dir, { recursive: true });
  const config = tinyConfig(s, "nested");
  if (kind === "mlx") {
    const q: Record<string, unknown> = { group_size: 64, bits: 4, mode: "affine" };
    for (let i = 0; i < s.layers; i++)
      q[`language_model.model.layers.${i}.router.proj`] = { group_size: 64, bits: 8 };
    config.quantization = q;
    config.quantization_config = q;
  }
  await writeFile(join(dir, "config.json"), JSON.stringify(config));
  await writeFile(join(dir, "tokenizer.json"), JSON.stringify({ version: "1.0", model: {} }));
  const all = tensors(s, kind);
  const shards = 3;
  const per = Math.ceil(all.length / shards);
  const weightMap: Record<string, string> = {};
  let bytes = 0;
  for (let i = 0; i < shards; i++) {
    const name = `model-0000${i + 1}-of-0000${shards}.safetensors`;
    const part = all.slice(i * per, (i + 1) * per);
    for (const t of part) {
      weightMap[t.name] = name;
      bytes += t.data.length;
    }
    await writeSafetensors(join(dir, name), part);
  }
  await writeFile(
    join(dir, "model.safetensors.index.json"),
    JSON.stringify({ metadata: {}, weight_map: weightMap }),
  );
  return bytes;
}

/** Raw server throughput: the same ranged GETs the installer makes, bodies discarded. */
async function rawThroughput(
  hub: TestHub,
  repo: string,
  commit: string,
  concurrency: number,
  rangeBytes: number,
): Promise<number> {
  const files = hub.repos.get(repo)!.commits.get(commit)!;
  const jobs: { url: string; start: number; end: number }[] = [];
  for (const f of files.values()) {
    const url = `${hub.url}/${repo}/resolve/${commit}/${f.path}`;
    for (let s = 0; s < f.data.length; s += rangeBytes)
      jobs.push({ url, start: s, end: Math.min(f.data.length, s + rangeBytes) - 1 });
  }
  let bytes = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let job = jobs.shift(); job; job = jobs.shift()) {
        const res = await fetch(job.url, {
          headers: { range: `bytes=${job.start}-${job.end}`, "accept-encoding": "identity" },
        });
        for await (const chunk of res.body!) bytes += (chunk as Uint8Array).byteLength;
      }
    }),
  );
  return bytes / ((performance.now() - t0) / 1000);
}

function installInChild(input: unknown): Promise<{
  ok: boolean;
  fetchedBytes: number;
  seconds: number;
  maxRssBytes: number;
  message?: string;
}> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      ["--import", "tsx", join(root, "testkit/install-child.ts"), JSON.stringify(input)],
      {
        cwd: root,
        stdio: ["ignore", "pipe", "inherit"],
      },
    );
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.once("error", reject);
    child.once("exit", () => {
      try {
        resolve(JSON.parse(out.trim().split("\n").pop() ?? "{}"));
      } catch (error) {
        reject(error);
      }
    });
  });
}

/** Runs the benchmark, prints a table and writes bench/results/install.json. */
export async function runInstallBench(mb = 300): Promise<InstallBenchReport> {
  const work = await mkdtemp(join(tmpdir(), "redwing-install-bench-"));
  const hub = await TestHub.start();
  const concurrency = 4;
  const maxRangeBytes = 16 * MiB;
  const rows: InstallBenchRow[] = [];
  try {
    // MLX: about 6 MB per expert of 48 (each layer ~ 45 MB); bf16 is 3.6x larger per parameter.
    const layers = Math.max(1, Math.round(mb / 48));
    const cases: [string, TinySpec, "mlx" | "bf16"][] = [
      [`mlx ${layers} layers`, spec(48, layers), "mlx"],
      ["bf16 1 layer", spec(32, 1), "bf16"],
    ];
    for (const [label, s, kind] of cases) {
      const dir = join(work, kind);
      const size = await writeCheckpoint(dir, s, kind);
      const repo = `bench/${kind}`;
      const commit = await hub.addRepoFromDir(repo, dir);
      const raw = await rawThroughput(hub, repo, commit, concurrency, maxRangeBytes);
      const r = await installInChild({
        repo,
        revision: commit,
        dest: join(work, "models", kind),
        options: { env: { HF_ENDPOINT: hub.url }, concurrency, maxRangeBytes, reserveBytes: 0 },
      });
      if (!r.ok) throw new Error(`install failed: ${r.message}`);
      const installMBps = r.fetchedBytes / 1e6 / r.seconds;
      rows.push({
        checkpoint: `${label} (${(size / 1e6).toFixed(0)} MB)`,
        fetchedBytes: r.fetchedBytes,
        seconds: r.seconds,
        installMBps,
        rawMBps: raw / 1e6,
        fractionOfRaw: installMBps / (raw / 1e6),
        peakRssMB: r.maxRssBytes / 1e6,
      });
      await rm(join(work, "models"), { recursive: true, force: true });
      await rm(dir, { recursive: true, force: true });
    }
  } finally {
    await hub.close();
    await rm(work, { recursive: true, force: true });
  }
  const report = { rows, concurrency, maxRangeMB: maxRangeBytes / MiB };
  console.log("| checkpoint | fetched | install s | install MB/s | raw MB/s | of raw | peak RSS |");
  console.log("|---|---|---|---|---|---|---|");
  for (const r of rows) {
    console.log(
      `| ${r.checkpoint} | ${(r.fetchedBytes / 1e6).toFixed(0)} MB | ${r.seconds.toFixed(2)} | ${r.installMBps.toFixed(0)} | ${r.rawMBps.toFixed(0)} | ${(100 * r.fractionOfRaw).toFixed(0)}% | ${r.peakRssMB.toFixed(0)} MB |`,
    );
  }
  await writeResult("install", report);
  return report;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const i = process.argv.indexOf("--mb");
  await runInstallBench(i >= 0 ? Number(process.argv[i + 1]) : 300);
}
