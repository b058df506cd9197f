/**
 * Text configs for synthetic random-weight models (benchmarks, memory tests): real models' as
 * their Hugging Face `config.json` gives them (kept in their family's module, core/models), and
 * the built-in demo model's.
 */
import { GEMMA4_26B_A4B_TEXT_CONFIG, GEMMA4_TEXT_COMMON } from "../models/gemma4.ts";

export const SYNTH_PRESETS = {
  "gemma-4-26b-a4b": GEMMA4_26B_A4B_TEXT_CONFIG,
  /**
   * The built-in demo model (core/demo): Gemma 4's MoE layout at toy size. The vocabulary is
   * that of the Gemma 3 tokenizer it ships with (262144 pieces plus `<image_soft_token>`), so
   * every token id the tokenizer can produce is valid, and the stop ids are Gemma 3's.
   */
  "demo-gemma4-moe": {
    model_type: "gemma4_text",
    vocab_size: 262145,
    hidden_size: 256,
    intermediate_size: 512,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    num_global_key_value_heads: 1,
    head_dim: 64,
    global_head_dim: 128,
    attention_k_eq_v: true,
    sliding_window: 128,
    layer_types: ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    ...GEMMA4_TEXT_COMMON,
    max_position_embeddings: 32768,
    hidden_size_per_layer_input: 0,
    num_kv_shared_layers: 0,
    enable_moe_block: true,
    num_experts: 8,
    top_k_experts: 2,
    moe_intermediate_size: 128,
    pad_token_id: 0,
    bos_token_id: 2,
    eos_token_id: [1, 106],
  },
} as const;

export type SynthPresetName = keyof typeof SYNTH_PRESETS;

export function isSynthPreset(name: string): name is SynthPresetName {
  return Object.hasOwn(SYNTH_PRESETS, name);
}
