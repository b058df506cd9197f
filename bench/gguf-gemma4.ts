/**
 * A GGUF with the shapes of the synthetic Gemma 4 26B-A4B (`redwing synth --preset
 * gemma-4-26b-a4b`) and random weights, for llama.cpp: Q4_0 for every 4-bit matrix of the
 * Redwing model (4.5 bits per weight, as Redwing's 4-bit groups of 64 with bf16 scale and bias),
 * Q8_0 for the router, F32 for norms and scales.
 *
 * Names and keys are those llama.cpp's gemma4 loader reads (src/models/gemma4.cpp and
 * src/llama-arch.cpp of the llama.cpp that node-llama-cpp bundles): experts as one
 * `ffn_gate_up_exps` [hidden, 2 * moe_ff, experts] and one `ffn_down_exps` tensor per layer,
 * the per-expert scale as `ffn_down_exps.scale`, full-attention layers without `attn_v` (K is V),
 * and `rope_freqs` for the proportional RoPE of full layers. Both engines are fed token ids; the
 * vocabulary is a placeholder (see dummyVocabulary).
 */
import { existsSync } from "node:fs";
import { mkdir, rename } from "node:fs/promises";
import { join } from "node:path";
import { SYNTH_PRESETS } from "../core/synth/presets.ts";
import {
  GgmlType,
  constantF32,
  f32,
  randomBlocks,
  str,
  u32,
  valuesF32,
  writeGguf,
  type GgufTensor,
  type GgufValue,
} from "./gguf.ts";

const preset = SYNTH_PRESETS["gemma-4-26b-a4b"];

/** Layer kinds of the first `layers` layers, the last one full as `redwing synth --layers` does. */
export function gemma4LayerKinds(layers: number): ("sliding" | "full")[] {
  if (!Number.isInteger(layers) || layers < 1 || layers > preset.num_hidden_layers)
    throw new RangeError(`layers must be an integer from 1 to ${preset.num_hidden_layers}`);
  const kinds = preset.layer_types
    .slice(0, layers)
    .map((t) => (t === "full_attention" ? "full" : "sliding") as "sliding" | "full");
  kinds[layers - 1] = "full";
  return kinds;
}

/**
 * A SentencePiece-style ("llama") vocabulary of n made-up pieces: pad, eos, bos and unk at 0-3
 * (Gemma's ids for pad, eos and bos), the 256 byte pieces, then plain pieces. llama.cpp's
 * "none" tokenizer would be smaller but node-llama-cpp tokenizes a few strings at load, which
 * needs a real tokenizer.
 */
function dummyVocabulary(n: number): [string, GgufValue][] {
  const tokens: string[] = ["<pad>", "<eos>", "<bos>", "<unk>"];
  const types: number[] = [3, 3, 3, 2]; // control, control, control, unknown
  for (let b = 0; b < 256; b++) {
    tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    types.push(6); // byte
  }
  while (tokens.length < n) {
    tokens.push(`\u2581t${tokens.length}`);
    types.push(1); // normal
  }
  return [
    ["tokenizer.ggml.model", str("llama")],
    ["tokenizer.ggml.tokens", { kind: "string[]", value: tokens }],
    ["tokenizer.ggml.scores", { kind: "f32[]", value: tokens.map((_, i) => -i) }],
    ["tokenizer.ggml.token_type", { kind: "i32[]", value: types }],
    ["tokenizer.ggml.padding_token_id", u32(0)],
    ["tokenizer.ggml.eos_token_id", u32(1)],
    ["tokenizer.ggml.bos_token_id", u32(2)],
    ["tokenizer.ggml.unknown_token_id", u32(3)],
  ];
}

