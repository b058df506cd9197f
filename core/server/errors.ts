/**
 * Errors in OpenAI's error-object shape: `{error: {message, type, param, code}}` with the HTTP
 * status OpenAI uses for the same situation, so that OpenAI's SDKs raise their usual classes
 * (BadRequestError, NotFoundError, RateLimitError, ...).
 */
import { EngineCrashError, EngineError } from "../engine/index.ts";

export type ApiErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "permission_error"
  | "not_found_error"
  | "rate_limit_error"
  | "server_error"
  | "service_unavailable";

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: ApiErrorType,
    readonly code: string | null = null,
    readonly param: string | null = null,
    /** Extra response headers (Retry-After). */
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = "ApiError";
  }

  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

/** Any error thrown while handling a request, as an ApiError. */
export function toApiError(error: unknown): ApiError {
  if (error instanceof ApiError) return error;
  if (error instanceof EngineCrashError) {
    return new ApiError(
      503,
      `the engine stopped unexpectedly and is restarting; retry the request (${error.message.split("\n")[0]})`,
      "service_unavailable",
      "engine_crashed",
      null,
      { "retry-after": "1" },
    );
  }
  if (error instanceof EngineError) {
    if (error.code === "context_overflow") {
      return new ApiError(400, error.message, "invalid_request_error", "context_length_exceeded");
    }
    if (error.code === "bad_request") {
      return new ApiError(400, error.message, "invalid_request_error", "invalid_request");
    }
    return new ApiError(503, `engine error: ${error.message}`, "service_unavailable", error.code);
  }
  const fastify = error as { code?: unknown; statusCode?: unknown; message?: unknown };
  const message = typeof fastify.message === "string" ? fastify.message : String(error);
  if (fastify.code === "FST_ERR_CTP_BODY_TOO_LARGE") {
    return new ApiError(
      413,
      "the request body is too large",
      "invalid_request_error",
      "body_too_large",
    );
  }
  if (fastify.code === "FST_ERR_CTP_INVALID_MEDIA_TYPE") {
    return new ApiError(415, message, "invalid_request_error", "unsupported_media_type");
  }
  if (
    typeof fastify.statusCode === "number" &&
    fastify.statusCode >= 400 &&
    fastify.statusCode < 500
  ) {
    const json = error instanceof SyntaxError || String(fastify.code).includes("JSON");
    return new ApiError(
      fastify.statusCode,
      json ? `the request body is not valid JSON: ${message}` : message,
      "invalid_request_error",
      json ? "invalid_json" : null,
    );
  }
  return new ApiError(500, `internal error: ${message}`, "server_error", "internal_error");
}
