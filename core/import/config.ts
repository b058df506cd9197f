/**
 * Turns a checkpoint's `config.json` (and `generation_config.json`) into the normalized
 * architecture of docs/format.md. Configs saved by transformers omit fields equal to the class
 * defaults (Gemma 3's `text_config` is nearly empty), so the defaults of transformers'
 * Gemma3TextConfig / Gemma4TextConfig apply to anything missing.
 *
 * Accepted forms:
 * - Gemma 4 (`gemma4` with `text_config`, or flat `gemma4_text`): `layer_types`,
 *   `global_head_dim` + `num_global_key_value_heads` or `per_layer_config`, `rope_parameters`
 *   per layer type (`default`, `proportional` with `partial_rotary_factor`), `attention_k_eq_v`,
 *   `enable_moe_block` with `num_experts` / `top_k_experts` / `moe_intermediate_size`,
 *   `final_logit_softcapping`.
 * - Gemma 3 (`gemma3` with `text_config`, or flat `gemma3_text`): `rope_theta` with
 *   `rope_scaling {rope_type|type: linear, factor}` on full layers, `rope_local_base_freq` on
 *   sliding layers, or transformers-5 `rope_parameters` per layer type; `query_pre_attn_scalar`;
 *   `sliding_window_pattern` or `layer_types`.
 */
import { UserError } from "../errors.ts";
import { bf16FromNumber, bf16ToNumber } from "../format/dtype.ts";
import {
  ArchitectureSchema,
  type Architecture,
  type LayerArch,
  type Rope,
} from "../format/manifest.ts";

type Json = Record<string, unknown>;

const GEMMA4_DEFAULTS: Json = {
  vocab_size: 262144,
  hidden_size: 2304,
  intermediate_size: 9216,
  num_hidden_layers: 30,
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
  rope_parameters: null,
  attention_bias: false,
  sliding_window: 512,
  layer_types: null,
  final_logit_softcapping: null,
  use_bidirectional_attention: null,
  hidden_size_per_layer_input: 256,
  attention_k_eq_v: false,
  num_kv_shared_layers: 0,
  enable_moe_block: false,
  use_double_wide_mlp: false,
  num_experts: null,
  top_k_experts: null,
  moe_intermediate_size: null,
  global_head_dim: 512,
  num_global_key_value_heads: null,
};

const GEMMA3_DEFAULTS: Json = {
  vocab_size: 262208,
  hidden_size: 2304,
  intermediate_size: 9216,
  num_hidden_layers: 26,
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
  rope_theta: 1000000,
  attention_bias: false,
  query_pre_attn_scalar: 256,
  sliding_window: 4096,
  final_logit_softcapping: null,
  attn_logit_softcapping: null,
  rope_scaling: null,
  rope_local_base_freq: 10000,
  sliding_window_pattern: 6,
  layer_types: null,
  use_bidirectional_attention: false,
};

const ACTIVATIONS = new Set(["gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu_fast"]);

export interface NormalizedConfig {
  architecture: Architecture;
  /** `model_type` of the text model, for messages. */
  modelType: string;
}

function unsupported(what: string): UserError {
  return new UserError(
    `this checkpoint uses ${what}, which Redwing does not support`,
    "unsupported_model",
  );
}

function invalid(what: string): UserError {
  return new UserError(`config.json: ${what}`, "config_invalid");
}

function isObject(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function num(cfg: Json, key: string): number {
  const v = cfg[key];
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw invalid(`${key} must be a number, got ${JSON.stringify(v)}`);
  }
  return v;
}

/**
 * Upper bounds of the config numbers that size work or memory (arrays per layer, per expert,
 * per vocabulary entry...): far above any real model, far below what would exhaust the
 * importer. A hostile or damaged config (`num_hidden_layers: 1e9`) gets a clear error naming the
 * field instead of running the process out of memory.
 */
export const CONFIG_LIMITS: Readonly<Record<string, number>> = {
  num_hidden_layers: 1024,
  hidden_size: 65_536,
  num_attention_heads: 1024,
  num_key_value_heads: 1024,
  num_global_key_value_heads: 1024,
  head_dim: 8192,
  global_head_dim: 8192,
  intermediate_size: 1 << 20,
  moe_intermediate_size: 1 << 20,
  num_experts: 4096,
  top_k_experts: 4096,
  vocab_size: 1 << 22,
  max_position_embeddings: 1 << 24,
  sliding_window: 1 << 24,
};

