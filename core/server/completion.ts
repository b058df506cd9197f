/**
 * One completion request, either endpoint: its generation settings from the request, its turn in
 * the queue, the generation (core/generation's loop), and the answer in OpenAI's format, whole
 * or streamed as server-sent events. A client that goes away cancels its generation or leaves
 * the queue.
 */
import { randomUUID } from "node:crypto";
import type { FastifyReply } from "fastify";
import { generate, type GenerationRequest, type GenerationResult } from "../generation/generate.ts";
import { unknownModel, type ServerContext } from "./context.ts";
import { ApiError, toApiError } from "./errors.ts";
import { QueueAbortedError, QueueFullError } from "./queue.ts";
import type { ChatRequest, CompletionRequest } from "./schemas.ts";
import type { ToolSyntax } from "../models/index.ts";
import { parseToolCalls, type ParsedToolCalls } from "./tools.ts";

export interface Prepared {
  request: GenerationRequest;
  stream: boolean;
  includeUsage: boolean;
  /** Set when the output may hold tool calls: the declared names and the prompt's call prefix. */
  tools: { syntax: ToolSyntax; names: string[]; prefix: string } | null;
}

type Result = GenerationResult<ParsedToolCalls>;

/** The answer to a request the app's user cancelled (its client is still waiting). */
function cancelledByOwner(): ApiError {
  return new ApiError(
    503,
    "the request was cancelled in the Redwing app",
    "service_unavailable",
    "request_cancelled",
  );
}

/** Seconds a client is asked to wait while the engine restarts or loads (Retry-After). */
const RETRY_AFTER_S = 2;

/** Sampling, stop strings and the token budget from a request of either endpoint. */
export function prepare(
  ctx: ServerContext,
  body: ChatRequest | CompletionRequest,
  tokens: number[],
  maxTokens: number | null | undefined,
  tools: Prepared["tools"],
): Prepared {
  if (body.model !== ctx.modelId) throw unknownModel(ctx, body.model);
  const { context } = ctx;
  if (tokens.length >= context) {
    throw new ApiError(
      400,
      `the prompt has ${tokens.length} tokens, but the context holds ${context} (prompt plus output); shorten it`,
      "invalid_request_error",
      "context_length_exceeded",
      "messages" in body ? "messages" : "prompt",
    );
  }
  const room = context - tokens.length;
  const d = ctx.defaults();
  const stop = body.stop === null || body.stop === undefined ? [] : [body.stop].flat();
  return {
    request: {
      tokens,
      maxNewTokens: Math.min(maxTokens ?? d.maxTokens ?? room, room),
      sampling: {
        temperature: body.temperature ?? d.temperature,
        topK: body.top_k ?? d.topK,
        topP: body.top_p ?? d.topP,
        repetitionPenalty: body.repetition_penalty ?? d.repetitionPenalty,
        seed: body.seed,
      },
      stopStrings: stop,
      stopIds: tools ? [...ctx.stopIds, ...ctx.toolStopIds] : ctx.stopIds,
      ignoreEos: body.ignore_eos,
      keepSpecial: tools !== null,
    },
    stream: body.stream === true,
    includeUsage: body.stream_options?.include_usage === true,
    tools,
  };
}

/** OpenAI's finish reason: an end-of-turn id and a stop string are both "stop". */
function finishReasonOf(r: Result): "stop" | "length" {
  return r.finishReason === "length" ? "length" : "stop";
}

function usageOf(r: Result): Record<string, unknown> {
  const completion = r.tokens.length;
  return {
    prompt_tokens: r.promptTokens,
    completion_tokens: completion,
    total_tokens: r.promptTokens + completion,
    prompt_tokens_details: { cached_tokens: r.cachedTokens },
  };
}

/** How an endpoint writes its answers. */
export interface Formatter {
  /** The id prefix ("chatcmpl", "cmpl"). */
  idPrefix: string;
  object: string;
  chunkObject: string;
  /** The first streamed chunk's choice (chat: the assistant role), or null. */
  opening(): Record<string, unknown> | null;
  piece(text: string): Record<string, unknown>;
  closing(result: Result): Record<string, unknown>;
  whole(result: Result): Record<string, unknown>;
}

export const chatFormat: Formatter = {
  idPrefix: "chatcmpl",
  object: "chat.completion",
  chunkObject: "chat.completion.chunk",
  opening: () => ({
    index: 0,
    delta: { role: "assistant", content: "" },
    logprobs: null,
    finish_reason: null,
  }),
  piece: (text) => ({ index: 0, delta: { content: text }, logprobs: null, finish_reason: null }),
  closing: (r) => {
    const calls = r.toolCalls;
    return {
      index: 0,
      delta: calls ? { tool_calls: calls.calls.map((c, index) => ({ index, ...c })) } : {},
      logprobs: null,
      finish_reason: calls ? "tool_calls" : finishReasonOf(r),
    };
  },
  whole: (r) => {
    const calls = r.toolCalls;
    return {
      index: 0,
      message: {
        role: "assistant",
        content: calls ? calls.content || null : r.text,
        refusal: null,
        ...(calls ? { tool_calls: calls.calls } : {}),
      },
      logprobs: null,
      finish_reason: calls ? "tool_calls" : finishReasonOf(r),
    };
  },
};

export const completionFormat: Formatter = {
  idPrefix: "cmpl",
  object: "text_completion",
  chunkObject: "text_completion",
  opening: () => null,
  piece: (text) => ({ index: 0, text, logprobs: null, finish_reason: null }),
  closing: (r) => ({ index: 0, text: "", logprobs: null, finish_reason: finishReasonOf(r) }),
  whole: (r) => ({ index: 0, text: r.text, logprobs: null, finish_reason: finishReasonOf(r) }),
};

