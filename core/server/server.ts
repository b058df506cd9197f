/**
 * Redwing's OpenAI-compatible HTTP server (`redwing serve`): GET /health, GET /v1/models,
 * POST /v1/chat/completions, POST /v1/completions, on fastify.
 *
 * - One engine (the decode service, through core/engine's EngineClient, which restarts it after
 *   a crash), many clients: requests take turns through a bounded queue (429 beyond it); a client
 *   that disconnects cancels its generation or leaves the queue. Consecutive requests that share
 *   a prefix reuse the service's KV cache (usage.prompt_tokens_details.cached_tokens).
 * - Loopback only unless `allowRemote`, which also needs an API key (Bearer, every request).
 *   No CORS headers unless `corsOrigin` is set.
 * - Errors use OpenAI's error object; a prompt that does not fit the context is refused (400),
 *   never truncated.
 */
import { randomUUID, timingSafeEqual } from "node:crypto";
import type { AddressInfo } from "node:net";
import { basename } from "node:path";
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import type { ZodType } from "zod";
import { resolveModel, type ResolvedModel } from "../chat/model.ts";
import { ChatTemplate, loadChatTemplate, type ChatMessage } from "../chat/template.ts";
import { loadTokenizer, type ChatTokenizer } from "../chat/tokenizer.ts";
import { DEMO_MODEL_NAME } from "../demo/demo.ts";
import { EngineClient, type EngineClientOptions, type Sampling } from "../engine/index.ts";
import { UserError } from "../errors.ts";
import { ApiError, toApiError } from "./errors.ts";
import { generate, type GenerationParams, type GenerationSummary } from "./generate.ts";
import { EngineQueue, QueueAbortedError, QueueFullError } from "./queue.ts";
import {
  ChatRequestSchema,
  CompletionRequestSchema,
  contentText,
  type ChatRequest,
  type CompletionRequest,
} from "./schemas.ts";
import {
  parseToolCalls,
  renderToolPrompt,
  TOOL_CALL_OPEN,
  toolOutputPrefix,
  type ParsedToolCalls,
} from "./tools.ts";

export const DEFAULT_HOST = "127.0.0.1";
export const DEFAULT_PORT = 8080;
export const DEFAULT_QUEUE_LIMIT = 4;
export const DEFAULT_BODY_LIMIT = 4 * 1024 * 1024;

export interface ServerOptions {
  host?: string;
  /** 0: an ephemeral port. */
  port?: number;
  /** Needed to bind to anything but loopback (and then an API key is required too). */
  allowRemote?: boolean;
  apiKey?: string;
  /** The one origin allowed by CORS ("*": any); default none (no CORS headers). */
  corsOrigin?: string;
  /**
   * On loopback, Host header names accepted besides localhost, 127.0.0.1 and [::1] at the
   * server's port (`--allow-host`): a name, or name:port. Everything else is refused (421), so
   * that a web page cannot reach the server through DNS rebinding.
   */
  allowedHosts?: string[];
  /**
   * On loopback, browser origins accepted besides the server's own loopback origins and
   * `corsOrigin` (`--allow-origin`), e.g. "http://localhost:3000". Others are refused (403).
   */
  allowedOrigins?: string[];
  /** Requests that may wait behind the running one (default 4). */
  queueLimit?: number;
  /** Bytes (default 4 MiB). */
  bodyLimit?: number;
  /** Model name or directory (default: the demo model). */
  model?: string;
  /** KV positions (prompt plus output), default 4096. */
  context?: number;
  threads?: number;
  /** Where the engine runs the model (docs/gpu.md); default the CPU. */
  backend?: "cpu" | "metal" | "vulkan" | "auto";
  expertCacheSlots?: number;
  memoryBudget?: number;
  engine?: EngineClientOptions;
  /**
   * An engine that someone else owns (the desktop app's): the server neither starts, loads nor
   * closes it, and takes turns with the owner's own generations through `queue`. The model must
   * be loaded already (`model` names its directory, `context` its KV size).
   */
  shared?: SharedEngine;
  /** Called with one line per request (method, path, status, ms). */
  log?: (line: string) => void;
}

/** What the server needs of its admission queue: its own, or the one an owner shares. */
export type AdmissionQueue = Pick<EngineQueue, "acquire" | "active" | "waiting" | "limit">;