function int(cfg: Json, key: string): number {
  const v = num(cfg, key);
  if (!Number.isSafeInteger(v) || v < 0)
    throw invalid(`${key} must be a non-negative integer, got ${v}`);
  const limit = CONFIG_LIMITS[key];
  if (limit !== undefined && v > limit) {
    throw invalid(
      `${key} is ${v}, more than Redwing accepts (${limit}); the checkpoint's config is damaged or not a real model`,
    );
  }
  return v;
}

function optNum(cfg: Json, key: string): number | null {
  const v = cfg[key];
  if (v === null || v === undefined) return null;
  return CONFIG_LIMITS[key] === undefined ? num(cfg, key) : int(cfg, key);
}

function idList(v: unknown, key: string): number[] | null {
  if (v === null || v === undefined) return null;
  const list = Array.isArray(v) ? v : [v];
  if (!list.every((x) => Number.isSafeInteger(x) && (x as number) >= 0)) {
    throw invalid(`${key} must be a token id or a list of token ids, got ${JSON.stringify(v)}`);
  }
  return [...new Set(list as number[])];
}

/**
 * Normalizes a config. `generationConfig` is `generation_config.json` when the checkpoint has
 * one (its `eos_token_id` wins over the config's).
 */
export function normalizeConfig(config: unknown, generationConfig?: unknown): NormalizedConfig {
  if (!isObject(config)) throw invalid("not a JSON object");
  const topType = config.model_type;
  const nested = isObject(config.text_config) ? config.text_config : null;
  let family: "gemma4" | "gemma3";
  if (topType === "gemma4" || topType === "gemma4_text") family = "gemma4";
  else if (topType === "gemma3" || topType === "gemma3_text") family = "gemma3";
  else {
    const t = typeof topType === "string" ? topType : JSON.stringify(topType);
    throw new UserError(
      `config.json has model_type ${t}; Redwing imports Gemma 4 (gemma4, gemma4_text) and Gemma 3 (gemma3, gemma3_text)`,
      "unsupported_model",
    );
  }
  if (nested && typeof nested.model_type === "string") {
    const inner = nested.model_type;
    if (!inner.startsWith(family)) {
      throw new UserError(
        `config.json: text_config has model_type ${inner} inside a ${String(topType)} config`,
        "unsupported_model",
      );
    }
  }
  // Multimodal wrappers keep the text model in text_config; text-only configs are flat.
  const raw = nested ?? config;
  const cfg: Json = { ...(family === "gemma4" ? GEMMA4_DEFAULTS : GEMMA3_DEFAULTS) };
  for (const [k, v] of Object.entries(raw)) if (v !== undefined) cfg[k] = v;

  const gen = isObject(generationConfig) ? generationConfig : {};
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
  const layerTypes = resolveLayerTypes(cfg, family, numLayers);

  let layers: LayerArch[];
  let moe: Architecture["moe"] = null;
  let attentionScale: number;
  if (family === "gemma4") {
    // Report every unsupported feature at once so one run tells the whole story.
    const features: string[] = [];
    const ple = optNum(cfg, "hidden_size_per_layer_input") ?? 0;
    if (ple > 0) features.push(`per-layer embeddings (hidden_size_per_layer_input: ${ple})`);
    const shared = optNum(cfg, "num_kv_shared_layers") ?? 0;
    if (shared > 0) features.push(`KV sharing across layers (num_kv_shared_layers: ${shared})`);
    // transformers and mlx-lm widen the MLP only on KV-shared layers.
    if (cfg.use_double_wide_mlp === true && shared > 0) {
      features.push("the double-wide MLP (use_double_wide_mlp: true)");
    }
    if (features.length > 0) throw unsupported(features.join(", "));
    if (cfg.enable_moe_block === true) {
      moe = {
        num_experts: int(cfg, "num_experts"),
        top_k: int(cfg, "top_k_experts"),
        intermediate_size: int(cfg, "moe_intermediate_size"),
      };
    }
    layers = gemma4Layers(cfg, layerTypes, heads, moe !== null);
    attentionScale = 1.0;
  } else {
    layers = gemma3Layers(cfg, layerTypes, heads);
    attentionScale = num(cfg, "query_pre_attn_scalar") ** -0.5;
  }
  // transformers: sqrt(hidden_size) as a Python float, cast to the embedding dtype (bf16).
  const embedScale = bf16ToNumber(bf16FromNumber(Math.sqrt(hidden)));

  const arch: Architecture = {
    family,
    vocab_size: int(cfg, "vocab_size"),
    hidden_size: hidden,
    num_layers: numLayers,
    num_attention_heads: heads,
    intermediate_size: int(cfg, "intermediate_size"),
    rms_norm_eps: num(cfg, "rms_norm_eps"),
    norm_weight_offset: family === "gemma3" ? 1 : 0,
    embed_scale: embedScale,
    attention_scale: attentionScale,
    final_logit_softcap: optNum(cfg, "final_logit_softcapping"),
    activation: "gelu_tanh",
    tie_word_embeddings: true,
    v_norm: family === "gemma4",
    moe,
    bos_token_id: tokenId("bos_token_id"),
    eos_token_ids: eos,
    pad_token_id: tokenId("pad_token_id"),
    max_position_embeddings: int(cfg, "max_position_embeddings"),
    layers,
  };
  const parsed = ArchitectureSchema.safeParse(arch);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw invalid(
      `normalized architecture is invalid at ${issue.path.join(".")}: ${issue.message}`,
    );
  }
  return { architecture: parsed.data, modelType: String(raw.model_type ?? topType) };
}

