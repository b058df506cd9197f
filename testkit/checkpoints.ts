/**
 * Test helpers: writes tiny Gemma 4 / Gemma 3 checkpoints (float safetensors in the transformers
 * layout, or MLX affine in the mlx-lm/mlx-vlm layout) into a directory. Names and layouts are
 * spelled out here from the published checkpoints, independently of the importer's tables.
 */
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type FloatDType, encodeFromF32 } from "../core/format/dtype.ts";
import { quantizeRows, type QuantParams } from "../core/import/quantize.ts";

export type StDTypeName = "BF16" | "F16" | "F32" | "U32" | "I32" | "U8";

export interface StTensor {
  name: string;
  dtype: StDTypeName;
  shape: number[];
  data: Uint8Array;
}

/** Writes a safetensors file (8-byte header length, JSON header, data in the given order). */
export async function writeSafetensors(
  path: string,
  tensors: StTensor[],
  metadata: Record<string, string> = { format: "pt" },
): Promise<void> {
  const header: Record<string, unknown> = { __metadata__: metadata };
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = {
      dtype: t.dtype,
      shape: t.shape,
      data_offsets: [offset, offset + t.data.byteLength],
    };
    offset += t.data.byteLength;
  }
  let json = JSON.stringify(header);
  // Pad the header with spaces to a multiple of 8 like the reference writer.
  json += " ".repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  await writeFile(
    path,
    Buffer.concat([head, Buffer.from(json, "utf8"), ...tensors.map((t) => Buffer.from(t.data))]),
  );
}

/** Deterministic pseudo-random numbers (mulberry32) so failures are reproducible. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Normal-ish values with standard deviation `std` around `mean`. */
export function randomValues(n: number, random: () => number, std = 0.05, mean = 0): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const u = Math.max(random(), 1e-12);
    out[i] = mean + std * Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
  }
  return out;
}

export interface TinySpec {
  family: "gemma4" | "gemma3";
  vocab: number;
  hidden: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  intermediate: number;
  /** Layer types, "S" (sliding) or "F" (full). */
  types: ("S" | "F")[];
  slidingWindow: number;
  /** Gemma 4 only. */
  globalHeadDim?: number;
  globalKvHeads?: number;
  kEqV?: boolean;
  moe?: { experts: number; topK: number; intermediate: number } | null;
}

export const TINY_GEMMA4_MOE: TinySpec = {
  family: "gemma4",
  vocab: 256,
  hidden: 128,
  layers: 3,
  heads: 2,
  kvHeads: 2,
  headDim: 64,
  intermediate: 192,
  types: ["S", "S", "F"],
  slidingWindow: 16,
  globalHeadDim: 128,
  globalKvHeads: 1,
  kEqV: true,
  moe: { experts: 4, topK: 2, intermediate: 64 },
};

export const TINY_GEMMA4_DENSE: TinySpec = {
  ...TINY_GEMMA4_MOE,
  kEqV: false,
  globalKvHeads: 1,
  moe: null,
};

export const TINY_GEMMA3: TinySpec = {
  family: "gemma3",
  vocab: 320,
  hidden: 128,
  layers: 4,
  heads: 2,
  kvHeads: 1,
  headDim: 64,
  intermediate: 192,
  types: ["S", "F", "S", "F"],
  slidingWindow: 16,
};

export type ConfigForm =
  /** Gemma 4: nested text_config with global_head_dim; Gemma 3: nested with rope_scaling. */
  | "nested"
  /** Gemma 4: flat gemma4_text with per_layer_config; Gemma 3: flat gemma3_text with rope_parameters. */
  | "flat";

const LT = { S: "sliding_attention", F: "full_attention" } as const;