export interface SharedEngine {
  /** The engine client to use now (the owner may replace it, e.g. after a crash). */
  client: () => EngineClient;
  /** Turns shared with the owner's generations (and loads); `acquire(signal)` is one request. */
  queue: AdmissionQueue;
  /** The loaded model's tokenizer and chat template, when the owner has them already. */
  text?: { tokenizer: ChatTokenizer; template: string };
}

export interface ServerMetrics {
  requests: number;
  completed: number;
  cancelled: number;
  rejected: number;
  completionTokens: number;
  queueWaitMsTotal: number;
  queueWaitMsMax: number;
}

export interface RedwingServer {
  url: string;
  modelId: string;
  app: FastifyInstance;
  engine: EngineClient;
  queue: AdmissionQueue;
  metrics: ServerMetrics;
  close(): Promise<void>;
}

const LOOPBACK = new Set(["127.0.0.1", "::1", "localhost"]);

export function isLoopbackHost(host: string): boolean {
  return LOOPBACK.has(host) || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** Checks the binding rules before anything starts; UserErrors say which flag is missing. */
export function checkBinding(options: ServerOptions): void {
  const host = options.host ?? DEFAULT_HOST;
  if (isLoopbackHost(host)) return;
  if (!options.allowRemote) {
    throw new UserError(
      `binding to ${host} exposes the server beyond this machine; pass --allow-remote (with --api-key) to do so`,
      "remote_not_allowed",
    );
  }
  if (!options.apiKey) {
    throw new UserError(
      `binding to ${host} needs an API key: pass --api-key or set REDWING_API_KEY`,
      "api_key_required",
    );
  }
}

const LOOPBACK_NAMES = new Set(["localhost", "127.0.0.1", "[::1]"]);

/**
 * Whether a Host header names this server: a loopback name at its port, or one the user allowed
 * (with or without a port). Case-insensitive, as DNS names are.
 */
export function hostAllowed(header: string | undefined, port: number, allowed: string[]): boolean {
  if (header === undefined) return false;
  const value = header.trim().toLowerCase();
  const m = /^(\[[0-9a-f:.]+\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(value);
  if (!m) return false;
  const name = m[1]!;
  const samePort = m[2] === undefined ? port === 80 : Number(m[2]) === port;
  if (LOOPBACK_NAMES.has(name) && samePort) return true;
  return allowed.some((a) => {
    const want = a.trim().toLowerCase();
    return want === value || (want === name && samePort);
  });
}

/** Whether a browser Origin may call: none (not a browser), this server's own, or one allowed. */
export function originAllowed(
  origin: string | undefined,
  port: number,
  allowed: string[],
): boolean {
  if (origin === undefined) return true;
  const value = origin.trim().toLowerCase().replace(/\/$/, "");
  if (allowed.some((a) => a.trim().toLowerCase().replace(/\/$/, "") === value)) return true;
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return false;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return false;
  if (url.origin !== value) return false; // a path, credentials or an odd spelling
  const urlPort = url.port === "" ? (url.protocol === "https:" ? 443 : 80) : Number(url.port);
  return LOOPBACK_NAMES.has(url.hostname) && urlPort === port;
}

function modelIdOf(arg: string | undefined, model: ResolvedModel): string {
  if (arg === undefined || arg === DEMO_MODEL_NAME) return DEMO_MODEL_NAME;
  if (arg.includes("/") || arg.includes("\\")) return basename(model.dir);
  return arg;
}

function sameSecret(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** A request body checked against `schema`: the data, or an ApiError 400 naming the field. */
export function parseBody<T>(schema: ZodType<T>, body: unknown): T {
  if (body === undefined || body === null || typeof body !== "object") {
    throw new ApiError(400, "the request body must be a JSON object", "invalid_request_error");
  }
  const result = schema.safeParse(body);
  if (!result.success) {
    const issue = result.error.issues[0]!;
    const param = issue.path.map(String).join(".") || null;
    throw new ApiError(
      400,
      `invalid request: ${param ?? "body"}: ${issue.message}`,
      "invalid_request_error",
      "invalid_value",
      param,
    );
  }
  return result.data;
}

interface Prepared {
  params: GenerationParams;
  stream: boolean;
  includeUsage: boolean;
  /** Set when the output may hold tool calls: the declared names and the prompt's call prefix. */
  tools: { names: string[]; prefix: string } | null;
}

export async function startServer(options: ServerOptions = {}): Promise<RedwingServer> {
  checkBinding(options);
  const host = options.host ?? DEFAULT_HOST;
  const context = options.context ?? 4096;
  const model = await resolveModel(options.model);
  const modelId = modelIdOf(options.model, model);
  const shared = options.shared;
  const tokenizer: ChatTokenizer = shared?.text?.tokenizer ?? (await loadTokenizer(model.dir));
  const template = new ChatTemplate(
    shared?.text?.template ??
      (await loadChatTemplate(
        model.dir,
        tokenizer.configTemplate,
        model.manifest.architecture.family,
      )),
  );
  const stopIds = model.manifest.architecture.eos_token_ids;
  // Gemma 4 hands over to the tool with `<|tool_response>`: the end of a tool-calling turn.
  const toolStopIds = [tokenizer.tokenId("<|tool_response>")].filter((id) => id !== null);
  const owned = shared ? null : await startOwnEngine(options, model.dir, context);
  const engineOf = (): EngineClient => (shared ? shared.client() : owned!);
  const closeOwned = async (): Promise<void> => {
    await owned?.close();
  };
  const created = Math.floor(Date.now() / 1000);
  const queue: AdmissionQueue =
    shared?.queue ?? new EngineQueue(options.queueLimit ?? DEFAULT_QUEUE_LIMIT);
  const metrics: ServerMetrics = {
    requests: 0,
    completed: 0,
    cancelled: 0,
    rejected: 0,
    completionTokens: 0,
    queueWaitMsTotal: 0,
    queueWaitMsMax: 0,
  };

  const app = Fastify({ logger: false, bodyLimit: options.bodyLimit ?? DEFAULT_BODY_LIMIT });

  app.setErrorHandler((error, _request, reply) => {
    const api = toApiError(error);
    void reply.code(api.status).headers(api.headers).send(api.body());
  });
  app.setNotFoundHandler((request, reply) => {
    void reply
      .code(404)
      .send(
        new ApiError(
          404,
          `no route ${request.method} ${request.url}`,
          "not_found_error",
          "unknown_url",
        ).body(),
      );
  });

  // Set once listening (port 0 picks one).
  let listeningPort = options.port ?? DEFAULT_PORT;
  const onLoopback = isLoopbackHost(host);
  // The address it is bound to names it too (127.0.0.2, say).
  const allowedHosts = [...(options.allowedHosts ?? []), host.includes(":") ? `[${host}]` : host];
  const allowedOrigins = [
    ...(options.allowedOrigins ?? []),
    ...(options.corsOrigin && options.corsOrigin !== "*" ? [options.corsOrigin] : []),
  ];

  app.addHook("onRequest", async (request, reply) => {
    // On loopback the server has no key by default: a web page must not reach it by giving a
    // hostname of its own the address 127.0.0.1 (DNS rebinding) or by posting cross-site.
    if (onLoopback) {
      const hostHeader = request.headers.host;
      if (!hostAllowed(hostHeader, listeningPort, allowedHosts)) {
        void reply
          .code(421)
          .send(
            new ApiError(
              421,
              `this server answers only requests for localhost:${listeningPort} or 127.0.0.1:${listeningPort}, not for host "${hostHeader ?? ""}" (start it with --allow-host ${(hostHeader ?? "NAME").split(":")[0]} to allow that name)`,
              "invalid_request_error",
              "host_not_allowed",
            ).body(),
          );
        return reply;
      }
      const origin = request.headers.origin;
      if (options.corsOrigin !== "*" && !originAllowed(origin, listeningPort, allowedOrigins)) {
        void reply
          .code(403)
          .send(
            new ApiError(
              403,
              `requests from the web page at ${origin} are not allowed (start the server with --allow-origin ${origin} to allow it)`,
              "permission_error",
              "origin_not_allowed",
            ).body(),
          );
        return reply;
      }
    }
    const cors = options.corsOrigin;
    if (cors) {
      const origin = request.headers.origin;
      if (cors === "*" || origin === cors) {
        void reply.header("access-control-allow-origin", cors === "*" ? "*" : cors);
        void reply.header("vary", "Origin");
      }
      if (request.method === "OPTIONS") {
        void reply
          .header("access-control-allow-methods", "GET, POST, OPTIONS")
          .header("access-control-allow-headers", "authorization, content-type")
          .header("access-control-max-age", "600")
          .code(204)
          .send();
        return reply;
      }
    }
    if (options.apiKey) {
      const auth = request.headers.authorization ?? "";
      const m = /^Bearer\s+(.+)$/i.exec(auth);
      if (!m || !sameSecret(m[1]!.trim(), options.apiKey)) {
        void reply
          .code(401)
          .send(
            new ApiError(
              401,
              "missing or wrong API key (send Authorization: Bearer <key>)",
              "authentication_error",
              "invalid_api_key",
            ).body(),
          );
        return reply;
      }
    }
    return undefined;
  });
  if (options.log) {
    const log = options.log;
    app.addHook("onResponse", async (request, reply) => {
      log(
        `${request.method} ${request.url} ${reply.statusCode} ${reply.elapsedTime.toFixed(0)} ms`,
      );
    });
  }

  app.get("/health", async () => ({
    status: "ok",
    model: modelId,
    engine_pid: engineOf().pid ?? null,
    queue: { active: queue.active, waiting: queue.waiting, limit: queue.limit },
    metrics,
  }));

  const modelObject = { id: modelId, object: "model", created, owned_by: "redwing" };
  app.get("/v1/models", async () => ({ object: "list", data: [modelObject] }));
  app.get<{ Params: { id: string } }>("/v1/models/:id", async (request) => {
    if (request.params.id !== modelId) throw unknownModel(request.params.id);
    return modelObject;
  });

  function unknownModel(name: string): ApiError {
    return new ApiError(
      404,
      `the model "${name}" does not exist; this server serves "${modelId}"`,
      "not_found_error",
      "model_not_found",
      "model",
    );
  }

  /**
   * Refuses a prompt that cannot fit the context before it is tokenized: its length in
   * characters bounds its length in tokens (see ChatTokenizer.maxCharsFor), and a check costs
   * nothing where tokenizing megabytes would cost seconds.
   */
  function checkPromptLength(chars: number, param: string): void {
    const limit = tokenizer.maxCharsFor(context);
    if (chars > limit) {
      throw new ApiError(
        400,
        `the prompt has ${chars} characters, more than the ${context} tokens of the context can hold (at most ${limit} characters); shorten it`,
        "invalid_request_error",
        "context_length_exceeded",
        param,
      );
    }
  }

  /** Sampling, stop strings and the token budget shared by both endpoints. */
  function prepare(
    body: ChatRequest | CompletionRequest,
    tokens: number[],
    maxTokens: number | null | undefined,
    tools: Prepared["tools"],
  ): Prepared {
    if (body.model !== modelId) throw unknownModel(body.model);
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
    const sampling: Sampling = {
      temperature: body.temperature ?? 1,
      top_p: body.top_p ?? 1,
      top_k: body.top_k ?? 0,
      repetition_penalty: body.repetition_penalty ?? 1,
    };
    if (body.seed !== null && body.seed !== undefined) sampling.seed = body.seed;
    const stop = body.stop === null || body.stop === undefined ? [] : [body.stop].flat();
    return {
      params: {
        tokens,
        maxNew: Math.min(maxTokens ?? room, room),
        sampling,
        stopStrings: stop,
        stopIds: tools ? [...stopIds, ...toolStopIds] : stopIds,
        ignoreEos: body.ignore_eos,
        keepSpecial: tools !== null,
      },
      stream: body.stream === true,
      includeUsage: body.stream_options?.include_usage === true,
      tools,
    };
  }

  function usageOf(s: GenerationSummary): Record<string, unknown> {
    return {
      prompt_tokens: s.promptTokens,
      completion_tokens: s.completionTokens,
      total_tokens: s.promptTokens + s.completionTokens,
      prompt_tokens_details: { cached_tokens: s.cachedTokens },
    };
  }

  interface Formatter {
    object: string;
    chunkObject: string;
    /** The first streamed chunk's choice (chat: the assistant role), or null. */
    opening(): Record<string, unknown> | null;
    piece(text: string): Record<string, unknown>;
    closing(summary: GenerationSummary, calls: ParsedToolCalls | null): Record<string, unknown>;
    whole(summary: GenerationSummary, calls: ParsedToolCalls | null): Record<string, unknown>;
  }

  const chatFormat: Formatter = {
    object: "chat.completion",
    chunkObject: "chat.completion.chunk",
    opening: () => ({
      index: 0,
      delta: { role: "assistant", content: "" },
      logprobs: null,
      finish_reason: null,
    }),
    piece: (text) => ({ index: 0, delta: { content: text }, logprobs: null, finish_reason: null }),
    closing: (s, calls) => ({
      index: 0,
      delta: calls ? { tool_calls: calls.calls.map((c, index) => ({ index, ...c })) } : {},
      logprobs: null,
      finish_reason: calls ? "tool_calls" : s.finishReason,
    }),
    whole: (s, calls) => ({
      index: 0,
      message: {
        role: "assistant",
        content: calls ? calls.content || null : s.text,
        refusal: null,
        ...(calls ? { tool_calls: calls.calls } : {}),
      },
      logprobs: null,
      finish_reason: calls ? "tool_calls" : s.finishReason,
    }),
  };
  const completionFormat: Formatter = {
    object: "text_completion",
    chunkObject: "text_completion",
    opening: () => null,
    piece: (text) => ({ index: 0, text, logprobs: null, finish_reason: null }),
    closing: (s) => ({ index: 0, text: "", logprobs: null, finish_reason: s.finishReason }),
    whole: (s) => ({ index: 0, text: s.text, logprobs: null, finish_reason: s.finishReason }),
  };

  async function run(
    request: FastifyRequest,
    reply: FastifyReply,
    prepared: Prepared,
    format: Formatter,
  ): Promise<unknown> {
    metrics.requests++;
    const abort = new AbortController();
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
        return reply.hijack(); // nobody to answer
      }
      throw error;
    }
    const waited = performance.now() - queuedAt;
    metrics.queueWaitMsTotal += waited;
    metrics.queueWaitMsMax = Math.max(metrics.queueWaitMsMax, waited);
    const id = `${format === chatFormat ? "chatcmpl" : "cmpl"}-${randomUUID()}`;
    const createdAt = Math.floor(Date.now() / 1000);
    const envelope = (object: string): Record<string, unknown> => ({
      id,
      object,
      created: createdAt,
      model: modelId,
      system_fingerprint: null,
    });
    try {
      const events = generate(engineOf(), tokenizer, prepared.params, abort.signal);
      if (!prepared.stream) {
        let summary: GenerationSummary | null = null;
        for await (const event of events) if (event.type === "done") summary = event.summary;
        if (!summary || summary.finishReason === "cancelled") {
          metrics.cancelled++;
          return reply.hijack();
        }
        finishMetrics(summary);
        const calls = prepared.tools ? toolCallsOf(summary, prepared.tools) : null;
        return {
          ...envelope(format.object),
          choices: [format.whole(summary, calls)],
          usage: usageOf(summary),
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
      // With tools, text is held until the end: it may turn out to be a tool call.
      let held = "";
      const onText = (text: string): void => {
        if (prepared.tools) held += text;
        else send(format.piece(text));
      };
      try {
        let summary: GenerationSummary | null = null;
        let result = first;
        while (!result.done) {
          const event = result.value;
          if (event.type === "text") onText(event.text);
          else summary = event.summary;
          result = await events.next();
        }
        if (!summary || summary.finishReason === "cancelled") {
          metrics.cancelled++;
          raw.end();
          return;
        }
        finishMetrics(summary);
        const calls = prepared.tools ? toolCallsOf(summary, prepared.tools) : null;
        if (prepared.tools && !calls && held) send(format.piece(held));
        else if (calls?.content) send(format.piece(calls.content));
        send(format.closing(summary, calls));
        if (prepared.includeUsage) {
          raw.write(
            `data: ${JSON.stringify({ ...envelope(format.chunkObject), choices: [], usage: usageOf(summary) })}\n\n`,
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

  function finishMetrics(summary: GenerationSummary): void {
    metrics.completed++;
    metrics.completionTokens += summary.completionTokens;
  }

  /** A tool call in the output, or null for plain text; malformed calls fail closed (throw). */
  function toolCallsOf(
    summary: GenerationSummary,
    tools: NonNullable<Prepared["tools"]>,
  ): ParsedToolCalls | null {
    // Stop tokens (`<turn|>`, `<|tool_response>`) are not in the text: one may have closed the call.
    return parseToolCalls(tools.prefix + summary.text, tools.names, {
      endedOnStopToken: summary.finishReason === "stop",
    });
  }

  app.post("/v1/chat/completions", async (request, reply) => {
    const body = parseBody(ChatRequestSchema, request.body);
    const toolsOn = (body.tools?.length ?? 0) > 0 && body.tool_choice !== "none";
    if (toolsOn && tokenizer.tokenId(TOOL_CALL_OPEN) === null) {
      throw new ApiError(
        400,
        `the model "${modelId}" has no tool-call tokens; tools need a Gemma 4 model`,
        "invalid_request_error",
        "tools_unsupported",
        "tools",
      );
    }
    const choice = body.tool_choice;
    if (toolsOn && choice && typeof choice === "object") {
      if (!body.tools!.some((t) => t.function.name === choice.function.name)) {
        throw new ApiError(
          400,
          `tool_choice names "${choice.function.name}", which is not in tools`,
          "invalid_request_error",
          "invalid_value",
          "tool_choice",
        );
      }
    }
    // Tool results are placed by the template module (inside the model turn for Gemma 4).
    const messages = body.messages.map((m): ChatMessage => {
      const base: ChatMessage = {
        role: m.role === "developer" ? "system" : m.role,
        content: contentText(m.content),
      };
      if (m.role === "assistant" && m.tool_calls) base.tool_calls = m.tool_calls;
      if (m.role === "tool") base.tool_call_id = m.tool_call_id;
      return base;
    });
    checkPromptLength(
      messages.reduce((n, m) => n + (m.content as string).length, 0),
      "messages",
    );
    let text: string;
    try {
      text = template.render(messages, {
        bosToken: tokenizer.bosToken,
        eosToken: tokenizer.eosToken,
        ...(toolsOn ? { tools: body.tools } : {}),
      });
    } catch (error) {
      throw new ApiError(
        400,
        `the model's chat template cannot render these messages: ${(error as Error).message}`,
        "invalid_request_error",
        "template_error",
        "messages",
      );
    }
    if (toolsOn) text = renderToolPrompt(text, body.tools ?? [], body.tool_choice);
    checkPromptLength(text.length, "messages");
    const tokens = await tokenizer.encodeAsync(text, { addBos: true });
    const prepared = prepare(
      body,
      tokens,
      body.max_completion_tokens ?? body.max_tokens,
      toolsOn
        ? { names: body.tools!.map((t) => t.function.name), prefix: toolOutputPrefix(choice) }
        : null,
    );
    return run(request, reply, prepared, chatFormat);
  });

  app.post("/v1/completions", async (request, reply) => {
    const body = parseBody(CompletionRequestSchema, request.body);
    const prompt = typeof body.prompt === "string" ? body.prompt : body.prompt[0]!;
    checkPromptLength(prompt.length, "prompt");
    const tokens = await tokenizer.encodeAsync(prompt, { addBos: true });
    return run(request, reply, prepare(body, tokens, body.max_tokens, null), completionFormat);
  });

  let address: AddressInfo;
  try {
    await app.listen({ host, port: options.port ?? DEFAULT_PORT });
    address = app.server.address() as AddressInfo;
    listeningPort = address.port;
  } catch (error) {
    await closeOwned();
    throw new UserError(
      `cannot listen on ${host}:${options.port ?? DEFAULT_PORT}: ${(error as Error).message}`,
      "listen_failed",
    );
  }
  const shownHost = address.family === "IPv6" ? `[${address.address}]` : address.address;
  return {
    url: `http://${shownHost}:${address.port}`,
    modelId,
    app,
    get engine() {
      return engineOf();
    },
    queue,
    metrics,
    async close() {
      await app.close();
      await closeOwned();
      if (!shared?.text) await tokenizer.close();
    },
  };
}

/** The server's own engine (`redwing serve`): started, restarted after crashes, loaded. */
async function startOwnEngine(
  options: ServerOptions,
  modelDir: string,
  context: number,
): Promise<EngineClient> {
  const engine = await EngineClient.start({
    restart: { initialDelayMs: 100, maxDelayMs: 2000 },
    ...options.engine,
  });
  try {
    await engine.load({
      model: modelDir,
      context,
      threads: options.threads,
      backend: options.backend,
      expert_cache_slots:
        options.expertCacheSlots ?? (options.memoryBudget === undefined ? 16 : undefined),
      memory_budget: options.memoryBudget,
    });
  } catch (error) {
    await engine.close();
    throw error;
  }
  return engine;
}
