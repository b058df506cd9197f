/**
 * Every failure the app shows becomes an AppError: what happened in plain words, and the next
 * step the UI offers as a button. Both transports (Electron IPC, web mode's HTTP) and the
 * controller's own event paths (a reply that failed, a download that failed) use `toAppError`,
 * so the same failure reads the same everywhere.
 */
import { ZodError } from "zod";
import { AppCallError, type AppError } from "./api.ts";
import { RemoteError } from "../connections/errors.ts";
import { EngineCrashError, EngineError } from "../engine/index.ts";
import { UserError } from "../errors.ts";
import { QueueFullError } from "../server/queue.ts";

type Action = AppError["action"];

/** A failure that already knows how the user should see it. */
export class AppFailure extends AppCallError {
  constructor(
    code: string,
    message: string,
    action: Action = null,
    detail?: string,
    fix?: AppError["fix"],
  ) {
    super({
      code,
      message,
      action,
      ...(detail !== undefined ? { detail } : {}),
      ...(fix !== undefined ? { fix } : {}),
    });
    this.name = "AppFailure";
  }
}

/** Capitalized, with a final full stop: messages from lower layers are sentence fragments. */
function sentence(text: string): string {
  const t = text.trim();
  if (t === "") return t;
  const first = t[0]!.toUpperCase() + t.slice(1);
  return /[.!?)]$/.test(first) ? first : `${first}.`;
}

/** Model-file problems that a reinstall fixes (the reader named the file). */
const REINSTALL_CODES = new Set([
  "model_corrupt",
  "model_incomplete",
  "model_invalid",
  "model_not_installed",
  "model_unknown_format",
  "model_unknown_version",
  "tokenizer_missing",
  "tokenizer_invalid",
]);

const NETWORK_ERRNOS = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ENOTFOUND",
  "EAI_AGAIN",
  "ETIMEDOUT",
  "ENETUNREACH",
  "EHOSTUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_SOCKET",
]);

function errnoOf(error: unknown): string | undefined {
  const e = error as { code?: unknown; cause?: { code?: unknown } } | null;
  if (typeof e?.code === "string") return e.code;
  if (typeof e?.cause?.code === "string") return e.cause.code;
  return undefined;
}

function fromEngineError(error: EngineError): AppError {
  const detail = error.message;
  if (error instanceof EngineCrashError) {
    const how = error.signal
      ? `it was stopped by ${error.signal}`
      : error.exitCode !== null
        ? `it exited with status ${error.exitCode}`
        : "it could not start";
    return {
      code: "engine_crashed",
      message: `The engine stopped unexpectedly (${how}). Restart it to go on; your conversation is kept.`,
      action: "restart_engine",
      detail,
    };
  }
  switch (error.code) {
    case "context_overflow":
      return {
        code: "context_overflow",
        message:
          "The conversation no longer fits the context length. Raise the context length in Tuning, or start a new chat.",
        action: "raise_context",
        detail,
      };
    case "not_loaded":
      return {
        code: "no_model",
        message: "No model is loaded. Load a model to chat.",
        action: "load_model",
        detail,
      };
    case "model_locked":
      return {
        code: "model_locked",
        message: `Another program (pid ${error.ownerPid ?? "unknown"}) is using this model. Close it, then load the model again.`,
        action: "load_model",
        detail,
      };
    case "load_failed":
      return {
        code: "load_failed",
        message: `The model could not be loaded: ${sentence(error.message)} Verify its files; reinstall it if they are damaged.`,
        action: "verify_model",
        detail,
      };
    case "non_finite_logits":
      return {
        code: "non_finite_logits",
        message:
          "The model produced invalid numbers (NaN or infinity) and the reply was stopped. Its weights may be damaged: verify its files; reinstall it if they are.",
        action: "verify_model",
        detail,
      };
    case "engine_closed":
    case "engine_down":
    case "protocol":
      return {
        code: "engine_unavailable",
        message: "The engine is not running. Restart it to go on.",
        action: "restart_engine",
        detail,
      };
    default:
      return { code: error.code, message: sentence(error.message), action: "retry", detail };
  }
}

function fromUserError(error: UserError): AppError {
  const message = sentence(error.message);
  if (REINSTALL_CODES.has(error.code)) {
    return { code: error.code, message, action: "reinstall_model" };
  }
  switch (error.code) {
    case "no_space":
      return { code: "disk_full", message, action: "free_space" };
    case "network":
    case "download_failed":
    case "hub_protocol":
    case "source_changed":
    case "interrupted":
      return { code: error.code, message, action: "retry" };
    case "context_overflow":
      return { code: error.code, message, action: "raise_context" };
    case "remote_key_unreadable":
      return { code: error.code, message, action: "open_connections" };
    default:
      return { code: error.code, message, action: null };
  }
}

/** A remote endpoint's failure (core/connections/errors.ts): its message already says what to do. */
function fromRemoteError(error: RemoteError): AppError {
  const action: Action =
    error.code === "remote_auth" || error.code === "remote_not_found"
      ? "open_connections"
      : error.code === "remote_bad_request" || error.code === "remote_protocol"
        ? null
        : "retry";
  return {
    code: error.code,
    message: error.message,
    action,
    ...(error.detail ? { detail: error.detail } : {}),
  };
}

/** Any thrown value as the AppError the user sees. */
export function toAppError(error: unknown): AppError {
  if (error instanceof AppCallError) return error.error;
  if (error instanceof RemoteError) return fromRemoteError(error);
  if (error instanceof EngineError) return fromEngineError(error);
  if (error instanceof UserError) return fromUserError(error);
  if (error instanceof QueueFullError) {
    return {
      code: "busy",
      message: "The engine is busy with other requests. Try again in a moment.",
      action: "retry",
      detail: error.message,
    };
  }
  if (error instanceof ZodError) {
    const issue = error.issues[0];
    const where = issue?.path.map(String).join(".") || "value";
    return {
      code: "bad_request",
      message: `Invalid ${where}: ${issue?.message ?? "bad value"}.`,
      action: null,
    };
  }
  const errno = errnoOf(error);
  const text = error instanceof Error ? error.message : String(error);
  if (errno === "ENOSPC" || errno === "EDQUOT") {
    return {
      code: "disk_full",
      message: "The disk is full. Free some space, then try again.",
      action: "free_space",
      detail: text,
    };
  }
  if (errno !== undefined && NETWORK_ERRNOS.has(errno)) {
    return {
      code: "network",
      message: "The network connection failed. Check it, then try again.",
      action: "retry",
      detail: text,
    };
  }
  if (errno === "EACCES" || errno === "EPERM") {
    return {
      code: "permission_denied",
      message: `Redwing may not access a file it needs: ${sentence(text)}`,
      action: null,
      detail: text,
    };
  }
  return {
    code: "internal",
    message: `Something went wrong: ${sentence(text)}`,
    action: null,
    ...(error instanceof Error && error.stack ? { detail: error.stack } : {}),
  };
}
