/**
 * A client of an OpenAI-compatible endpoint (vLLM, llama.cpp's server, SGLang, Ollama, LM Studio,
 * another `redwing serve`), over the official `openai` package: its SSE parser and error classes
 * (status, headers) are well kept and typed, and its own retries are turned off so that this
 * module decides what is retried and says so. What it adds: plain-words errors with the next step
 * (errors.ts), one automatic retry after a 429 (or a 503 with Retry-After) that the caller is
 * told about, an idle timeout on the stream, a cut stream told apart from a finished one (the
 * text so far is kept), and the statistics measured here, on the client: TTFT from sending the
 * request to the first text, tokens/s over the rest, token counts from the server's `usage` when
 * it sends one (`stream_options.include_usage`), else counted from the stream's deltas.
 */
import OpenAI from "openai";
import { formatStats, type GenerationStats } from "../chat/stats.ts";
import { connectionError, RemoteError, statusError } from "./errors.ts";
import type { Endpoint } from "./store.ts";

export { RemoteError } from "./errors.ts";

export interface RemoteModel {
  id: string;
  ownedBy: string | null;
}

export interface RemoteMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

export interface RemoteChatRequest {
  model: string;
  messages: RemoteMessage[];
  temperature?: number;
  topP?: number;
  maxTokens?: number;
  /** OpenAI takes at most 4; the rest are dropped. */
  stop?: string[];
  seed?: number | null;
}

/**
 * A chat request from Redwing's messages: roles other than system and assistant go as "user"
 * (the roles every OpenAI-compatible server knows), the sampling as given.
 */
export function remoteChatRequest(
  model: string,
  messages: readonly { role: string; content: string }[],
  sampling: Omit<RemoteChatRequest, "model" | "messages">,
): RemoteChatRequest {
  return {
    model,
    messages: messages.map((m) => ({
      role: m.role === "system" || m.role === "assistant" ? m.role : "user",
      content: m.content,
    })),
    ...sampling,
  };
}

export interface RemoteTimeouts {
  /** Until the server answers the request's headers (default 60 s; a long prompt's prefill). */
  requestMs?: number;
  /** Longest silence inside a stream before it counts as dead (default 120 s). */
  idleMs?: number;
  /** The longest Retry-After waited for automatically (default 30 s); longer: an error. */
  maxRetryWaitS?: number;
}

export interface RemoteChatHandlers {
  onText?(text: string): void;
  /** The server said to wait (429, or 503 with Retry-After): the retry comes after `seconds`. */
  onWait?(seconds: number, error: RemoteError): void;
}

export type RemoteFinishReason = "stop" | "length" | "cancelled" | "error";

export interface RemoteReply {
  text: string;
  finishReason: RemoteFinishReason;
  /** Client-side figures; null when no text arrived. */
  stats: GenerationStats | null;
  /** Whether `stats`' token counts came from the server's usage or were counted here. */
  tokenSource: "usage" | "counted";
  /** Whether the server reported the prompt's length (else `stats.promptTokens` is 0, unknown). */
  promptTokensKnown: boolean;
  /** The statistics line, in the local replies' format; null without stats. */
  line: string | null;
  /** Why the reply failed (finishReason "error"); the text so far is kept. */
  error: RemoteError | null;
  /** The wait the server asked for before this reply, if any. */
  waited: { seconds: number; status: number } | null;
}

const DEFAULT_REQUEST_MS = 60_000;
const DEFAULT_IDLE_MS = 120_000;
const DEFAULT_MAX_RETRY_WAIT_S = 30;
/** OpenAI's limit on `stop`. */
const MAX_STOP = 4;

function openaiClient(endpoint: Endpoint, requestMs: number): OpenAI {
  return new OpenAI({
    baseURL: endpoint.baseUrl,
    // The package insists on a key; without one the Authorization header is removed below.
    apiKey: endpoint.apiKey ?? "none",
    // Never the environment's OpenAI settings: they belong to another service.
    organization: null,
    project: null,
    defaultHeaders: endpoint.apiKey ? {} : { Authorization: null },
    maxRetries: 0,
    timeout: requestMs,
    logLevel: "off",
  });
}