type LayerType = "sliding_attention" | "full_attention";

function resolveLayerTypes(cfg: Json, family: "gemma4" | "gemma3", n: number): LayerType[] {
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
  // transformers forces the last Gemma 4 layer to full attention.
  if (family === "gemma4" && n > 0) types[n - 1] = "full_attention";
  return types;
}

/** Per-layer overrides of Gemma 4 (`per_layer_config`, keys are layer indices). */
function perLayerOverrides(cfg: Json, n: number): (Json | null)[] {
  const plc = cfg.per_layer_config;
  const out: (Json | null)[] = Array.from({ length: n }, () => null);
  if (plc === undefined || plc === null) return out;
  const entries: [string, unknown][] = Array.isArray(plc)
    ? plc.map((v, i) => [String(i), v])
    : isObject(plc)
      ? Object.entries(plc)
      : [];
  if (!Array.isArray(plc) && !isObject(plc)) throw invalid("per_layer_config must be an object");
  for (const [k, v] of entries) {
    const i = Number(k);
    if (!Number.isSafeInteger(i) || i < 0 || i >= n)
      throw invalid(`per_layer_config has an entry for layer ${k} of ${n}`);
    if (v !== null && !isObject(v)) throw invalid(`per_layer_config.${k} must be an object`);
    out[i] = v;
  }
  return out;
}

function gemma4Layers(cfg: Json, types: LayerType[], heads: number, moe: boolean): LayerArch[] {
  const headDim = int(cfg, "head_dim");
  const kvHeads = int(cfg, "num_key_value_heads");
  const kEqV = cfg.attention_k_eq_v === true;
  const window = int(cfg, "sliding_window");
  const hasPerLayer = cfg.per_layer_config !== undefined && cfg.per_layer_config !== null;
  const overrides = perLayerOverrides(cfg, types.length);
  // transformers' Gemma4TextConfig: without per_layer_config, full layers take global_head_dim
  // (default 512) and, only where attention_k_eq_v, num_global_key_value_heads.
  const globalHeadDim = int(cfg, "global_head_dim");
  const globalKv = optNum(cfg, "num_global_key_value_heads");
  const rope = ropeByType(cfg, "gemma4");
  return types.map((type, i) => {
    const full = type === "full_attention";
    let hd = headDim;
    let kv = kvHeads;
    if (!hasPerLayer && full) {
      hd = globalHeadDim;
      if (kEqV && globalKv !== null) kv = globalKv;
    }
    const o = overrides[i];
    if (o) {
      if (o.head_dim !== undefined && o.head_dim !== null) hd = int(o, "head_dim");
      if (o.num_key_value_heads !== undefined && o.num_key_value_heads !== null)
        kv = int(o, "num_key_value_heads");
      if (
        o.num_attention_heads !== undefined &&
        o.num_attention_heads !== null &&
        o.num_attention_heads !== heads
      ) {
        throw unsupported(`a different number of attention heads on layer ${i} (per_layer_config)`);
      }
    }
    return {
      attention: full ? "full" : "sliding",
      sliding_window: full ? null : window,
      head_dim: hd,
      num_kv_heads: kv,
      k_eq_v: kEqV && full,
      moe,
      rope: ropeFor(rope[type], hd, `rope_parameters.${type}`),
    };
  });
}