/** The metadata and tensor list of the model (nothing is generated until written). */
export function gemma4Gguf(layers: number): {
  metadata: [string, GgufValue][];
  tensors: GgufTensor[];
} {
  const kinds = gemma4LayerKinds(layers);
  const H = preset.hidden_size;
  const ff = preset.intermediate_size;
  const moeFf = preset.moe_intermediate_size;
  const experts = preset.num_experts;
  const heads = preset.num_attention_heads;
  const slidingDim = preset.head_dim;
  const fullDim = preset.global_head_dim;
  const full = preset.rope_parameters.full_attention;
  const a = "gemma4";
  const metadata: [string, GgufValue][] = [
    ["general.architecture", str(a)],
    ["general.name", str(`redwing synthetic gemma-4-26b-a4b (${layers} layers)`)],
    ["general.file_type", u32(2)], // mostly Q4_0
    [`${a}.vocab_size`, u32(preset.vocab_size)],
    [`${a}.context_length`, u32(preset.max_position_embeddings)],
    [`${a}.embedding_length`, u32(H)],
    [`${a}.block_count`, u32(layers)],
    [`${a}.feed_forward_length`, u32(ff)],
    [`${a}.attention.head_count`, u32(heads)],
    [
      `${a}.attention.head_count_kv`,
      {
        kind: "u32[]",
        value: kinds.map((k) =>
          k === "full" ? preset.num_global_key_value_heads : preset.num_key_value_heads,
        ),
      },
    ],
    [`${a}.attention.key_length`, u32(fullDim)],
    [`${a}.attention.value_length`, u32(fullDim)],
    [`${a}.attention.key_length_swa`, u32(slidingDim)],
    [`${a}.attention.value_length_swa`, u32(slidingDim)],
    [`${a}.attention.layer_norm_rms_epsilon`, f32(preset.rms_norm_eps)],
    [`${a}.attention.sliding_window`, u32(preset.sliding_window)],
    [
      `${a}.attention.sliding_window_pattern`,
      { kind: "bool[]", value: kinds.map((k) => k === "sliding") },
    ],
    [`${a}.attention.shared_kv_layers`, u32(0)],
    [`${a}.embedding_length_per_layer_input`, u32(0)],
    [`${a}.rope.freq_base`, f32(full.rope_theta)],
    [`${a}.rope.freq_base_swa`, f32(preset.rope_parameters.sliding_attention.rope_theta)],
    [`${a}.rope.dimension_count`, u32(fullDim)],
    [`${a}.rope.dimension_count_swa`, u32(slidingDim)],
    [`${a}.final_logit_softcapping`, f32(preset.final_logit_softcapping)],
    [`${a}.expert_count`, u32(experts)],
    [`${a}.expert_used_count`, u32(preset.top_k_experts)],
    [`${a}.expert_feed_forward_length`, u32(moeFf)],
    ...dummyVocabulary(preset.vocab_size),
    ["general.quantization_version", u32(2)],
  ];

  // Weight scales: Q4_0 codes are uniform on -8..7 (sd 4.6 d); d = 0.5 / (4.6 sqrt(cols)) keeps
  // each product's output near half the input's scale, as the synthetic Redwing model does.
  const q4 = (cols: number) => randomBlocks(GgmlType.Q4_0, 0.5 / (4.6 * Math.sqrt(cols)));
  const q8 = (cols: number) => randomBlocks(GgmlType.Q8_0, 0.5 / (74 * Math.sqrt(cols)));
  const ones = constantF32(1);
  const vec = (name: string, n: number): GgufTensor => ({
    name,
    dims: [n],
    type: GgmlType.F32,
    fill: ones,
  });
  const mat = (name: string, cols: number, rows: number, type: GgmlType = GgmlType.Q4_0) => ({
    name,
    dims: [cols, rows],
    type,
    fill: type === GgmlType.Q8_0 ? q8(cols) : q4(cols),
  });

  // Proportional RoPE of full layers: the first partial_rotary_factor of the pairs rotate, the
  // rest get a frequency factor so large that they do not.
  const pairs = fullDim / 2;
  const rotated = Math.round(pairs * full.partial_rotary_factor);
  const ropeFreqs = Array.from({ length: pairs }, (_, i) => (i < rotated ? 1 : 1e30));

  const tensors: GgufTensor[] = [
    mat("token_embd.weight", H, preset.vocab_size),
    vec("output_norm.weight", H),
    { name: "rope_freqs.weight", dims: [pairs], type: GgmlType.F32, fill: valuesF32(ropeFreqs) },
  ];
  kinds.forEach((kind, i) => {
    const p = `blk.${i}.`;
    const d = kind === "full" ? fullDim : slidingDim;
    const kv = kind === "full" ? preset.num_global_key_value_heads : preset.num_key_value_heads;
    tensors.push(
      vec(`${p}attn_norm.weight`, H),
      mat(`${p}attn_q.weight`, H, heads * d),
      mat(`${p}attn_k.weight`, H, kv * d),
      ...(kind === "full" && preset.attention_k_eq_v ? [] : [mat(`${p}attn_v.weight`, H, kv * d)]),
      mat(`${p}attn_output.weight`, heads * d, H),
      vec(`${p}attn_q_norm.weight`, d),
      vec(`${p}attn_k_norm.weight`, d),
      vec(`${p}post_attention_norm.weight`, H),
      { name: `${p}layer_output_scale.weight`, dims: [1], type: GgmlType.F32, fill: ones },
      vec(`${p}ffn_norm.weight`, H),
      mat(`${p}ffn_gate.weight`, H, ff),
      mat(`${p}ffn_up.weight`, H, ff),
      mat(`${p}ffn_down.weight`, ff, H),
      vec(`${p}post_ffw_norm.weight`, H),
      mat(`${p}ffn_gate_inp.weight`, H, experts, GgmlType.Q8_0),
      vec(`${p}ffn_gate_inp.scale`, H),
      vec(`${p}pre_ffw_norm_2.weight`, H),
      vec(`${p}post_ffw_norm_1.weight`, H),
      vec(`${p}post_ffw_norm_2.weight`, H),
      {
        name: `${p}ffn_gate_up_exps.weight`,
        dims: [H, 2 * moeFf, experts],
        type: GgmlType.Q4_0,
        fill: q4(H),
      },
      {
        name: `${p}ffn_down_exps.weight`,
        dims: [moeFf, H, experts],
        type: GgmlType.Q4_0,
        fill: q4(moeFf),
      },
      vec(`${p}ffn_down_exps.scale`, experts),
    );
  });
  return { metadata, tensors };
}

/** Writes the model; returns its size in bytes. */
export async function writeGemma4Gguf(path: string, layers: number): Promise<number> {
  const { metadata, tensors } = gemma4Gguf(layers);
  return writeGguf(path, metadata, tensors);
}

/**
 * The GGUF of `layers` layers in `dir`, written once (through a `.partial` file, so an interrupted
 * write is never taken for a model) and reused by later runs; `who` names the bench in the log.
 */
export async function cachedGemma4Gguf(dir: string, layers: number, who: string): Promise<string> {
  await mkdir(dir, { recursive: true });
  const gguf = join(dir, `gemma-4-26b-a4b-${layers}l-q4_0.gguf`);
  if (!existsSync(gguf)) {
    console.error(`${who}: writing the GGUF ${gguf}`);
    await writeGemma4Gguf(`${gguf}.partial`, layers);
    await rename(`${gguf}.partial`, gguf);
  }
  return gguf;
}
