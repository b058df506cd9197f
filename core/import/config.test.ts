import { describe, expect, it } from "vitest";
import { UserError } from "../errors.ts";
import { CONFIG_LIMITS } from "../models/config-fields.ts";
import { normalizeConfig } from "./config.ts";
import {
  TINY_GEMMA3,
  TINY_GEMMA4_DENSE,
  TINY_GEMMA4_MOE,
  tinyConfig,
} from "../../testkit/checkpoints.ts";

const S = "sliding_attention";
const F = "full_attention";

/** google/gemma-4-26B-A4B-it config.json (text part as published; vision omitted). */
function gemma4_26b(): Record<string, unknown> {
  return {
    architectures: ["Gemma4ForConditionalGeneration"],
    model_type: "gemma4",
    eos_token_id: [1, 106],
    text_config: {
      model_type: "gemma4_text",
      attention_k_eq_v: true,
      enable_moe_block: true,
      final_logit_softcapping: 30.0,
      global_head_dim: 512,
      head_dim: 256,
      hidden_activation: "gelu_pytorch_tanh",
      hidden_size: 2816,
      hidden_size_per_layer_input: 0,
      intermediate_size: 2112,
      layer_types: Array.from({ length: 30 }, (_, i) => ((i + 1) % 6 === 0 ? F : S)),
      max_position_embeddings: 262144,
      moe_intermediate_size: 704,
      num_attention_heads: 16,
      num_experts: 128,
      num_global_key_value_heads: 2,
      num_hidden_layers: 30,
      num_key_value_heads: 8,
      num_kv_shared_layers: 0,
      rms_norm_eps: 1e-6,
      rope_parameters: {
        full_attention: {
          partial_rotary_factor: 0.25,
          rope_theta: 1000000.0,
          rope_type: "proportional",
        },
        sliding_attention: { rope_theta: 10000.0, rope_type: "default" },
      },
      sliding_window: 1024,
      top_k_experts: 8,
      use_double_wide_mlp: false,
      vocab_size: 262144,
      pad_token_id: 0,
      bos_token_id: 2,
      eos_token_id: 1,
    },
  };
}

/** google/gemma-3-4b-it config.json: a sparse text_config relying on class defaults. */
function gemma3_4b(): Record<string, unknown> {
  return {
    architectures: ["Gemma3ForConditionalGeneration"],
    model_type: "gemma3",
    eos_token_id: [1, 106],
    boi_token_index: 255999,
    text_config: {
      hidden_size: 2560,
      intermediate_size: 10240,
      model_type: "gemma3_text",
      num_hidden_layers: 34,
      rope_scaling: { factor: 8.0, rope_type: "linear" },
      sliding_window: 1024,
    },
    vision_config: { model_type: "siglip_vision_model" },
  };
}