/** config.json for a tiny spec in one of the forms the importer accepts. */
export function tinyConfig(spec: TinySpec, form: ConfigForm): Record<string, unknown> {
  const layerTypes = spec.types.map((t) => LT[t]);
  if (spec.family === "gemma4") {
    const text: Record<string, unknown> = {
      model_type: "gemma4_text",
      vocab_size: spec.vocab,
      hidden_size: spec.hidden,
      intermediate_size: spec.intermediate,
      num_hidden_layers: spec.layers,
      num_attention_heads: spec.heads,
      num_key_value_heads: spec.kvHeads,
      head_dim: spec.headDim,
      hidden_activation: "gelu_pytorch_tanh",
      max_position_embeddings: 4096,
      rms_norm_eps: 1e-6,
      sliding_window: spec.slidingWindow,
      layer_types: layerTypes,
      final_logit_softcapping: 30.0,
      hidden_size_per_layer_input: 0,
      num_kv_shared_layers: 0,
      use_double_wide_mlp: false,
      attention_k_eq_v: spec.kEqV ?? false,
      enable_moe_block: !!spec.moe,
      num_experts: spec.moe?.experts ?? null,
      top_k_experts: spec.moe?.topK ?? null,
      moe_intermediate_size: spec.moe?.intermediate ?? null,
      rope_parameters: {
        sliding_attention: { rope_type: "default", rope_theta: 10000.0 },
        full_attention: {
          rope_type: "proportional",
          rope_theta: 1000000.0,
          partial_rotary_factor: 0.25,
        },
      },
      pad_token_id: 0,
      bos_token_id: 2,
      eos_token_id: 1,
      tie_word_embeddings: true,
    };
    if (form === "nested") {
      text.global_head_dim = spec.globalHeadDim;
      text.num_global_key_value_heads = spec.globalKvHeads;
      return {
        architectures: ["Gemma4ForConditionalGeneration"],
        model_type: "gemma4",
        text_config: text,
        vision_config: { model_type: "gemma4_vision", hidden_size: 32 },
        eos_token_id: [1, 106],
        tie_word_embeddings: true,
      };
    }
    const per: Record<string, unknown> = {};
    spec.types.forEach((t, i) => {
      if (t === "F") {
        per[String(i)] = {
          head_dim: spec.globalHeadDim,
          num_key_value_heads: spec.kEqV ? spec.globalKvHeads : spec.kvHeads,
        };
      }
    });
    return {
      ...text,
      architectures: ["Gemma4ForCausalLM"],
      per_layer_config: per,
      eos_token_id: [1, 106],
    };
  }
  const text: Record<string, unknown> = {
    model_type: "gemma3_text",
    vocab_size: spec.vocab,
    hidden_size: spec.hidden,
    intermediate_size: spec.intermediate,
    num_hidden_layers: spec.layers,
    num_attention_heads: spec.heads,
    num_key_value_heads: spec.kvHeads,
    head_dim: spec.headDim,
    sliding_window: spec.slidingWindow,
    query_pre_attn_scalar: spec.headDim,
  };
  if (form === "nested") {
    // Like google/gemma-3-4b-it: sparse text_config, rope_scaling, sliding_window_pattern.
    const pattern = spec.types.indexOf("F") + 1;
    return {
      architectures: ["Gemma3ForConditionalGeneration"],
      model_type: "gemma3",
      text_config: {
        ...text,
        rope_scaling: { rope_type: "linear", factor: 8.0 },
        sliding_window_pattern: pattern,
      },
      vision_config: { model_type: "siglip_vision_model" },
      eos_token_id: [1, 106],
    };
  }
  return {
    ...text,
    architectures: ["Gemma3ForCausalLM"],
    layer_types: layerTypes,
    rope_theta: 1000000.0,
    rope_local_base_freq: 10000.0,
    rope_parameters: {
      full_attention: { rope_type: "linear", factor: 8.0 },
      sliding_attention: { rope_type: "default" },
    },
    eos_token_id: [1, 106],
  };
}

interface FloatTensor {
  name: string;
  shape: number[];
  values: Float32Array;
  /** Quantized in an MLX checkpoint (with these parameters). */
  quant?: QuantParams;
  /** Bare parameter (no `.weight` suffix). */
  bare?: boolean;
}

/**
 * The language-model tensors of a spec, in transformers naming without the model prefix
 * (`embed_tokens.weight`, `layers.0.experts.gate_up_proj`, ...), with random values.
 */
