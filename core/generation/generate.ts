/**
 * The one generation loop, shared by the CLI (`redwing chat`, `complete`), the OpenAI-compatible
 * server and the app: prompt ids go to the engine, generated ids come back and become text
 * pieces (incremental detokenization, stop strings held back until they cannot match, stop ids;
 * core/chat's TextStream), and the generation ends with its finish reason, token counts,
 * statistics and, when asked, the tool calls in the output.
 *
 * A stop string or stop id cancels the rest of the generation in the engine; so does the caller's
 * signal (Ctrl-C, a client that went away, the app's Stop button).
 */
import type { GenerationStats } from "../chat/stats.ts";
import { TextStream } from "../chat/text-stream.ts";
import type { ChatTokenizer } from "../chat/tokenizer.ts";
import type { FinishedEvent, GenerateEvent, GenerateParams, StatsEvent } from "../engine/index.ts";
import { toProtocolSampling, type SamplingSettings } from "./settings.ts";

/** What the loop needs of an engine; core/engine's EngineClient is one. */
export interface TokenEngine {
  generate(
    params: GenerateParams,
    options?: { signal?: AbortSignal },
  ): AsyncIterable<GenerateEvent>;
}

/** Memory figures read after a generation, for its statistics line. */
export interface MemoryReading {
  peakMemoryBytes: number | null;
  /** Null when the model has no expert cache (dense, or every expert resident). */
  cacheHitRate: number | null;
}

export interface GenerationRequest {
  tokens: number[];
  maxNewTokens: number;
  sampling: SamplingSettings;
  /** End-of-turn ids: they end the generation and are not shown. */
  stopIds: readonly number[];
  /** Text that ends the generation; neither it nor anything after it is shown. */
  stopStrings?: readonly string[];
  /** Generate past end-of-turn ids (benchmarks, tests): no stop ids at all. */
  ignoreEos?: boolean;
  /** Keep special tokens in the text (tool-call markup); default false. */
  keepSpecial?: boolean;
  /** The service's periodic stats events during generation (the app's live panel); 0: none. */
  statsIntervalMs?: number;
}

export interface GenerationOptions<Calls extends { content: string }> {
  signal?: AbortSignal;
  /** Read once the engine finished, for the statistics (peak memory, cache hit rate). */
  readMemory?: () => Promise<MemoryReading | null>;
  /**
   * When set, the output may be tool calls: no text goes out while generating; at the end this
   * parses the whole text (null: plain text, which then goes out in one piece; a throw: the
   * output is malformed, and the loop throws it). `endedOnStop`: a stop id or string ended it.
   */
  parseToolCalls?: (text: string, endedOnStop: boolean) => Calls | null;
}

/**
 * Why a generation ended: an end-of-turn id, a stop string, the token budget (or the context),
 * or the caller's signal.
 */
export type GenerationFinishReason = "stop_token" | "stop_string" | "length" | "cancelled";

export interface GenerationResult<Calls = never> {
  /** Everything shown (the raw output with tool calls, before parsing). */
  text: string;
  /** Generated ids read, up to and including the one that ended the generation. */
  tokens: number[];
  finishReason: GenerationFinishReason;
  promptTokens: number;
  /** Prompt tokens whose KV the engine reused from the previous generation. */
  cachedTokens: number;
  /** Null when the engine reported no timings (a cancelled or failed generation). */
  stats: GenerationStats | null;
  /** The parsed tool calls, when `parseToolCalls` found some. */
  toolCalls: Calls | null;
}

export type GenerationEvent<Calls = never> =
  | { type: "text"; text: string }
  /** `count` generated ids were read (before any text they make is ready). */
  | { type: "tokens"; count: number }
  | { type: "stats"; stats: StatsEvent }
  | { type: "done"; result: GenerationResult<Calls> };

/** GenerationStats from the engine's finished event and a memory reading after it. */
export function statsOf(finished: FinishedEvent, memory: MemoryReading | null): GenerationStats {
  const t = finished.timings;
  return {
    promptTokens: finished.prompt_tokens,
    generatedTokens: finished.tokens.length,
    ttftSeconds: t?.ttft_seconds ?? 0,
    decodeSeconds: t?.decode_seconds ?? 0,
    peakMemoryBytes: memory?.peakMemoryBytes ?? null,
    cacheHitRate: memory?.cacheHitRate ?? null,
  };
}

