/**
 * Gemma 4 (the TypeScript side of native/src/models/gemma4.cpp): its special tokens, config
 * normalization (per-layer head sizes, proportional RoPE on full layers, K=V attention, the MoE
 * block), the tensors it adds to the Gemma decoder, its fallback chat template (gemma4.jinja next
 * to this file: Google's current format, tools included), where its templates want tool results,
 * and its tool-call syntax
 *   <|tool_call>call:NAME{key:<|"|>text<|"|>,n:42,flag:true,list:[1,2],obj:{a:1}}<tool_call|>
 * (strings between `<|"|>` quotes, everything else bare).
 */
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { UserError } from "../errors.ts";
import type { Architecture, LayerArch } from "../format/manifest.ts";
import { type ConfigJson, int, invalid, isObject, optNum, unsupported } from "./config-fields.ts";
import {
  GEMMA_CHECKPOINT,
  GEMMA_TEXT_DEFAULTS,
  type GemmaVariant,
  type LayerType,
  type RopeSpec,
  gemmaLayer,
  gemmaTensors,
  normalizeGemmaConfig,
  ropeFor,
  ropeParameters,
} from "./gemma-common.ts";
import {
  MalformedToolCall,
  type ModelFamily,
  type ModelToolCall,
  type TemplateMessage,
  type ToolParseOptions,
  type ToolSyntax,
} from "./family.ts";

/** Gemma 4's chat and tool-call tokens (each one token of its vocabulary). */
export const GEMMA4_TOKENS = {
  turnEnd: "<turn|>",
  toolCallOpen: "<|tool_call>",
  toolCallClose: "<tool_call|>",
  /** Quotes strings in tool declarations and calls. */
  quote: '<|"|>',
  /** Opens a tool declaration in the system turn. */
  toolDeclarationOpen: "<|tool>",
  /** Opens a tool result; the model writes it to hand over to the tool. */
  toolResponseOpen: "<|tool_response>",
  channelOpen: "<|channel>",
  channelClose: "<channel|>",
} as const;

// ---- config ----

/** transformers' Gemma4TextConfig defaults. */
const GEMMA4_DEFAULTS: ConfigJson = {
  ...GEMMA_TEXT_DEFAULTS,
  vocab_size: 262144,
  num_hidden_layers: 30,
  rope_parameters: null,
  sliding_window: 512,
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

const VARIANT: GemmaVariant = {
  id: "gemma4",
  defaults: GEMMA4_DEFAULTS,
  // transformers forces the last Gemma 4 layer to full attention.
  lastLayerFull: true,
  body(cfg, layerTypes, heads) {
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
    let moe: Architecture["moe"] = null;
    if (cfg.enable_moe_block === true) {
      moe = {
        num_experts: int(cfg, "num_experts"),
        top_k: int(cfg, "top_k_experts"),
        intermediate_size: int(cfg, "moe_intermediate_size"),
      };
    }
    return {
      layers: gemma4Layers(cfg, layerTypes, heads, moe !== null),
      moe,
      attention_scale: 1.0,
      norm_weight_offset: 0,
      v_norm: true,
    };
  },
};

/** Per-layer overrides of Gemma 4 (`per_layer_config`, keys are layer indices). */
function perLayerOverrides(cfg: ConfigJson, n: number): (ConfigJson | null)[] {
  const plc = cfg.per_layer_config;
  const out: (ConfigJson | null)[] = Array.from({ length: n }, () => null);
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

/** Sliding layers rotate fully at theta 10^4; full layers a quarter, proportionally, at 10^6. */
function defaultRope(): Record<LayerType, RopeSpec> {
  return {
    sliding_attention: { type: "default", theta: 10000, factor: 1, partial: 1 },
    full_attention: { type: "proportional", theta: 1000000, factor: 1, partial: 0.25 },
  };
}

function gemma4Layers(
  cfg: ConfigJson,
  types: LayerType[],
  heads: number,
  moe: boolean,
): LayerArch[] {
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
  const rope = ropeParameters(cfg, defaultRope(), false) ?? defaultRope();
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
      ...gemmaLayer(type, window, hd, kv, ropeFor(rope[type], hd, `rope_parameters.${type}`)),
      k_eq_v: kEqV && full,
      moe,
    };
  });
}