describe("Gemma 4 config normalization", () => {
  it("normalizes the 26B-A4B config", () => {
    const { architecture: a } = normalizeConfig(gemma4_26b(), { eos_token_id: [1, 106, 50] });
    expect(a).toMatchObject({
      family: "gemma4",
      vocab_size: 262144,
      hidden_size: 2816,
      num_layers: 30,
      num_attention_heads: 16,
      intermediate_size: 2112,
      norm_weight_offset: 0,
      embed_scale: 53,
      attention_scale: 1,
      final_logit_softcap: 30,
      v_norm: true,
      moe: { num_experts: 128, top_k: 8, intermediate_size: 704 },
      bos_token_id: 2,
      eos_token_ids: [1, 106, 50],
      pad_token_id: 0,
      max_position_embeddings: 262144,
    });
    expect(a.layers[0]).toEqual({
      attention: "sliding",
      sliding_window: 1024,
      head_dim: 256,
      num_kv_heads: 8,
      k_eq_v: false,
      moe: true,
      rope: { theta: 10000, rotary_pairs: 128, freq_dim: 256, scale: 1 },
    });
    expect(a.layers[5]).toEqual({
      attention: "full",
      sliding_window: null,
      head_dim: 512,
      num_kv_heads: 2,
      k_eq_v: true,
      moe: true,
      rope: { theta: 1000000, rotary_pairs: 64, freq_dim: 512, scale: 1 },
    });
    expect(a.layers.filter((l) => l.attention === "full").length).toBe(5);
  });

  it("takes eos from the config when there is no generation_config.json", () => {
    expect(normalizeConfig(gemma4_26b()).architecture.eos_token_ids).toEqual([1, 106]);
    const flat = { ...(gemma4_26b().text_config as object), eos_token_id: [1, 106] };
    expect(normalizeConfig(flat).architecture.eos_token_ids).toEqual([1, 106]);
  });

  it("gives the same architecture for the nested (global_head_dim) and flat (per_layer_config) forms", () => {
    for (const spec of [TINY_GEMMA4_MOE, TINY_GEMMA4_DENSE]) {
      const nested = normalizeConfig(tinyConfig(spec, "nested")).architecture;
      const flat = normalizeConfig(tinyConfig(spec, "flat")).architecture;
      expect(flat).toEqual(nested);
      expect(nested.layers[2]).toMatchObject({ head_dim: 128, attention: "full" });
    }
  });

  it("reads per_layer_config from transformers 5.15+ (no global_head_dim)", () => {
    const text = { ...(gemma4_26b().text_config as Record<string, unknown>) };
    delete text.global_head_dim;
    delete text.num_global_key_value_heads;
    text.per_layer_config = Object.fromEntries(
      [5, 11, 17, 23, 29].map((i) => [String(i), { head_dim: 512, num_key_value_heads: 2 }]),
    );
    const a = normalizeConfig({ ...gemma4_26b(), text_config: text }).architecture;
    expect(a).toEqual(normalizeConfig(gemma4_26b()).architecture);
  });

  it("uses num_global_key_value_heads only with attention_k_eq_v (as transformers does)", () => {
    const cfg = gemma4_26b();
    (cfg.text_config as Record<string, unknown>).attention_k_eq_v = false;
    const a = normalizeConfig(cfg).architecture;
    expect(a.layers[5]).toMatchObject({ head_dim: 512, num_kv_heads: 8, k_eq_v: false });
  });

  it("applies transformers defaults: 5:1 pattern, last layer full, default RoPE, global_head_dim 512", () => {
    const text = { ...(gemma4_26b().text_config as Record<string, unknown>) };
    delete text.layer_types;
    delete text.rope_parameters;
    delete text.global_head_dim;
    text.num_hidden_layers = 8;
    const a = normalizeConfig({ model_type: "gemma4", text_config: text }).architecture;
    expect(a.layers.map((l) => l.attention[0])).toEqual(["s", "s", "s", "s", "s", "f", "s", "f"]);
    expect(a.layers[7]!.rope).toEqual({
      theta: 1000000,
      rotary_pairs: 64,
      freq_dim: 512,
      scale: 1,
    });
    expect(a.layers[0]!.rope).toEqual({ theta: 10000, rotary_pairs: 128, freq_dim: 256, scale: 1 });
  });

  it("handles a dense Gemma 4 (no MoE) and proportional RoPE with a factor", () => {
    const cfg = gemma4_26b();
    const text = cfg.text_config as Record<string, unknown>;
    text.enable_moe_block = false;
    (text.rope_parameters as Record<string, Record<string, unknown>>).full_attention!.factor = 4;
    const a = normalizeConfig(cfg).architecture;
    expect(a.moe).toBeNull();
    expect(a.layers.every((l) => !l.moe)).toBe(true);
    expect(a.layers[5]!.rope.scale).toBe(4);
  });

  it("stops on unsupported features, naming them", () => {
    const edit = (f: (t: Record<string, unknown>) => void): Record<string, unknown> => {
      const cfg = gemma4_26b();
      f(cfg.text_config as Record<string, unknown>);
      return cfg;
    };
    expect(() => normalizeConfig(edit((t) => (t.hidden_size_per_layer_input = 256)))).toThrow(
      /per-layer embeddings \(hidden_size_per_layer_input: 256\)/,
    );
    // Absent means transformers' default of 256 (E2B/E4B style).
    expect(() => normalizeConfig(edit((t) => delete t.hidden_size_per_layer_input))).toThrow(
      /per-layer embeddings/,
    );
    expect(() =>
      normalizeConfig(
        edit((t) => {
          t.num_kv_shared_layers = 20;
          t.use_double_wide_mlp = true;
        }),
      ),
    ).toThrow(/KV sharing across layers \(num_kv_shared_layers: 20\), the double-wide MLP/);
    expect(() => normalizeConfig(edit((t) => (t.attn_logit_softcapping = 50)))).toThrow(
      /attention logit softcapping/,
    );
    expect(() =>
      normalizeConfig(
        edit(
          (t) =>
            (t.layer_types = [...(t.layer_types as string[]).slice(0, 29), "chunked_attention"]),
        ),
      ),
    ).toThrow(/layer type "chunked_attention" \(layer 29\)/);
    expect(() =>
      normalizeConfig(
        edit(
          (t) =>
            ((t.rope_parameters as Record<string, unknown>).sliding_attention = {
              rope_type: "yarn",
              factor: 2,
            }),
        ),
      ),
    ).toThrow(/rope_type "yarn"/);
    expect(() => normalizeConfig(edit((t) => (t.hidden_activation = "silu")))).toThrow(
      /activation "silu"/,
    );
    expect(() => normalizeConfig({ model_type: "llama", hidden_size: 8 })).toThrow(
      /model_type llama; Redwing imports Gemma 4/,
    );
    expect(() => normalizeConfig(edit((t) => (t.tie_word_embeddings = false)))).toThrow(/untied/);
  });
});