function toRemoteError(error: unknown, endpoint: Endpoint, model?: string): RemoteError {
  if (error instanceof RemoteError) return error;
  if (error instanceof OpenAI.APIConnectionTimeoutError) {
    return new RemoteError(
      `The server at ${endpoint.baseUrl} did not answer in time. Is it overloaded, or still loading its model? Retry in a moment.`,
      "remote_timeout",
    );
  }
  if (error instanceof OpenAI.APIConnectionError) return connectionError(error, endpoint.baseUrl);
  if (error instanceof OpenAI.APIError && error.status !== undefined) {
    return statusError(error, endpoint.baseUrl, { hasKey: endpoint.apiKey !== null, model });
  }
  if (error instanceof OpenAI.APIError) {
    // An error object inside the stream: the server's words.
    return new RemoteError(
      `The server at ${endpoint.baseUrl} reported an error mid-reply: ${error.message}`,
      "remote_server_error",
      null,
      null,
      error.message,
    );
  }
  // fetch's own failures (a reset before headers) come as TypeError("fetch failed") with a cause.
  return connectionError(error, endpoint.baseUrl);
}

/**
 * A pooled keep-alive connection to a server that has since gone (killed, restarted) fails the
 * next request at once with a socket error, before any answer: that request is sent once more
 * on a fresh connection, which then meets the server's real state (answering, or refusing).
 */