/** Runs a prepared request to its answer (or to nothing, when the client went away). */
export async function runCompletion(
  ctx: ServerContext,
  reply: FastifyReply,
  prepared: Prepared,
  format: Formatter,
): Promise<unknown> {
  const unavailable = ctx.unavailable();
  if (unavailable !== null) {
    throw new ApiError(
      503,
      `${unavailable}; retry shortly`,
      "service_unavailable",
      "engine_unavailable",
      null,
      { "retry-after": String(RETRY_AFTER_S) },
    );
  }
  const abort = new AbortController();
  const request = reply.request;
  const bookId = ctx.requests.add(
    {
      endpoint: format === completionFormat ? "completion" : "chat",
      client: `${request.ip}:${request.socket.remotePort ?? 0}`,
      maxTokens: prepared.request.maxNewTokens,
    },
    abort,
  );
  try {
    return await runBooked(ctx, reply, prepared, format, abort, bookId);
  } finally {
    ctx.requests.remove(bookId);
  }
}

async function runBooked(
  ctx: ServerContext,
  reply: FastifyReply,
  prepared: Prepared,
  format: Formatter,
  abort: AbortController,
  bookId: string,
): Promise<unknown> {
  const { metrics, queue } = ctx;
  metrics.requests++;
  // The response closing before we ended it means the client went away: cancel.
  reply.raw.on("close", () => {
    if (!reply.raw.writableEnded) abort.abort();
  });
  const queuedAt = performance.now();
  let release: () => void;
  try {
    release = await queue.acquire(abort.signal);
  } catch (error) {
    if (error instanceof QueueFullError) {
      metrics.rejected++;
      throw new ApiError(429, error.message, "rate_limit_error", "queue_full", null, {
        "retry-after": "1",
      });
    }
    if (error instanceof QueueAbortedError) {
      metrics.cancelled++;
      if (ctx.requests.cancelled(bookId)) throw cancelledByOwner();
      return reply.hijack(); // nobody to answer
    }
    throw error;
  }
  ctx.requests.running(bookId);
  const waited = performance.now() - queuedAt;
  metrics.queueWaitMsTotal += waited;
  metrics.queueWaitMsMax = Math.max(metrics.queueWaitMsMax, waited);
  const id = `${format.idPrefix}-${randomUUID()}`;
  const createdAt = Math.floor(Date.now() / 1000);
  const envelope = (object: string): Record<string, unknown> => ({
    id,
    object,
    created: createdAt,
    model: ctx.modelId,
    system_fingerprint: null,
  });
  const tools = prepared.tools;
  const finished = (result: Result): void => {
    metrics.completed++;
    metrics.completionTokens += result.tokens.length;
  };
  try {
    const events = generate(ctx.engine(), ctx.tokenizer, prepared.request, {
      signal: abort.signal,
      // With tools, text is held until the end: it may turn out to be a tool call. Malformed
      // calls fail closed (throw). Stop tokens (`<turn|>`, `<|tool_response>`) are not in the
      // text: one may have closed the call.
      ...(tools
        ? {
            parseToolCalls: (text: string, endedOnStop: boolean) =>
              parseToolCalls(tools.syntax, tools.prefix + text, tools.names, {
                endedOnStopToken: endedOnStop,
              }),
          }
        : {}),
    });
    if (!prepared.stream) {
      let result: Result | null = null;
      for await (const event of events) {
        if (event.type === "tokens") ctx.requests.progress(bookId, event.count);
        else if (event.type === "done") result = event.result;
      }
      if (!result || result.finishReason === "cancelled") {
        metrics.cancelled++;
        if (ctx.requests.cancelled(bookId)) throw cancelledByOwner();
        return reply.hijack();
      }
      finished(result);
      return {
        ...envelope(format.object),
        choices: [format.whole(result)],
        usage: usageOf(result),
      };
    }
    // Streamed: the first event comes before the headers, so that an engine failure during
    // prefill is still an HTTP error with its status.
    const first = await events.next();
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(200, {
      ...(reply.getHeaders() as Record<string, string>),
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    });
    const usageField = prepared.includeUsage ? { usage: null } : {};
    const send = (choice: Record<string, unknown>): void => {
      if (raw.destroyed) return; // the client is gone; the abort is under way
      raw.write(
        `data: ${JSON.stringify({ ...envelope(format.chunkObject), choices: [choice], ...usageField })}\n\n`,
      );
    };
    const opening = format.opening();
    if (opening) send(opening);
    try {
      let result: Result | null = null;
      for (let next = first; !next.done; next = await events.next()) {
        const event = next.value;
        if (event.type === "text") send(format.piece(event.text));
        else if (event.type === "tokens") ctx.requests.progress(bookId, event.count);
        else if (event.type === "done") result = event.result;
      }
      if (!result || result.finishReason === "cancelled") {
        metrics.cancelled++;
        if (ctx.requests.cancelled(bookId) && !raw.destroyed) {
          raw.write(`data: ${JSON.stringify(cancelledByOwner().body())}\n\n`);
        }
        raw.end();
        return;
      }
      finished(result);
      send(format.closing(result));
      if (prepared.includeUsage) {
        raw.write(
          `data: ${JSON.stringify({ ...envelope(format.chunkObject), choices: [], usage: usageOf(result) })}\n\n`,
        );
      }
      raw.write("data: [DONE]\n\n");
    } catch (error) {
      // Headers are gone: the error goes in the stream, as OpenAI does.
      if (!raw.destroyed) raw.write(`data: ${JSON.stringify(toApiError(error).body())}\n\n`);
    }
    raw.end();
    return;
  } finally {
    release();
  }
}
