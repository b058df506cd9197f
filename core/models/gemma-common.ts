/**
 * What Gemma 3 and Gemma 4 share (the TypeScript side of native/src/models/gemma_common): the
 * normalization steps every Gemma config goes through (token ids with generation_config.json's
 * eos winning, the features Redwing refuses, the layer-type pattern, RoPE entries) and the
 * decoder's tensor list. Each family module (gemma4.ts, gemma3.ts) supplies its defaults, its
 * layers and what only it has.
 */
import { bf16FromNumber, bf16ToNumber } from "../format/dtype.ts";
import type { Architecture, LayerArch, Rope, TensorSpec } from "../format/manifest.ts";
import {
  type ConfigJson,
  idList,
  int,
  invalid,
  isObject,
  num,
  optNum,
  unsupported,
} from "./config-fields.ts";
import type { CheckpointNaming, ConfigInput, FamilyId } from "./family.ts";

const ACTIVATIONS = new Set(["gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu_fast"]);

/** The defaults transformers' Gemma3TextConfig and Gemma4TextConfig share. */
export const GEMMA_TEXT_DEFAULTS: Readonly<ConfigJson> = {
  hidden_size: 2304,
  intermediate_size: 9216,
  num_attention_heads: 8,
  num_key_value_heads: 4,
  head_dim: 256,
  hidden_activation: "gelu_pytorch_tanh",
  max_position_embeddings: 131072,
  rms_norm_eps: 1e-6,
  pad_token_id: 0,
  eos_token_id: 1,
  bos_token_id: 2,
  tie_word_embeddings: true,
  attention_bias: false,
  layer_types: null,
  final_logit_softcapping: null,
};

export type LayerType = "sliding_attention" | "full_attention";

/** A family's part of normalization: what differs between Gemma 3 and Gemma 4. */
export interface GemmaVariant {
  id: FamilyId;
  /** transformers' Gemma3TextConfig / Gemma4TextConfig defaults (saved configs omit them). */
  defaults: Readonly<ConfigJson>;
  /** transformers forces the last layer to full attention (Gemma 4). */
  lastLayerFull: boolean;
  /** Layers, MoE and the fields that differ, from the merged config. */
  body(
    cfg: ConfigJson,
    layerTypes: LayerType[],
    heads: number,
  ): Pick<Architecture, "layers" | "moe" | "attention_scale" | "norm_weight_offset" | "v_norm">;
}

/**
 * The architecture of a Gemma config. transformers saves only the fields that differ from the
 * class defaults (Gemma 3's `text_config` is nearly empty), so `variant.defaults` fill the rest.
 */
export function normalizeGemmaConfig(variant: GemmaVariant, input: ConfigInput): Architecture {
  const { top: config, text: nested, generation: gen } = input;
  const raw = nested ?? config;
  const cfg: ConfigJson = { ...variant.defaults };
  for (const [k, v] of Object.entries(raw)) if (v !== undefined) cfg[k] = v;

  const eos =
    idList(gen.eos_token_id, "generation_config.json eos_token_id") ??
    idList(nested ? (config.eos_token_id ?? raw.eos_token_id) : raw.eos_token_id, "eos_token_id") ??
    idList(cfg.eos_token_id, "eos_token_id");
  if (!eos || eos.length === 0) throw invalid("no eos_token_id");
  const tokenId = (key: string): number | null => {
    const v = raw[key] ?? (nested ? config[key] : undefined) ?? gen[key] ?? cfg[key];
    if (v === null || v === undefined) return null;
    if (!Number.isSafeInteger(v) || (v as number) < 0) throw invalid(`${key} must be a token id`);
    return v as number;
  };

  const activation = cfg.hidden_activation ?? cfg.hidden_act;
  if (typeof activation !== "string" || !ACTIVATIONS.has(activation)) {
    throw unsupported(`the activation ${JSON.stringify(activation)} (only the tanh GELU)`);
  }
  if (cfg.tie_word_embeddings === false)
    throw unsupported("untied output embeddings (tie_word_embeddings: false)");
  if (cfg.attention_bias === true) throw unsupported("attention biases (attention_bias: true)");
  const attnSoftcap = optNum(cfg, "attn_logit_softcapping");
  if (attnSoftcap !== null)
    throw unsupported(`attention logit softcapping (attn_logit_softcapping: ${attnSoftcap})`);
  if (cfg.use_bidirectional_attention === "all" || cfg.use_bidirectional_attention === true) {
    throw unsupported("bidirectional attention (use_bidirectional_attention)");
  }

  const hidden = int(cfg, "hidden_size");
  const numLayers = int(cfg, "num_hidden_layers");
  const heads = int(cfg, "num_attention_heads");
  const layerTypes = resolveLayerTypes(cfg, numLayers, variant.lastLayerFull);
  const body = variant.body(cfg, layerTypes, heads);
  // transformers: sqrt(hidden_size) as a Python float, cast to the embedding dtype (bf16).
  const embedScale = bf16ToNumber(bf16FromNumber(Math.sqrt(hidden)));

  return {
    family: variant.id,
    vocab_size: int(cfg, "vocab_size"),
    hidden_size: hidden,
    num_layers: numLayers,
    num_attention_heads: heads,
    intermediate_size: int(cfg, "intermediate_size"),
    rms_norm_eps: num(cfg, "rms_norm_eps"),
    norm_weight_offset: body.norm_weight_offset,
    embed_scale: embedScale,
    attention_scale: body.attention_scale,
    final_logit_softcap: optNum(cfg, "final_logit_softcapping"),
    activation: "gelu_tanh",
    tie_word_embeddings: true,
    v_norm: body.v_norm,
    moe: body.moe,
    bos_token_id: tokenId("bos_token_id"),
    eos_token_ids: eos,
    pad_token_id: tokenId("pad_token_id"),
    max_position_embeddings: int(cfg, "max_position_embeddings"),
    layers: body.layers,
  };
}