describe("Gemma 3 config normalization", () => {
  it("normalizes the sparse gemma-3-4b-it config with transformers defaults", () => {
    const { architecture: a } = normalizeConfig(gemma3_4b());
    expect(a).toMatchObject({
      family: "gemma3",
      vocab_size: 262208,
      hidden_size: 2560,
      num_layers: 34,
      num_attention_heads: 8,
      intermediate_size: 10240,
      norm_weight_offset: 1,
      embed_scale: 50.5,
      attention_scale: 1 / 16,
      final_logit_softcap: null,
      v_norm: false,
      moe: null,
      eos_token_ids: [1, 106],
      bos_token_id: 2,
      max_position_embeddings: 131072,
    });
    const full = a.layers.flatMap((l, i) => (l.attention === "full" ? [i] : []));
    expect(full).toEqual([5, 11, 17, 23, 29]);
    expect(a.layers[5]).toEqual({
      attention: "full",
      sliding_window: null,
      head_dim: 256,
      num_kv_heads: 4,
      k_eq_v: false,
      moe: false,
      rope: { theta: 1000000, rotary_pairs: 128, freq_dim: 256, scale: 8 },
    });
    expect(a.layers[0]).toMatchObject({ sliding_window: 1024, rope: { theta: 10000, scale: 1 } });
  });

  it("accepts rope_scaling with the old 'type' key and an explicit layer_types", () => {
    const cfg = gemma3_4b();
    const text = cfg.text_config as Record<string, unknown>;
    text.rope_scaling = { type: "linear", factor: 4 };
    text.num_hidden_layers = 4;
    text.layer_types = [S, F, F, S];
    const a = normalizeConfig(cfg).architecture;
    expect(a.layers.map((l) => l.rope.scale)).toEqual([1, 4, 4, 1]);
  });

  it("gives the same architecture for rope_scaling and transformers-5 rope_parameters forms", () => {
    const nested = normalizeConfig(tinyConfig(TINY_GEMMA3, "nested")).architecture;
    const flat = normalizeConfig(tinyConfig(TINY_GEMMA3, "flat")).architecture;
    expect(flat).toEqual(nested);
    expect(nested.layers[1]!.rope).toEqual({
      theta: 1000000,
      rotary_pairs: 32,
      freq_dim: 64,
      scale: 8,
    });
    expect(nested.layers[0]!.rope).toEqual({
      theta: 10000,
      rotary_pairs: 32,
      freq_dim: 64,
      scale: 1,
    });
    expect(nested.attention_scale).toBe(0.125);
  });

  it("reads rope_theta inside per-type rope_parameters when present", () => {
    const cfg = tinyConfig(TINY_GEMMA3, "flat");
    cfg.rope_parameters = {
      full_attention: { rope_type: "linear", factor: 2, rope_theta: 500000 },
      sliding_attention: { rope_type: "default", rope_theta: 20000 },
    };
    const a = normalizeConfig(cfg).architecture;
    expect(a.layers[1]!.rope).toMatchObject({ theta: 500000, scale: 2 });
    expect(a.layers[0]!.rope).toMatchObject({ theta: 20000, scale: 1 });
  });

  it("reads transformers 5.17 saves: rope_parameters with the legacy keys set to null", () => {
    const cfg = gemma3_4b();
    const text = cfg.text_config as Record<string, unknown>;
    Object.assign(text, {
      rope_theta: null,
      rope_local_base_freq: null,
      rope_scaling: null,
      sliding_window_pattern: null,
      layer_types: Array.from({ length: 34 }, (_, i) => ((i + 1) % 6 === 0 ? F : S)),
      rope_parameters: {
        sliding_attention: { rope_type: "default", rope_theta: 10000 },
        full_attention: { rope_type: "linear", factor: 8, rope_theta: 1000000 },
      },
    });
    expect(normalizeConfig(cfg).architecture).toEqual(normalizeConfig(gemma3_4b()).architecture);
  });

  it("stops on attention softcapping and partial rotary", () => {
    const cfg = gemma3_4b();
    (cfg.text_config as Record<string, unknown>).attn_logit_softcapping = 50;
    expect(() => normalizeConfig(cfg)).toThrow(
      /attention logit softcapping \(attn_logit_softcapping: 50\)/,
    );
    const cfg2 = tinyConfig(TINY_GEMMA3, "flat");
    (
      cfg2.rope_parameters as Record<string, Record<string, unknown>>
    ).sliding_attention!.partial_rotary_factor = 0.5;
    expect(() => normalizeConfig(cfg2)).toThrow(/partial rotary embeddings/);
  });

  it("rejects inconsistent configs clearly", () => {
    const cfg = tinyConfig(TINY_GEMMA3, "flat");
    cfg.layer_types = [S, F];
    expect(() => normalizeConfig(cfg)).toThrow(/layer_types has 2 entries for 4 layers/);
    expect(() =>
      normalizeConfig({ ...tinyConfig(TINY_GEMMA3, "flat"), hidden_size: "big" }),
    ).toThrow(/hidden_size must be a number/);
  });
});

describe("limits on the numbers that size work", () => {
  it("num_hidden_layers: 1e9 without layer_types is a clear error naming the field", () => {
    for (const key of Object.keys(CONFIG_LIMITS)) {
      const cfg = tinyConfig(TINY_GEMMA4_MOE, "nested");
      const target = (cfg.text_config as Record<string, unknown> | undefined) ?? cfg;
      delete target.layer_types;
      target[key] = 1e9;
      let error: unknown = null;
      try {
        normalizeConfig(cfg);
      } catch (e) {
        error = e;
      }
      expect(error, key).toBeInstanceOf(UserError);
      expect((error as UserError).code, key).toBe("config_invalid");
      expect((error as Error).message, key).toContain(
        `${key} is 1000000000, more than Redwing accepts`,
      );
    }
  });
});