function staleSocket(error: unknown): boolean {
  if (
    !(error instanceof OpenAI.APIConnectionError) ||
    error instanceof OpenAI.APIConnectionTimeoutError
  ) {
    return false;
  }
  let e: unknown = error;
  for (let depth = 0; depth < 5 && e; depth++) {
    const code = (e as { code?: unknown }).code;
    if (code === "UND_ERR_SOCKET" || code === "ECONNRESET" || code === "EPIPE") return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

async function once<T>(ask: () => Promise<T>): Promise<T> {
  try {
    return await ask();
  } catch (error) {
    if (!staleSocket(error)) throw error;
    return ask();
  }
}

/** Waits `ms`, or until the signal aborts (resolving false). */
function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** `GET /models`: the endpoint's models, sorted by id. */
export async function listModels(
  endpoint: Endpoint,
  options: { signal?: AbortSignal; timeoutMs?: number } = {},
): Promise<RemoteModel[]> {
  const client = openaiClient(endpoint, options.timeoutMs ?? DEFAULT_REQUEST_MS);
  try {
    const models: RemoteModel[] = [];
    const page = await once(() => client.models.list({ signal: options.signal }));
    for (const m of page.data) {
      models.push({ id: m.id, ownedBy: typeof m.owned_by === "string" ? m.owned_by : null });
    }
    return models.sort((a, b) => a.id.localeCompare(b.id));
  } catch (error) {
    throw toRemoteError(error, endpoint);
  }
}

/** The statistics line: the local replies' format, saying where the token counts came from. */
export function remoteStatsLine(
  stats: GenerationStats,
  opts: {
    promptTokensKnown: boolean;
    tokenSource: "usage" | "counted";
    waited?: RemoteReply["waited"];
  },
): string {
  let line: string;
  if (opts.promptTokensKnown) {
    line = formatStats(stats);
  } else {
    // Without the prompt's length there is no prefill rate to give.
    const decoded = Math.max(0, stats.generatedTokens - 1);
    const rate = stats.decodeSeconds > 0 ? (decoded / stats.decodeSeconds).toFixed(1) : "0.0";
    line = `${rate} t/s, TTFT: ${(stats.ttftSeconds * 1000).toFixed(1)}ms, ${stats.generatedTokens} tokens`;
  }
  line += opts.tokenSource === "usage" ? " (server's count)" : " (counted from the stream)";
  if (opts.waited) {
    line += `, after waiting ${opts.waited.seconds} s (HTTP ${opts.waited.status})`;
  }
  return line;
}

const FINISH: Record<string, RemoteFinishReason> = {
  stop: "stop",
  length: "length",
  tool_calls: "stop",
  function_call: "stop",
  content_filter: "stop",
};

/**
 * Streams one chat completion. Resolves with whatever arrived, however it ended (stopped,
 * cut, timed out: `error` says which, `text` keeps what came); rejects only when nothing could
 * be asked (refused, 401, a second 429...), with a RemoteError.
 */
export async function streamChat(
  endpoint: Endpoint,
  request: RemoteChatRequest,
  handlers: RemoteChatHandlers = {},
  options: RemoteTimeouts & { signal?: AbortSignal } = {},
): Promise<RemoteReply> {
  const requestMs = options.requestMs ?? DEFAULT_REQUEST_MS;
  const idleMs = options.idleMs ?? DEFAULT_IDLE_MS;
  const maxWait = options.maxRetryWaitS ?? DEFAULT_MAX_RETRY_WAIT_S;
  const client = openaiClient(endpoint, requestMs);
  const body: OpenAI.Chat.ChatCompletionCreateParamsStreaming = {
    model: request.model,
    messages: request.messages,
    stream: true,
    stream_options: { include_usage: true },
    ...(request.temperature !== undefined ? { temperature: request.temperature } : {}),
    ...(request.topP !== undefined ? { top_p: request.topP } : {}),
    ...(request.maxTokens !== undefined ? { max_tokens: request.maxTokens } : {}),
    ...(request.stop && request.stop.length > 0 ? { stop: request.stop.slice(0, MAX_STOP) } : {}),
    ...(request.seed != null ? { seed: request.seed } : {}),
  };

  const reply: RemoteReply = {
    text: "",
    finishReason: "error",
    stats: null,
    tokenSource: "counted",
    promptTokensKnown: false,
    line: null,
    error: null,
    waited: null,
  };
  const cancelled = (): RemoteReply => ({ ...reply, finishReason: "cancelled" });

  // Ask, waiting once where the server says when to come back.
  let stream: Awaited<ReturnType<typeof client.chat.completions.create>> | undefined;
  const internal = new AbortController();
  const onAbort = (): void => internal.abort();
  options.signal?.addEventListener("abort", onAbort, { once: true });
  let startedAt: number;
  try {
    for (let attempt = 0; ; attempt++) {
      if (options.signal?.aborted) return cancelled();
      startedAt = performance.now();
      try {
        stream = await once(() =>
          client.chat.completions.create(body, { signal: internal.signal }),
        );
        break;
      } catch (error) {
        if (options.signal?.aborted) return cancelled();
        const e = toRemoteError(error, endpoint, request.model);
        const wait = e.retryAfterSeconds ?? (e.code === "remote_busy" ? 1 : null);
        const retryable = e.code === "remote_busy" || (e.status === 503 && wait !== null);
        if (attempt > 0 || !retryable || wait === null || wait > maxWait) throw e;
        reply.waited = { seconds: wait, status: e.status ?? 0 };
        handlers.onWait?.(wait, e);
        if (!(await sleep(wait * 1000, options.signal))) return cancelled();
      }
    }

    // Read the stream, watching for silence.
    let firstAt: number | null = null;
    let lastAt = 0;
    let deltas = 0;
    let usage: OpenAI.CompletionUsage | null = null;
    let finish: string | null = null;
    let idle = false;
    const onIdle = (): void => {
      idle = true;
      internal.abort();
    };
    let timer = setTimeout(onIdle, idleMs);
    const rearm = (): void => {
      clearTimeout(timer);
      timer = setTimeout(onIdle, idleMs);
    };
    try {
      for await (const chunk of stream) {
        rearm();
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices[0];
        if (!choice) continue;
        const text = choice.delta?.content ?? "";
        if (text !== "") {
          const now = performance.now();
          firstAt ??= now;
          lastAt = now;
          deltas++;
          reply.text += text;
          handlers.onText?.(text);
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    } catch (error) {
      if (!options.signal?.aborted && !idle) {
        // An error object inside the stream is the server's; anything else, the connection's.
        const fromServer =
          error instanceof OpenAI.APIError && !(error instanceof OpenAI.APIConnectionError);
        reply.error = fromServer
          ? toRemoteError(error, endpoint, request.model)
          : cutError(endpoint, error);
      }
    } finally {
      clearTimeout(timer);
    }
    if (idle) {
      reply.error = new RemoteError(
        `The server at ${endpoint.baseUrl} sent nothing for ${Math.round(idleMs / 1000)} s, so the reply was stopped${reply.text ? " (the text so far is kept)" : ""}. Retry.`,
        "remote_timeout",
      );
    } else if (!reply.error && !options.signal?.aborted && finish === null) {
      // The stream ended without a finish reason: the server closed it mid-reply.
      reply.error = cutError(endpoint, null);
    }

    reply.finishReason = options.signal?.aborted
      ? "cancelled"
      : reply.error
        ? "error"
        : (FINISH[finish ?? "stop"] ?? "stop");
    if (firstAt !== null) {
      reply.tokenSource = usage ? "usage" : "counted";
      reply.promptTokensKnown = usage !== null;
      reply.stats = {
        promptTokens: usage?.prompt_tokens ?? 0,
        generatedTokens: usage?.completion_tokens ?? deltas,
        ttftSeconds: (firstAt - startedAt) / 1000,
        decodeSeconds: (lastAt - firstAt) / 1000,
        peakMemoryBytes: null,
        cacheHitRate: null,
      };
      reply.line = remoteStatsLine(reply.stats, reply);
    }
    return reply;
  } finally {
    options.signal?.removeEventListener("abort", onAbort);
  }
}

function cutError(endpoint: Endpoint, error: unknown): RemoteError {
  const detail = error instanceof Error ? error.message : null;
  return new RemoteError(
    `The connection to ${endpoint.baseUrl} was cut before the reply ended; the text so far is kept. Retry to ask again.`,
    "remote_cut",
    null,
    null,
    detail,
  );
}
