/**
 * Writes fixtures/manifest-corpus: small model directories, good and bad, that both manifest
 * readers (native/src/format/model_dir.cpp and core/format/read.ts) are held to. cases.json says
 * for each directory whether it is valid and, if not, a piece of text both readers' errors must
 * contain (the field or the fault), so the two readers accept and refuse exactly the same ones.
 *
 *   npx tsx scripts/manifest-corpus.ts
 *
 * Weights are zeros (git stores one blob for all copies): the readers check layout, not values.
 */
import { createHash } from "node:crypto";
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { importCheckpoint } from "../core/import/importer.ts";
import { type TinySpec, writeTinyCheckpoint } from "../testkit/checkpoints.ts";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const OUT = join(ROOT, "fixtures", "manifest-corpus");

// The two base models: the same smallest shape, as a Gemma 4 MoE and a Gemma 3 dense model.
const SMALLEST = {
  vocab: 64,
  hidden: 64,
  layers: 2,
  heads: 1,
  kvHeads: 1,
  headDim: 64,
  intermediate: 64,
  types: ["S", "F"],
  slidingWindow: 8,
} satisfies Partial<TinySpec>;
const MOE: TinySpec = {
  ...SMALLEST,
  family: "gemma4",
  globalHeadDim: 64,
  globalKvHeads: 1,
  kEqV: true,
  moe: { experts: 2, topK: 1, intermediate: 64 },
};
const DENSE: TinySpec = { ...SMALLEST, family: "gemma3" };

type Json = Record<string, unknown>;
interface Case {
  base: "moe" | "dense";
  valid: boolean;
  /** Text both readers' error messages must contain. */
  error?: string;
  /** Edits the parsed manifest (written back as JSON) ... */
  manifest?: (m: Json) => void;
  /** ... or replaces its text. */
  text?: (json: string) => string;
  /** Edits the directory (extra files and such). */
  files?: (dir: string) => void;
}

// Short accessors for the edits below.
const arch = (m: Json) => m.architecture as Json;
const tensors = (m: Json) => m.tensors as Record<string, Json>;
const expertLayer = (m: Json, i: string) =>
  ((m.experts as Json).layers as Record<string, Json>)[i]!;
const part = (m: Json, i: string, p: string) =>
  (expertLayer(m, i).parts as Record<string, Json>)[p]!;