/** What every Gemma 4 text config here shares: RoPE per layer type, norms, softcap, head. */
export const GEMMA4_TEXT_COMMON = {
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

/**
 * The text config of google/gemma-4-26B-A4B-it as its Hugging Face `config.json` gives it (see
 * ../shared/research/gemma-arch.md, section 1): the shapes of random-weight models (core/synth).
 */
export const GEMMA4_26B_A4B_TEXT_CONFIG = {
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
} as const;

// ---- chat ----

const HERE = dirname(fileURLToPath(import.meta.url));

/** Redwing's Gemma 4 template (gemma4.jinja): Google's current format, with tools. */
export function gemma4FallbackTemplate(): string {
  return readFileSync(join(HERE, "gemma4.jinja"), "utf8");
}

/**
 * Every Gemma 4 template knows the native `tool_responses` field: each run of `role: "tool"`
 * messages is folded into the assistant message that made the calls. The current template
 * renders those results inside the model turn
 * (`<|tool_response>response:NAME{value:...}<tool_response|>`), and so does an older one that
 * would otherwise render a `<|turn>tool` turn the model was not trained on. A tool result that
 * answers no call is refused rather than dropped.
 */
function foldToolResults(template: string, messages: TemplateMessage[]): TemplateMessage[] | null {
  if (!template.includes("tool_responses")) return null;
  const out: TemplateMessage[] = [];
  let caller: TemplateMessage | null = null;
  for (const [i, m] of messages.entries()) {
    if (m.role === "tool") {
      if (!caller) {
        throw new UserError(
          `message ${i} is a tool result that does not follow an assistant message with tool_calls`,
        );
      }
      const name =
        caller.tool_calls!.find((c) => c.id !== undefined && c.id === m.tool_call_id)?.function
          .name ??
        m.name ??
        "unknown";
      (caller.tool_responses ??= []).push({ name, response: m.content });
      continue;
    }
    out.push(m);
    caller = m.role === "assistant" && m.tool_calls?.length ? m : null;
  }
  return out;
}

// ---- tool calls ----

const T = GEMMA4_TOKENS;
/** An unquoted key: anything up to the `:` that is not structure or markup. */
const BARE_KEY = /^[^\s:,{}[\]<>]+/u;

/** A recursive-descent reader of Gemma 4's argument syntax. */
class ArgReader {
  pos = 0;
  constructor(private readonly s: string) {}

  private fail(what: string): never {
    throw new MalformedToolCall(
      `${what} at offset ${this.pos} of ${JSON.stringify(this.s.slice(0, 200))}`,
    );
  }

  private skipSpace(): void {
    while (this.pos < this.s.length && /\s/.test(this.s[this.pos]!)) this.pos++;
  }

  object(): Record<string, unknown> {
    if (this.s[this.pos] !== "{") this.fail("expected {");
    this.pos++;
    const out: Record<string, unknown> = {};
    this.skipSpace();
    if (this.s[this.pos] === "}") {
      this.pos++;
      return out;
    }
    for (;;) {
      const key = this.key();
      if (this.s[this.pos] !== ":") this.fail("expected :");
      this.pos++;
      if (Object.hasOwn(out, key)) this.fail(`duplicate key ${key}`);
      out[key] = this.value();
      this.skipSpace();
      const c = this.s[this.pos];
      this.pos++;
      if (c === "}") return out;
      if (c !== ",") this.fail("expected , or }");
    }
  }

  /** `name` or `<|"|>name<|"|>` (the quoted form Gemma's template uses inside declarations). */
  private key(): string {
    this.skipSpace();
    if (this.s.startsWith(T.quote, this.pos)) return this.string();
    const key = BARE_KEY.exec(this.s.slice(this.pos));
    if (!key) this.fail("expected a key");
    this.pos += key[0].length;
    return key[0];
  }

  private string(): string {
    const end = this.s.indexOf(T.quote, this.pos + T.quote.length);
    if (end === -1) this.fail("unterminated string");
    const text = this.s.slice(this.pos + T.quote.length, end);
    this.pos = end + T.quote.length;
    return text;
  }

  private array(): unknown[] {
    this.pos++; // [
    const out: unknown[] = [];
    this.skipSpace();
    if (this.s[this.pos] === "]") {
      this.pos++;
      return out;
    }
    for (;;) {
      out.push(this.value());
      this.skipSpace();
      const c = this.s[this.pos];
      this.pos++;
      if (c === "]") return out;
      if (c !== ",") this.fail("expected , or ]");
    }
  }

  value(): unknown {
    this.skipSpace();
    if (this.s.startsWith(T.quote, this.pos)) return this.string();
    const c = this.s[this.pos];
    if (c === "{") return this.object();
    if (c === "[") return this.array();
    const m = /^(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)(?=[\s,}\]])/.exec(
      this.s.slice(this.pos),
    );
    if (!m) this.fail("expected a value");
    this.pos += m[0].length;
    return JSON.parse(m[0]) as unknown;
  }

  /** Skips whitespace; true when `token` follows (and steps over it). */
  take(token: string): boolean {
    const start = this.pos;
    this.skipSpace();
    if (this.s.startsWith(token, this.pos)) {
      this.pos += token.length;
      return true;
    }
    this.pos = start;
    return false;
  }

  get atEnd(): boolean {
    this.skipSpace();
    return this.pos === this.s.length;
  }
}