/**
 * Runs one generation. Yields text pieces as they are ready and ends with `done`. Engine errors
 * (EngineError, EngineCrashError, a failed engine process) are thrown from the iterator, except
 * those that follow a cancel (the generation then ends as stopped or cancelled).
 */
export async function* generate<Calls extends { content: string } = never>(
  engine: TokenEngine,
  tokenizer: ChatTokenizer,
  request: GenerationRequest,
  options: GenerationOptions<Calls> = {},
): AsyncGenerator<GenerationEvent<Calls>, void, undefined> {
  const stopIds = request.ignoreEos ? [] : [...request.stopIds];
  const stream = new TextStream(
    (ids) => tokenizer.decode(ids, { skipSpecial: !request.keepSpecial }),
    { stopStrings: request.stopStrings ?? [], stopIds },
  );
  const { signal } = options;
  // Our own controller: a stop string ends the engine's work as the caller's signal does.
  const abort = new AbortController();
  const onOuterAbort = (): void => abort.abort();
  signal?.addEventListener("abort", onOuterAbort, { once: true });
  if (signal?.aborted) abort.abort();
  const holdText = options.parseToolCalls !== undefined;
  const tokens: number[] = [];
  let text = "";
  let finished: FinishedEvent | null = null;
  try {
    const events = engine.generate(
      {
        tokens: request.tokens,
        max_new_tokens: request.maxNewTokens,
        sampling: toProtocolSampling(request.sampling),
        stop_token_ids: stopIds,
        ignore_eos: request.ignoreEos ?? false,
        stats_interval_ms: request.statsIntervalMs ?? 0,
      },
      { signal: abort.signal },
    );
    for await (const event of events) {
      if (event.type === "tokens") {
        let read = 0;
        let piece = "";
        for (const id of event.tokens) {
          if (stream.stopped) break;
          tokens.push(id);
          read++;
          piece += stream.push(id);
        }
        if (read > 0) yield { type: "tokens", count: read };
        if (piece) {
          text += piece;
          if (!holdText) yield { type: "text", text: piece };
        }
        // A stop string or stop id ends the generation; the engine need not go on.
        if (stream.stopped && !abort.signal.aborted) abort.abort();
      } else if (event.type === "stats") {
        yield { type: "stats", stats: event };
      } else if (event.type === "finished") {
        finished = event;
      }
    }
  } catch (error) {
    // After a cancel, the engine may end with an error (a killed process): that is the cancel.
    if (!abort.signal.aborted) throw error;
  } finally {
    signal?.removeEventListener("abort", onOuterAbort);
  }
  const cancelled = signal?.aborted === true && !stream.stopped;
  const rest = cancelled ? "" : stream.end();
  if (rest) {
    text += rest;
    if (!holdText) yield { type: "text", text: rest };
  }
  let finishReason: GenerationFinishReason;
  if (cancelled || (finished?.reason === "cancelled" && !stream.stopped)) {
    finishReason = "cancelled";
  } else if (stream.finishReason === "stop_token" || stream.finishReason === "stop_string") {
    finishReason = stream.finishReason;
  } else if (finished?.reason === "eos" || finished?.reason === "stop") {
    // The engine stopped at an end-of-turn id of its own.
    finishReason = "stop_token";
  } else finishReason = "length";

  let toolCalls: Calls | null = null;
  if (options.parseToolCalls && finishReason !== "cancelled") {
    toolCalls = options.parseToolCalls(
      text,
      finishReason === "stop_token" || finishReason === "stop_string",
    );
    const shown = toolCalls ? toolCalls.content : text;
    if (shown) yield { type: "text", text: shown };
  }
  const stats =
    finished?.timings !== undefined
      ? statsOf(finished, options.readMemory ? await options.readMemory() : null)
      : null;
  yield {
    type: "done",
    result: {
      text,
      tokens,
      finishReason,
      promptTokens: finished?.prompt_tokens ?? request.tokens.length,
      cachedTokens: finished?.cached_tokens ?? 0,
      stats,
      toolCalls,
    },
  };
}

/** Runs a generation to its end, handing each text piece to `onText`. */
export async function generateAll<Calls extends { content: string } = never>(
  engine: TokenEngine,
  tokenizer: ChatTokenizer,
  request: GenerationRequest,
  options: GenerationOptions<Calls> & { onText?: (text: string) => void } = {},
): Promise<GenerationResult<Calls>> {
  for await (const event of generate(engine, tokenizer, request, options)) {
    if (event.type === "text") options.onText?.(event.text);
    else if (event.type === "done") return event.result;
  }
  throw new Error("the generation loop ended without a result");
}