function resolveLayerTypes(cfg: ConfigJson, n: number, lastLayerFull: boolean): LayerType[] {
  let types: LayerType[];
  if (Array.isArray(cfg.layer_types)) {
    if (cfg.layer_types.length !== n) {
      throw invalid(`layer_types has ${cfg.layer_types.length} entries for ${n} layers`);
    }
    types = cfg.layer_types.map((t, i) => {
      if (t !== "sliding_attention" && t !== "full_attention") {
        throw unsupported(`the layer type ${JSON.stringify(t)} (layer ${i})`);
      }
      return t;
    });
  } else {
    // transformers: a layer is full every `sliding_window_pattern`-th layer (default 6).
    const pattern = cfg.sliding_window_pattern ?? 6;
    if (!Number.isSafeInteger(pattern) || (pattern as number) < 1) {
      throw invalid(
        `sliding_window_pattern must be a positive integer, got ${JSON.stringify(pattern)}`,
      );
    }
    types = Array.from({ length: n }, (_, i) =>
      (i + 1) % (pattern as number) !== 0 ? "sliding_attention" : "full_attention",
    );
  }
  if (lastLayerFull && n > 0) types[n - 1] = "full_attention";
  return types;
}

/** One layer type's RoPE as a config describes it, before it is checked against the head. */
export interface RopeSpec {
  type: string;
  theta: number;
  factor: number;
  partial: number;
}

/**
 * RoPE per layer type from transformers-5 `rope_parameters`, or null when the config has none.
 * `rope_parameters` is keyed by layer type (a missing entry takes `defaults`, entries without
 * `rope_theta` take the default's theta); a single dict applies to both types, or, where
 * `singleDictIsGlobal` (Gemma 3), to full layers only.
 */
export function ropeParameters(
  cfg: ConfigJson,
  defaults: Record<LayerType, RopeSpec>,
  singleDictIsGlobal: boolean,
): Record<LayerType, RopeSpec> | null {
  const rp = cfg.rope_parameters;
  if (!isObject(rp)) return null;
  const perType = "sliding_attention" in rp || "full_attention" in rp;
  if (!perType && singleDictIsGlobal) {
    return {
      full_attention: parseRopeEntry(rp, defaults.full_attention.theta, "rope_parameters"),
      sliding_attention: defaults.sliding_attention,
    };
  }
  const read = (type: LayerType): RopeSpec => {
    const entry = perType ? rp[type] : rp;
    if (entry === undefined || entry === null) return defaults[type];
    if (!isObject(entry)) throw invalid(`rope_parameters.${type} must be an object`);
    return parseRopeEntry(entry, defaults[type].theta, `rope_parameters.${type}`);
  };
  return { sliding_attention: read("sliding_attention"), full_attention: read("full_attention") };
}

export function parseRopeEntry(entry: ConfigJson, fallbackTheta: number, where: string): RopeSpec {
  const type = entry.rope_type ?? entry.type ?? "default";
  if (typeof type !== "string") throw invalid(`${where}.rope_type must be a string`);
  const theta = optNum(entry, "rope_theta") ?? fallbackTheta;
  const factor = optNum(entry, "factor") ?? 1;
  const partial = optNum(entry, "partial_rotary_factor") ?? 1;
  if (!(theta > 0)) throw invalid(`${where}.rope_theta must be positive`);
  if (!(factor > 0)) throw invalid(`${where}.factor must be positive`);
  if (!(partial > 0 && partial <= 1))
    throw invalid(`${where}.partial_rotary_factor must be in (0, 1]`);
  return { type, theta, factor, partial };
}