export function tinyTensors(spec: TinySpec, seed = 1): FloatTensor[] {
  const random = rng(seed);
  const out: FloatTensor[] = [];
  const q4: QuantParams = { bits: 4, groupSize: 64 };
  const mat = (name: string, rows: number, cols: number, quant: QuantParams = q4): void => {
    out.push({ name, shape: [rows, cols], values: randomValues(rows * cols, random), quant });
  };
  const vec = (name: string, n: number, mean: number, bare = false): void => {
    out.push({ name, shape: [n], values: randomValues(n, random, 0.1, mean), bare });
  };
  const normMean = spec.family === "gemma3" ? 0 : 1; // Gemma 3 stores w for (1 + w)
  mat("embed_tokens", spec.vocab, spec.hidden);
  for (let i = 0; i < spec.layers; i++) {
    const p = `layers.${i}.`;
    const full = spec.types[i] === "F";
    const hd = spec.family === "gemma4" && full ? spec.globalHeadDim! : spec.headDim;
    const kv = spec.family === "gemma4" && full && spec.kEqV ? spec.globalKvHeads! : spec.kvHeads;
    for (const n of [
      "input_layernorm",
      "post_attention_layernorm",
      "pre_feedforward_layernorm",
      "post_feedforward_layernorm",
    ]) {
      vec(p + n, spec.hidden, normMean);
    }
    mat(p + "self_attn.q_proj", spec.heads * hd, spec.hidden);
    mat(p + "self_attn.k_proj", kv * hd, spec.hidden);
    if (!(spec.kEqV && full)) mat(p + "self_attn.v_proj", kv * hd, spec.hidden);
    mat(p + "self_attn.o_proj", spec.hidden, spec.heads * hd);
    vec(p + "self_attn.q_norm", hd, normMean);
    vec(p + "self_attn.k_norm", hd, normMean);
    mat(p + "mlp.gate_proj", spec.intermediate, spec.hidden);
    mat(p + "mlp.up_proj", spec.intermediate, spec.hidden);
    mat(p + "mlp.down_proj", spec.hidden, spec.intermediate);
    if (spec.moe) {
      const { experts: e, intermediate: mi } = spec.moe;
      for (const n of [
        "pre_feedforward_layernorm_2",
        "post_feedforward_layernorm_1",
        "post_feedforward_layernorm_2",
      ]) {
        vec(p + n, spec.hidden, 1);
      }
      mat(p + "router.proj", e, spec.hidden, { bits: 8, groupSize: 64 });
      vec(p + "router.scale", spec.hidden, 1, true);
      vec(p + "router.per_expert_scale", e, 1, true);
      out.push({
        name: p + "experts.gate_up_proj",
        shape: [e, 2 * mi, spec.hidden],
        values: randomValues(e * 2 * mi * spec.hidden, random),
        bare: true,
      });
      out.push({
        name: p + "experts.down_proj",
        shape: [e, spec.hidden, mi],
        values: randomValues(e * spec.hidden * mi, random),
        bare: true,
      });
    }
    if (spec.family === "gemma4") vec(p + "layer_scalar", 1, 0.5, true);
  }
  vec("norm", spec.hidden, normMean);
  return out;
}

const ST_OF: Record<FloatDType, StDTypeName> = { bf16: "BF16", f16: "F16", f32: "F32" };

export interface CheckpointOptions {
  form: ConfigForm;
  /** "float" writes transformers layout; "mlx" writes the MLX affine layout (4-bit, router 8-bit). */
  kind: "float" | "mlx";
  dtype?: FloatDType;
  /** Language-model prefix; defaults: float nested "model.language_model.", mlx "language_model.model.", flat "model.". */
  prefix?: string;
  /** Split tensors over this many shards with model.safetensors.index.json. */
  shards?: number;
  seed?: number;
  /** Add vision tower tensors (dropped by the importer). */
  vision?: boolean;
  /** Edit the tensor list before writing (to make broken checkpoints). */
  edit?: (tensors: StTensor[]) => StTensor[];
  /** Edit config.json before writing. */
  editConfig?: (config: Record<string, unknown>) => void;
  /** Write tokenizer files and a generation config. */
  tokenizer?: boolean;
}

