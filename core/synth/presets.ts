/**
 * Text configs of real models, as their Hugging Face `config.json` gives them, for synthetic
 * random-weight models with the real shapes (benchmarks, memory tests). The values are those of
 * the published checkpoints (see ../shared/research/gemma-arch.md, section 1).
 */
/** What every Gemma 4 text config here shares: RoPE per layer type, norms, softcap, head. */
const GEMMA4_TEXT_COMMON = {
  rope_parameters: {
    sliding_attention: { rope_type: "default", rope_theta: 10000 },
    full_attention: {
      rope_type: "proportional",
      rope_theta: 1000000,
      partial_rotary_factor: 0.25,
    },
  },
  rms_norm_eps: 1e-6,
  final_logit_softcapping: 30,
  hidden_activation: "gelu_pytorch_tanh",
  tie_word_embeddings: true,
} as const;

export const SYNTH_PRESETS = {
  "gemma-4-26b-a4b": {
    model_type: "gemma4_text",
    vocab_size: 262144,
    hidden_size: 2816,
    intermediate_size: 2112,
    num_hidden_layers: 30,
    num_attention_heads: 16,
    num_key_value_heads: 8,
    num_global_key_value_heads: 2,
    head_dim: 256,
    global_head_dim: 512,
    attention_k_eq_v: true,
    sliding_window: 1024,
    layer_types: Array.from({ length: 30 }, (_, i) =>
      i % 6 === 5 ? "full_attention" : "sliding_attention",
    ),
    ...GEMMA4_TEXT_COMMON,
    max_position_embeddings: 262144,
    hidden_size_per_layer_input: 0,
    num_kv_shared_layers: 0,
    enable_moe_block: true,
    num_experts: 128,
    top_k_experts: 8,
    moe_intermediate_size: 704,
    pad_token_id: 0,
    bos_token_id: 2,
    eos_token_id: [1, 106, 50],
  },
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
