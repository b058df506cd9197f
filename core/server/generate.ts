/**
 * One generation for the server: prompt ids go to the engine client, generated ids come back
 * as text pieces (incremental detokenization, stop strings, end-of-turn ids; core/chat's
 * TextStream). A stop string cancels the rest of the generation in the engine; so does the
 * caller's signal (a client that went away).
 */
import { TextStream } from "../chat/text-stream.ts";
import type { ChatTokenizer } from "../chat/tokenizer.ts";
import type { EngineClient, FinishedEvent, Sampling } from "../engine/index.ts";

export interface GenerationParams {
  tokens: number[];
  maxNew: number;
  sampling: Sampling;
  stopStrings: readonly string[];
  stopIds: readonly number[];
  ignoreEos?: boolean;
  /** Keep special tokens in the text (tool-call markup); default false. */
  keepSpecial?: boolean;
}

export type FinishReason = "stop" | "length" | "cancelled";

export interface GenerationSummary {
  finishReason: FinishReason;
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
  text: string;
}

export type GenerationEvent =
  { type: "text"; text: string } | { type: "done"; summary: GenerationSummary };

/**
 * Yields text pieces as they are ready and ends with a summary. Engine errors (EngineError,
 * EngineCrashError) are thrown from the iterator.
 */
export async function* generate(
  engine: EngineClient,
  tokenizer: ChatTokenizer,
  params: GenerationParams,
  signal?: AbortSignal,
): AsyncGenerator<GenerationEvent, void, undefined> {
  const stream = new TextStream(
    (ids) => tokenizer.decode(ids, { skipSpecial: !params.keepSpecial }),
    {
      stopStrings: params.stopStrings,
      stopIds: params.ignoreEos ? [] : params.stopIds,
    },
  );
  // Our own controller: a stop string ends the engine's work as a client disconnect does.
  const abort = new AbortController();
  const onOuterAbort = (): void => abort.abort();
  signal?.addEventListener("abort", onOuterAbort, { once: true });
  if (signal?.aborted) abort.abort();
  let completion = 0;
  let text = "";
  let finished: FinishedEvent | null = null;
  try {
    for await (const event of engine.generate(
      {
        tokens: params.tokens,
        max_new_tokens: params.maxNew,
        sampling: params.sampling,
        stop_token_ids: params.ignoreEos ? [] : [...params.stopIds],
        ignore_eos: params.ignoreEos ?? false,
        stats_interval_ms: 0,
      },
      { signal: abort.signal },
    )) {
      if (event.type === "tokens") {
        for (const id of event.tokens) {
          if (stream.stopped) break;
          completion++;
          const piece = stream.push(id);
          if (piece) {
            text += piece;
            yield { type: "text", text: piece };
          }
        }
        if (stream.stopped && !abort.signal.aborted) abort.abort();
      } else if (event.type === "finished") {
        finished = event;
      }
    }
  } finally {
    signal?.removeEventListener("abort", onOuterAbort);
  }
  const rest = stream.end();
  if (rest && !signal?.aborted) {
    text += rest;
    yield { type: "text", text: rest };
  }
  let reason: FinishReason;
  if (stream.stopped) reason = "stop";
  else if (signal?.aborted) reason = "cancelled";
  else if (finished?.reason === "eos" || finished?.reason === "stop") reason = "stop";
  else reason = "length";
  yield {
    type: "done",
    summary: {
      finishReason: reason,
      promptTokens: finished?.prompt_tokens ?? params.tokens.length,
      cachedTokens: finished?.cached_tokens ?? 0,
      completionTokens: completion,
      text,
    },
  };
}