/** Writes a tiny checkpoint for `spec` into `dir` and returns the config written. */
export async function writeTinyCheckpoint(
  dir: string,
  spec: TinySpec,
  options: CheckpointOptions,
): Promise<Record<string, unknown>> {
  await mkdir(dir, { recursive: true });
  const dtype = options.dtype ?? "bf16";
  const prefix =
    options.prefix ??
    (options.form === "flat"
      ? "model."
      : options.kind === "mlx"
        ? "language_model.model."
        : "model.language_model.");
  const config = tinyConfig(spec, options.form);
  let tensors: StTensor[] = [];
  const enc = (v: Float32Array): Buffer => encodeFromF32(v, dtype);
  const quantOverrides: Record<string, unknown> = {};
  for (const t of tinyTensors(spec, options.seed ?? 1)) {
    const full = t.bare ? prefix + t.name : `${prefix}${t.name}.weight`;
    if (options.kind === "float" || (!t.quant && !t.name.includes("experts."))) {
      tensors.push({ name: full, dtype: ST_OF[dtype], shape: t.shape, data: enc(t.values) });
      continue;
    }
    if (t.quant) {
      const [rows, cols] = t.shape as [number, number];
      const q = quantizeRows(enc(t.values), dtype, rows, cols, t.quant);
      const base = `${prefix}${t.name}`;
      tensors.push({
        name: `${base}.weight`,
        dtype: "U32",
        shape: [rows, (cols * t.quant.bits) / 32],
        data: q.weight,
      });
      tensors.push({
        name: `${base}.scales`,
        dtype: ST_OF[dtype],
        shape: [rows, cols / t.quant.groupSize],
        data: q.scales,
      });
      tensors.push({
        name: `${base}.biases`,
        dtype: ST_OF[dtype],
        shape: [rows, cols / t.quant.groupSize],
        data: q.biases,
      });
      if (t.quant.bits !== 4)
        quantOverrides[base] = { group_size: t.quant.groupSize, bits: t.quant.bits };
      continue;
    }
    // Experts: mlx-lm sanitize splits gate_up_proj [E, 2I, H] into gate and up [E, I, H] and
    // stacks the quantized experts along the first axis.
    const [e, rows2, cols] = t.shape as [number, number, number];
    const layerPrefix = `${prefix}${t.name.slice(0, t.name.indexOf("experts.") + "experts.".length)}switch_glu.`;
    const parts: [string, number, number][] = t.name.endsWith("gate_up_proj")
      ? [
          ["gate_proj", 0, rows2 / 2],
          ["up_proj", rows2 / 2, rows2 / 2],
        ]
      : [["down_proj", 0, rows2]];
    for (const [part, rowStart, rows] of parts) {
      const w: Uint8Array[] = [];
      const s: Uint8Array[] = [];
      const b: Uint8Array[] = [];
      for (let x = 0; x < e; x++) {
        const from = (x * rows2 + rowStart) * cols;
        const q = quantizeRows(
          enc(t.values.subarray(from, from + rows * cols)),
          dtype,
          rows,
          cols,
          { bits: 4, groupSize: 64 },
        );
        w.push(q.weight);
        s.push(q.scales);
        b.push(q.biases);
      }
      const base = layerPrefix + part;
      tensors.push({
        name: `${base}.weight`,
        dtype: "U32",
        shape: [e, rows, cols / 8],
        data: Buffer.concat(w),
      });
      tensors.push({
        name: `${base}.scales`,
        dtype: ST_OF[dtype],
        shape: [e, rows, cols / 64],
        data: Buffer.concat(s),
      });
      tensors.push({
        name: `${base}.biases`,
        dtype: ST_OF[dtype],
        shape: [e, rows, cols / 64],
        data: Buffer.concat(b),
      });
    }
  }
  if (options.vision) {
    const random = rng(99);
    const vp = options.kind === "mlx" ? "" : prefix === "model.language_model." ? "model." : "";
    tensors.push({
      name: `${vp}vision_tower.encoder.layers.0.mlp.fc1.weight`,
      dtype: ST_OF[dtype],
      shape: [32, 16],
      data: enc(randomValues(512, random)),
    });
    tensors.push({
      name: `${vp}embed_vision.embedding_projection.weight`,
      dtype: ST_OF[dtype],
      shape: [spec.hidden, 32],
      data: enc(randomValues(spec.hidden * 32, random)),
    });
  }
  if (options.kind === "mlx") {
    const q = { group_size: 64, bits: 4, mode: "affine", ...quantOverrides };
    config.quantization = q;
    config.quantization_config = q;
  }
  if (options.edit) tensors = options.edit(tensors);
  options.editConfig?.(config);
  await writeFile(join(dir, "config.json"), JSON.stringify(config, null, 2));
  const shards = options.shards ?? 1;
  if (shards <= 1) {
    await writeSafetensors(join(dir, "model.safetensors"), tensors);
  } else {
    const weightMap: Record<string, string> = {};
    const per = Math.ceil(tensors.length / shards);
    for (let s = 0; s < shards; s++) {
      const name = `model-${String(s + 1).padStart(5, "0")}-of-${String(shards).padStart(5, "0")}.safetensors`;
      const part = tensors.slice(s * per, (s + 1) * per);
      for (const t of part) weightMap[t.name] = name;
      await writeSafetensors(join(dir, name), part);
    }
    await writeFile(
      join(dir, "model.safetensors.index.json"),
      JSON.stringify({ metadata: {}, weight_map: weightMap }),
    );
  }
  if (options.tokenizer !== false) {
    await writeFile(
      join(dir, "tokenizer.json"),
      JSON.stringify({ version: "1.0", model: { type: "BPE", vocab: {} } }),
    );
    await writeFile(
      join(dir, "tokenizer_config.json"),
      JSON.stringify({
        bos_token: "<bos>",
        chat_template: "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
      }),
    );
    await writeFile(
      join(dir, "generation_config.json"),
      JSON.stringify({ eos_token_id: [1, 106, 50], bos_token_id: 2 }),
    );
  }
  return config;
}