/** The engine's RoPE for a layer of `headDim`; throws on what the engine cannot represent. */
export function ropeFor(spec: RopeSpec, headDim: number, where: string): Rope {
  switch (spec.type) {
    case "default":
    case "linear": {
      // transformers rotates int(head_dim * partial_rotary_factor) dimensions split in half
      // among themselves; the engine's half-split pairs j with j + head_dim/2, so only the
      // full rotation is representable.
      if (spec.partial !== 1)
        throw unsupported(`partial rotary embeddings with rope_type ${spec.type} (${where})`);
      if (spec.type === "default" && spec.factor !== 1) {
        throw unsupported(`a RoPE factor without a scaling type (${where})`);
      }
      return {
        theta: spec.theta,
        rotary_pairs: headDim / 2,
        freq_dim: headDim,
        scale: spec.factor,
      };
    }
    case "proportional":
      // transformers _compute_proportional_rope_parameters: int(p * head_dim // 2) rotated
      // pairs with exponent 2j / head_dim; the rest do not rotate; inv_freq /= factor.
      return {
        theta: spec.theta,
        rotary_pairs: Math.floor((spec.partial * headDim) / 2),
        freq_dim: headDim,
        scale: spec.factor,
      };
    default:
      throw unsupported(`rope_type ${JSON.stringify(spec.type)} (${where})`);
  }
}

/** A layer's attention fields that every Gemma layer has. */
export function gemmaLayer(
  type: LayerType,
  window: number,
  headDim: number,
  kvHeads: number,
  rope: Rope,
): Pick<LayerArch, "attention" | "sliding_window" | "head_dim" | "num_kv_heads" | "rope"> {
  const full = type === "full_attention";
  return {
    attention: full ? "full" : "sliding",
    sliding_window: full ? null : window,
    head_dim: headDim,
    num_kv_heads: kvHeads,
    rope,
  };
}

/**
 * The resident tensors of a Gemma decoder (docs/format.md "Names"), in the order the importer
 * writes them; `layerExtras` adds a family's own tensors at the end of each layer.
 */
export function gemmaTensors(
  arch: Architecture,
  layerExtras: (prefix: string) => TensorSpec[] = () => [],
): TensorSpec[] {
  const h = arch.hidden_size;
  const out: TensorSpec[] = [];
  const plain = (name: string, shape: number[]): void => {
    out.push({ name, kind: "plain", shape });
  };
  const quant = (name: string, rows: number, cols: number): void => {
    out.push({ name, kind: "quantized", shape: [rows, cols] });
  };
  quant("embed_tokens", arch.vocab_size, h);
  arch.layers.forEach((layer, i) => {
    const p = `layers.${i}.`;
    for (const n of [
      "input_layernorm",
      "post_attention_layernorm",
      "pre_feedforward_layernorm",
      "post_feedforward_layernorm",
    ]) {
      plain(p + n, [h]);
    }
    if (layer.moe) {
      for (const n of [
        "pre_feedforward_layernorm_2",
        "post_feedforward_layernorm_1",
        "post_feedforward_layernorm_2",
      ]) {
        plain(p + n, [h]);
      }
    }
    const q = arch.num_attention_heads * layer.head_dim;
    const kv = layer.num_kv_heads * layer.head_dim;
    quant(p + "self_attn.q_proj", q, h);
    quant(p + "self_attn.k_proj", kv, h);
    if (!layer.k_eq_v) quant(p + "self_attn.v_proj", kv, h);
    quant(p + "self_attn.o_proj", h, q);
    plain(p + "self_attn.q_norm", [layer.head_dim]);
    plain(p + "self_attn.k_norm", [layer.head_dim]);
    quant(p + "mlp.gate_proj", arch.intermediate_size, h);
    quant(p + "mlp.up_proj", arch.intermediate_size, h);
    quant(p + "mlp.down_proj", h, arch.intermediate_size);
    if (layer.moe) {
      const e = arch.moe!.num_experts;
      quant(p + "router.proj", e, h);
      plain(p + "router.scale", [h]);
      plain(p + "router.per_expert_scale", [e]);
    }
    out.push(...layerExtras(p));
  });
  plain("norm", [h]);
  return out;
}

/** transformers and MLX name Gemma 3 and Gemma 4 checkpoints alike. */
export const GEMMA_CHECKPOINT: CheckpointNaming = {
  prefixes: ["model.language_model.", "language_model.model.", "model."],
  multimodalRoots: [
    "vision_tower",
    "vision_model",
    "embed_vision",
    "audio_tower",
    "embed_audio",
    "multi_modal_projector",
    "vision_embed",
  ],
  bareSuffixes: ["layer_scalar", "router.scale", "router.per_expert_scale"],
  // mlx-lm / mlx-vlm quant_predicate: the MoE router keeps 8 bits.
  eightBitSuffixes: ["router.proj"],
};
