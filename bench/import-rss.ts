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

const args = process.argv.slice(2);
const flag = (name: string, fallback: number): number => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : fallback;
};
const work = args[0] && !args[0].startsWith("--") ? args[0] : join(tmpdir(), "redwing-import-rss");
const experts = flag("--experts", 16);
const layers = flag("--layers", 2);
const root = fileURLToPath(new URL("..", import.meta.url));

const H = 2816;
const V = 262144;
const I = 2112;
const MI = 704;
const heads = 16;
const types = Array.from({ length: layers }, (_, i) =>
  i === layers - 1 || (i + 1) % 6 === 0 ? "full_attention" : "sliding_attention",
);

const tensors: { name: string; shape: number[] }[] = [];
const P = "model.language_model.";
tensors.push({ name: `${P}embed_tokens.weight`, shape: [V, H] });
tensors.push({ name: `${P}norm.weight`, shape: [H] });
types.forEach((t, i) => {
  const p = `${P}layers.${i}.`;
  const full = t === "full_attention";
  const hd = full ? 512 : 256;
  const kv = full ? 2 : 8;
  for (const n of [
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "pre_feedforward_layernorm_2",
    "post_feedforward_layernorm_1",
    "post_feedforward_layernorm_2",
  ]) {
    tensors.push({ name: `${p}${n}.weight`, shape: [H] });
  }
  tensors.push({ name: `${p}self_attn.q_proj.weight`, shape: [heads * hd, H] });
  tensors.push({ name: `${p}self_attn.k_proj.weight`, shape: [kv * hd, H] });
  if (!full) tensors.push({ name: `${p}self_attn.v_proj.weight`, shape: [kv * hd, H] });
  tensors.push({ name: `${p}self_attn.o_proj.weight`, shape: [H, heads * hd] });
  tensors.push({ name: `${p}self_attn.q_norm.weight`, shape: [hd] });
  tensors.push({ name: `${p}self_attn.k_norm.weight`, shape: [hd] });
  tensors.push({ name: `${p}mlp.gate_proj.weight`, shape: [I, H] });
  tensors.push({ name: `${p}mlp.up_proj.weight`, shape: [I, H] });
  tensors.push({ name: `${p}mlp.down_proj.weight`, shape: [H, I] });
  tensors.push({ name: `${p}router.proj.weight`, shape: [experts, H] });
  tensors.push({ name: `${p}router.scale`, shape: [H] });
  tensors.push({ name: `${p}router.per_expert_scale`, shape: [experts] });
  tensors.push({ name: `${p}experts.gate_up_proj`, shape: [experts, 2 * MI, H] });
  tensors.push({ name: `${p}experts.down_proj`, shape: [experts, H, MI] });
  tensors.push({ name: `${p}layer_scalar`, shape: [1] });
});

const config = {
  model_type: "gemma4",
  text_config: {
    model_type: "gemma4_text",
    vocab_size: V,
    hidden_size: H,
    intermediate_size: I,
    num_hidden_layers: layers,
    num_attention_heads: heads,
    num_key_value_heads: 8,
    num_global_key_value_heads: 2,
    head_dim: 256,
    global_head_dim: 512,
    attention_k_eq_v: true,
    enable_moe_block: true,
    num_experts: experts,
    top_k_experts: Math.min(8, experts),
    moe_intermediate_size: MI,
    hidden_size_per_layer_input: 0,
    num_kv_shared_layers: 0,
    sliding_window: 1024,
    layer_types: types,
    final_logit_softcapping: 30,
    max_position_embeddings: 262144,
  },
  eos_token_id: [1, 106],
};

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