function gemma3Layers(cfg: Json, types: LayerType[], _heads: number): LayerArch[] {
  const headDim = int(cfg, "head_dim");
  const kvHeads = int(cfg, "num_key_value_heads");
  const window = int(cfg, "sliding_window");
  const rope = ropeByType(cfg, "gemma3");
  return types.map((type) => {
    const full = type === "full_attention";
    return {
      attention: full ? "full" : "sliding",
      sliding_window: full ? null : window,
      head_dim: headDim,
      num_kv_heads: kvHeads,
      k_eq_v: false,
      moe: false,
      rope: ropeFor(rope[type], headDim, full ? "global RoPE" : "local RoPE"),
    };
  });
}

interface RopeSpec {
  type: string;
  theta: number;
  factor: number;
  partial: number;
}

/**
 * RoPE parameters per layer type. transformers-5 `rope_parameters` is keyed by layer type
 * (entries may lack `rope_theta`, which then comes from `rope_theta` / `rope_local_base_freq`);
 * older Gemma 3 configs use `rope_theta` + `rope_scaling` for full layers and
 * `rope_local_base_freq` for sliding ones.
 */
function ropeByType(cfg: Json, family: "gemma4" | "gemma3"): Record<LayerType, RopeSpec> {
  const fallbackTheta: Record<LayerType, number> =
    family === "gemma4"
      ? { sliding_attention: 10000, full_attention: 1000000 }
      : {
          sliding_attention: optNum(cfg, "rope_local_base_freq") ?? 10000,
          full_attention: optNum(cfg, "rope_theta") ?? 1000000,
        };
  const rp = cfg.rope_parameters;
  if (isObject(rp)) {
    const perType = "sliding_attention" in rp || "full_attention" in rp;
    const read = (type: LayerType): RopeSpec => {
      const entry = perType ? rp[type] : rp;
      if (entry === undefined || entry === null) {
        return {
          type: family === "gemma4" && type === "full_attention" ? "proportional" : "default",
          theta: fallbackTheta[type],
          factor: 1,
          partial: family === "gemma4" && type === "full_attention" ? 0.25 : 1,
        };
      }
      if (!isObject(entry)) throw invalid(`rope_parameters.${type} must be an object`);
      return parseRopeEntry(entry, fallbackTheta[type], `rope_parameters.${type}`);
    };
    if (!perType && family === "gemma3") {
      // A single dict describes the global RoPE; sliding layers use rope_local_base_freq.
      return {
        full_attention: parseRopeEntry(rp, fallbackTheta.full_attention, "rope_parameters"),
        sliding_attention: {
          type: "default",
          theta: fallbackTheta.sliding_attention,
          factor: 1,
          partial: 1,
        },
      };
    }
    return { sliding_attention: read("sliding_attention"), full_attention: read("full_attention") };
  }
  if (family === "gemma4") {
    return {
      sliding_attention: { type: "default", theta: 10000, factor: 1, partial: 1 },
      full_attention: { type: "proportional", theta: 1000000, factor: 1, partial: 0.25 },
    };
  }
  const scaling = cfg.rope_scaling;
  const full: RopeSpec = {
    type: "default",
    theta: fallbackTheta.full_attention,
    factor: 1,
    partial: 1,
  };
  if (isObject(scaling)) {
    const parsed = parseRopeEntry(scaling, fallbackTheta.full_attention, "rope_scaling");
    full.type = parsed.type;
    full.factor = parsed.factor;
  } else if (scaling !== null && scaling !== undefined) {
    throw invalid("rope_scaling must be an object or null");
  }
  return {
    full_attention: full,
    sliding_attention: {
      type: "default",
      theta: fallbackTheta.sliding_attention,
      factor: 1,
      partial: 1,
    },
  };
}

function parseRopeEntry(entry: Json, fallbackTheta: number, where: string): RopeSpec {
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

function ropeFor(spec: RopeSpec, headDim: number, where: string): Rope {
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