const cases: Record<string, Case> = {
  "good-moe": { base: "moe", valid: true },
  "good-dense": { base: "dense", valid: true },
  "good-integral-floats": {
    base: "dense",
    valid: true,
    // JSON has one number type: 64.0 is the integer 64 to both readers.
    text: (t) => t.replace('"hidden_size":64', '"hidden_size":64.0'),
  },
  "bad-bom": {
    base: "dense",
    valid: false,
    error: "byte order mark",
    text: (t) => "\uFEFF" + t,
  },
  "bad-format-version-huge": {
    base: "dense",
    valid: false,
    error: "format_version",
    text: (t) => t.replace('"format_version":1', '"format_version":4294967297'),
  },
  "bad-format-version-2": {
    base: "dense",
    valid: false,
    error: "format_version",
    manifest: (m) => (m.format_version = 2),
  },
  "bad-embed-scale-huge": {
    base: "dense",
    valid: false,
    error: "embed_scale",
    manifest: (m) => (arch(m).embed_scale = 1e30),
  },
  "bad-embed-scale-zero": {
    base: "dense",
    valid: false,
    error: "embed_scale",
    manifest: (m) => (arch(m).embed_scale = 0),
  },
  "bad-rms-norm-eps": {
    base: "dense",
    valid: false,
    error: "rms_norm_eps",
    manifest: (m) => (arch(m).rms_norm_eps = 5),
  },
  "bad-attention-scale": {
    base: "dense",
    valid: false,
    error: "attention_scale",
    manifest: (m) => (arch(m).attention_scale = 1e300),
  },
  "bad-softcap": {
    base: "moe",
    valid: false,
    error: "final_logit_softcap",
    manifest: (m) => (arch(m).final_logit_softcap = 1e-30),
  },
  "bad-rope-theta": {
    base: "dense",
    valid: false,
    error: "theta",
    manifest: (m) => (((arch(m).layers as Json[])[0]!.rope as Json).theta = 1e300),
  },
  "bad-number-1e400": {
    base: "dense",
    valid: false,
    error: "JSON",
    text: (t) => t.replace(/"rms_norm_eps":[^,]+/, '"rms_norm_eps":1e400'),
  },
  "bad-num-layers-over-int": {
    base: "dense",
    valid: false,
    error: "num_layers",
    manifest: (m) => (arch(m).num_layers = 2 ** 32 + 2),
  },
  "bad-overlapping-regions": {
    base: "dense",
    valid: false,
    error: "overlap",
    manifest: (m) => (tensors(m)["layers.0.input_layernorm"]!.offset = tensors(m).norm!.offset),
  },
  "bad-overlapping-expert-parts": {
    base: "moe",
    valid: false,
    error: "overlap",
    manifest: (m) => (part(m, "0", "up_proj").weight = part(m, "0", "gate_proj").weight),
  },
  "bad-extra-file": {
    base: "dense",
    valid: false,
    error: "not listed in the manifest",
    files: (dir) => writeFileSync(join(dir, "notes.txt"), "hello\n"),
  },
  "bad-extra-directory": {
    base: "dense",
    valid: false,
    error: "unexpected directory",
    files: (dir) => {
      mkdirSync(join(dir, "more"));
      writeFileSync(join(dir, "more", "notes.txt"), "hello\n");
    },
  },
  "bad-wrapped-expert-size": {
    base: "moe",
    valid: false,
    error: "moe.intermediate_size",
    // Byte counts that are multiples of 2^64: zero in unchecked 64-bit arithmetic.
    manifest: (m) => {
      const huge = 2 ** 62;
      (arch(m).moe as Json).intermediate_size = huge;
      for (const i of ["0", "1"]) {
        for (const p of ["gate_proj", "up_proj", "down_proj"]) {
          Object.assign(part(m, i, p), {
            shape: p === "down_proj" ? [64, huge] : [huge, 64],
            group_size: 32,
            scale_dtype: "bf16",
            weight: { offset: 0, nbytes: 0 },
            scales: { offset: 0, nbytes: 0 },
            biases: { offset: 0, nbytes: 0 },
          });
        }
      }
    },
  },
  "bad-expert-part-bytes-overflow": {
    base: "moe",
    valid: false,
    error: "gate_proj",
    manifest: (m) => {
      const big = 2147483616; // a multiple of 32 below 2^31: rows * cols * 8 needs 65 bits
      Object.assign(part(m, "0", "gate_proj"), { shape: [big, big], bits: 8 });
    },
  },
  "bad-offset-negative": {
    base: "dense",
    valid: false,
    error: "offset",
    manifest: (m) => (tensors(m).norm!.offset = -64),
  },
  "bad-region-past-end": {
    base: "dense",
    valid: false,
    error: "norm",
    manifest: (m) => (tensors(m).norm!.offset = 1 << 30),
  },
  "bad-missing-tensor": {
    base: "dense",
    valid: false,
    error: "layers.1.self_attn.k_norm",
    manifest: (m) => delete tensors(m)["layers.1.self_attn.k_norm"],
  },
  "bad-unexpected-tensor": {
    base: "dense",
    valid: false,
    error: "layers.7.extra",
    manifest: (m) =>
      (tensors(m)["layers.7.extra"] = { ...tensors(m).norm!, offset: 0, nbytes: 0, shape: [0] }),
  },
  "bad-tensor-shape": {
    base: "dense",
    valid: false,
    error: "norm",
    manifest: (m) => Object.assign(tensors(m).norm!, { shape: [32], nbytes: 64 }),
  },
  "bad-expert-count": {
    base: "moe",
    valid: false,
    error: "count",
    manifest: (m) => (expertLayer(m, "0").count = 3),
  },
  "bad-expert-file-name": {
    base: "moe",
    valid: false,
    error: "experts/layer_000.bin",
    manifest: (m) => (expertLayer(m, "0").file = "weights.bin"),
  },
  "bad-expert-layer-missing": {
    base: "moe",
    valid: false,
    error: "experts.layers",
    manifest: (m) => {
      delete ((m.experts as Json).layers as Json)["1"];
      m.files = (m.files as Json[]).filter((f) => f.path !== "experts/layer_001.bin");
    },
    files: (dir) => rmSync(join(dir, "experts", "layer_001.bin")),
  },
  "bad-file-size": {
    base: "dense",
    valid: false,
    error: "weights.bin",
    manifest: (m) => ((m.files as Json[]).find((f) => f.path === "weights.bin")!.size = 64),
  },
  "bad-file-listed-twice": {
    base: "dense",
    valid: false,
    error: "twice",
    manifest: (m) => (m.files as Json[]).push({ ...(m.files as Json[])[0]! }),
  },
  "bad-path-traversal": {
    base: "dense",
    valid: false,
    error: "path",
    manifest: (m) =>
      (m.files as Json[]).push({ path: "../weights.bin", size: 1, sha256: "0".repeat(64) }),
  },
  "bad-sha256": {
    base: "dense",
    valid: false,
    error: "sha256",
    manifest: (m) => ((m.files as Json[])[0]!.sha256 = "XYZ"),
  },
  "bad-norm-weight-offset": {
    base: "dense",
    valid: false,
    error: "norm_weight_offset",
    manifest: (m) => (arch(m).norm_weight_offset = 0.5),
  },
  "bad-head-dim-odd": {
    base: "dense",
    valid: false,
    error: "head_dim",
    manifest: (m) => ((arch(m).layers as Json[])[0]!.head_dim = 63),
  },
  "bad-top-k-over-experts": {
    base: "moe",
    valid: false,
    error: "top_k",
    manifest: (m) => ((arch(m).moe as Json).top_k = 3),
  },
};

