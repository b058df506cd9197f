/**
 * Test helper: an EngineManager stand-in for ChatManager (core/app/chat.ts) whose engine is a
 * generate() the test writes, so that a test can script the replies and see the prompts. The
 * loaded model is named "scripted" and has the given tokenizer and chat template.
 */
import { DEFAULT_SETTINGS } from "../core/app/api.ts";
import type { EngineManager } from "../core/app/engine.ts";
import type { ChatTokenizer } from "../core/chat/tokenizer.ts";
import type { FinishReason, GenerateEvent, GenerateParams } from "../core/engine/protocol.ts";
import { EngineQueue } from "../core/server/queue.ts";

export type ScriptedGenerate = (
  params: GenerateParams,
  options: { signal?: AbortSignal },
) => AsyncIterable<GenerateEvent>;

export interface ScriptedModel {
  tokenizer: ChatTokenizer;
  /** The model's chat template (Jinja). */
  template: string;
  /** KV positions; default DEFAULT_SETTINGS' context. */
  context?: number;
}

/** An engine manager with `model` loaded, answering through `generate`. */
export function scriptedEngineManager(
  model: ScriptedModel,
  generate: ScriptedGenerate,
): EngineManager {
  const client = {
    generate: (params: GenerateParams, options: { signal?: AbortSignal } = {}) =>
      generate(params, options),
  };
  const context = model.context ?? DEFAULT_SETTINGS.engine.context;
  // Only what ChatManager reads of an EngineManager and its loaded model.
  const fake = {
    queue: new EngineQueue(4),
    loaded: { name: "scripted" },
    status: () => ({ model: "scripted" }),
    settled: async () => undefined,
    stats: async () => null,
    requireLoaded: () => ({
      client,
      model: {
        name: "scripted",
        tokenizer: model.tokenizer,
        template: model.template,
        stopIds: [1],
        settings: { ...DEFAULT_SETTINGS.engine, context },
        manifest: { architecture: { max_position_embeddings: 8192 } },
        ready: { expert_cache_slots: 0 },
      },
    }),
  };
  return fake as unknown as EngineManager;
}

/**
 * The `finished` event that ends a generation of `tokens` after `params`' prompt (nothing cached),
 * with fixed timings: TTFT 100 ms, 10 tokens/s.
 */
export function finishedEvent(
  params: GenerateParams,
  tokens: number[],
  reason: FinishReason,
): GenerateEvent {
  return {
    type: "finished",
    id: 1,
    reason,
    tokens,
    prompt_tokens: params.tokens.length,
    cached_tokens: 0,
    prefill_tokens: params.tokens.length,
    timings: {
      prefill_seconds: 0.1,
      ttft_seconds: 0.1,
      decode_seconds: 0.1,
      prefill_tokens_per_second: 10,
      decode_tokens_per_second: 10,
    },
  };
}
