/**
 * What the routes share: the served model's text side, the engine, the admission queue and the
 * metrics. Built once by startServer (server.ts).
 */
import type { ZodType } from "zod";
import type { ToolSyntax } from "../models/index.ts";
import type { ChatTemplate } from "../chat/template.ts";
import type { ChatTokenizer } from "../chat/tokenizer.ts";
import type { EngineClient } from "../engine/index.ts";
import { ApiError } from "./errors.ts";
import type { EngineQueue } from "./queue.ts";
import type { RequestBook } from "./requests.ts";

/** What the server needs of its admission queue: its own, or the one an owner shares. */
export type AdmissionQueue = Pick<EngineQueue, "acquire" | "active" | "waiting" | "limit">;

export interface ServerMetrics {
  requests: number;
  completed: number;
  cancelled: number;
  rejected: number;
  completionTokens: number;
  queueWaitMsTotal: number;
  queueWaitMsMax: number;
}

/**
 * What a request gets for a field it leaves out. `redwing serve`: OpenAI's defaults and no cap
 * beyond the context; in the app: its current Tuning values and its max new tokens.
 */
export interface RequestDefaults {
  temperature: number;
  topK: number;
  topP: number;
  repetitionPenalty: number;
  /** Most tokens a request without `max_tokens` may generate; null: what the context leaves. */
  maxTokens: number | null;
}

export interface ServerContext {
  /** The name clients use for the model. */
  modelId: string;
  /** Unix seconds the server started (the model object's `created`). */
  created: number;
  /** KV positions: prompt plus output. */
  context: number;
  tokenizer: ChatTokenizer;
  template: ChatTemplate;
  /** End-of-turn ids of the model. */
  stopIds: number[];
  /** The model family's tool syntax, or null when the family has none (core/models). */
  tools: ToolSyntax | null;
  /** Ids that end a tool-calling turn besides those (the family's hand-over tokens). */
  toolStopIds: number[];
  /** The engine client to use now (an owner may replace it, e.g. after a crash). */
  engine: () => EngineClient;
  queue: AdmissionQueue;
  metrics: ServerMetrics;
  /** The requests in flight (queued or running), for the owner to show and cancel. */
  requests: RequestBook;
  /** Why the engine cannot serve now (503), or null. */
  unavailable: () => string | null;
  /** Read per request: the values for fields a request leaves out. */
  defaults: () => RequestDefaults;
}

export function unknownModel(ctx: ServerContext, name: string): ApiError {
  return new ApiError(
    404,
    `the model "${name}" does not exist; this server serves "${ctx.modelId}"`,
    "not_found_error",
    "model_not_found",
    "model",
  );
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

/**
 * Refuses a prompt that cannot fit the context before it is tokenized: its length in characters
 * bounds its length in tokens (see ChatTokenizer.maxCharsFor), and a check costs nothing where
 * tokenizing megabytes would cost seconds.
 */
export function checkPromptLength(ctx: ServerContext, chars: number, param: string): void {
  const limit = ctx.tokenizer.maxCharsFor(ctx.context);
  if (chars > limit) {
    throw new ApiError(
      400,
      `the prompt has ${chars} characters, more than the ${ctx.context} tokens of the context can hold (at most ${limit} characters); shorten it`,
      "invalid_request_error",
      "context_length_exceeded",
      param,
    );
  }
}