function sha256(path: string): string {
  return createHash("sha256").update(readFileSync(path)).digest("hex");
}

/** Imports a tiny checkpoint and zeroes its weights (fixing sizes' hashes). */
async function base(spec: TinySpec, into: string): Promise<void> {
  const ckpt = `${into}-ckpt`;
  await writeTinyCheckpoint(ckpt, spec, { form: "nested", kind: "float" });
  await importCheckpoint(ckpt, into, { durable: false });
  const manifest = JSON.parse(readFileSync(join(into, "manifest.json"), "utf8")) as Json;
  for (const file of manifest.files as { path: string; size: number; sha256: string }[]) {
    writeFileSync(join(into, file.path), Buffer.alloc(file.size));
    file.sha256 = sha256(join(into, file.path));
  }
  (manifest.source as Json).repo = null;
  (manifest.source as Json).revision = null;
  (manifest.source as Json).files = [];
  manifest.created_by = "scripts/manifest-corpus.ts";
  writeFileSync(join(into, "manifest.json"), JSON.stringify(manifest));
}

const work = mkdtempSync(join(tmpdir(), "redwing-corpus-"));
try {
  await base(MOE, join(work, "moe"));
  await base(DENSE, join(work, "dense"));
  rmSync(OUT, { recursive: true, force: true });
  mkdirSync(OUT, { recursive: true });
  const index: Record<string, { valid: boolean; error?: string }> = {};
  for (const [name, c] of Object.entries(cases)) {
    const dir = join(OUT, name);
    cpSync(join(work, c.base), dir, { recursive: true });
    const path = join(dir, "manifest.json");
    let text = readFileSync(path, "utf8");
    if (c.manifest) {
      const m = JSON.parse(text) as Json;
      c.manifest(m);
      text = JSON.stringify(m);
    }
    if (c.text) text = c.text(text);
    writeFileSync(path, text);
    c.files?.(dir);
    index[name] = c.valid ? { valid: true } : { valid: false, error: c.error! };
  }
  writeFileSync(join(OUT, "cases.json"), JSON.stringify(index, null, 2) + "\n");
  console.log(
    `${Object.keys(index).length} cases in ${OUT}: ${readdirSync(OUT).length - 1} directories`,
  );
} finally {
  rmSync(work, { recursive: true, force: true });
}