/** Reads `call:NAME{...}` and what closes it at `reader.pos`; throws MalformedToolCall. */
function readCall(
  reader: ArgReader,
  text: string,
  index: number,
  endedOnStop: boolean,
): ModelToolCall {
  const m = /^\s*call:([A-Za-z0-9_-]{1,64})/.exec(text.slice(reader.pos));
  if (!m) throw new MalformedToolCall(`tool call ${index} does not start with call:NAME`);
  reader.pos += m[0].length;
  const args = reader.object();
  if (reader.take(T.toolCallClose)) {
    while (reader.take(T.toolCallClose)); // a repeated close is harmless
    // `<turn|>` or `<|tool_response>` in place of the close ends the output (left for the caller).
  } else if (reader.atEnd ? !endedOnStop : !endsOutput(text, reader.pos)) {
    throw new MalformedToolCall(
      reader.atEnd
        ? `tool call ${index} is not closed`
        : `tool call ${index} has text after its arguments`,
    );
  }
  return { name: m[1]!, arguments: args };
}

/** True when the model's output ends at `pos`: the end of its turn or the hand-over to the tool. */
function endsOutput(text: string, pos: number): boolean {
  return text.startsWith(T.turnEnd, pos) || text.startsWith(T.toolResponseOpen, pos);
}

/** The text without its closed thought channels (`<|channel>...<channel|>`). */
function withoutThoughts(text: string): string {
  let out = "";
  let pos = 0;
  for (;;) {
    const open = text.indexOf(T.channelOpen, pos);
    const close = open === -1 ? -1 : text.indexOf(T.channelClose, open);
    if (close === -1) return out + text.slice(pos);
    out += text.slice(pos, open);
    pos = close + T.channelClose.length;
  }
}

/**
 * What real models emit around a call is accepted: a thought channel before it (removed), text
 * after the calls (kept as content), a repeated `<tool_call|>`, `<turn|>` or the hand-over to the
 * tool in place of `<tool_call|>`, keys that are not ASCII identifiers (`2d`, `año`). Text
 * before, between and after the calls is the content; the output ends at `<turn|>` or at the
 * hand-over (`<|tool_response>`). Anything that starts a call but does not parse fails closed.
 */
function parseGemma4ToolCalls(
  text: string,
  allowed?: readonly string[],
  options: ToolParseOptions = {},
): { content: string; calls: ModelToolCall[] } | null {
  const visible = withoutThoughts(text);
  if (!visible.includes(T.toolCallOpen)) {
    if (visible.includes(T.toolCallClose)) {
      throw new MalformedToolCall("a tool call end without its start");
    }
    return null;
  }
  const calls: ModelToolCall[] = [];
  let content = "";
  const reader = new ArgReader(visible);
  for (;;) {
    const next = visible.indexOf(T.toolCallOpen, reader.pos);
    const segment = visible.slice(reader.pos, next === -1 ? undefined : next);
    const handOver = [T.toolResponseOpen, T.turnEnd]
      .map((token) => segment.indexOf(token))
      .filter((at) => at !== -1);
    const end = handOver.length > 0 ? Math.min(...handOver) : -1;
    const said = end === -1 ? segment : segment.slice(0, end);
    if (said.includes(T.toolCallClose)) {
      throw new MalformedToolCall("a tool call end without its start");
    }
    if (said.includes(T.channelOpen) || said.includes(T.channelClose)) {
      throw new MalformedToolCall("an unclosed thought channel");
    }
    content += said;
    if (next === -1 || end !== -1) break;
    reader.pos = next + T.toolCallOpen.length;
    const call = readCall(reader, visible, calls.length, options.endedOnStopToken ?? false);
    if (allowed && !allowed.includes(call.name)) {
      throw new MalformedToolCall(`the model called an undeclared function "${call.name}"`);
    }
    calls.push(call);
  }
  return { content: content.trim(), calls };
}

export const GEMMA4_TOOL_SYNTAX: ToolSyntax = {
  callOpen: T.toolCallOpen,
  declarationOpen: T.toolDeclarationOpen,
  handOverTokens: [T.toolResponseOpen],
  forcedCallPrefix: (name) => `${T.toolCallOpen}call:${name ?? ""}`,
  parse: parseGemma4ToolCalls,
};

export const GEMMA4: ModelFamily = {
  id: "gemma4",
  title: "Gemma 4",
  modelTypes: ["gemma4", "gemma4_text"],
  normalizeConfig: (input) => normalizeGemmaConfig(VARIANT, input),
  // Gemma 4 scales each layer's output by a learned scalar.
  expectedTensors: (arch) =>
    gemmaTensors(arch, (p) => [{ name: `${p}layer_scalar`, kind: "plain", shape: [1] }]),
  checkpoint: GEMMA_CHECKPOINT,
  fallbackChatTemplate: gemma4FallbackTemplate,
  templateMessages: foldToolResults,
  tools: GEMMA4_TOOL_SYNTAX,
};
