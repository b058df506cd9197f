/**
 * Checks what arrives from the other side of a transport against the shared schemas: events that
 * do not match are dropped (with a warning), so the store only ever sees well-formed ones.
 */
import {
  API,
  AppCallError,
  AppErrorSchema,
  AppEventSchema,
  type AppError,
  type AppEvent,
  type Method,
} from "../../../core/app/api.ts";

export function parseEvent(raw: unknown): AppEvent | null {
  const parsed = AppEventSchema.safeParse(raw);
  if (parsed.success) return parsed.data;
  const type = typeof raw === "object" && raw && "type" in raw ? String(raw.type) : "?";
  const issue = parsed.error.issues[0];
  console.warn(
    `redwing: dropped an invalid "${type}" event: ${issue?.path.join(".") ?? ""} ${issue?.message ?? ""}`,
  );
  return null;
}

/**
 * A call's result. A result that does not match its schema is a bug on the other side: warn, but
 * pass it on (the UI copes with a missing optional field better than with no answer).
 */
export function checkResult(method: Method, result: unknown): unknown {
  const parsed = API[method].result.safeParse(result);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  console.warn(
    `redwing: ${method} answered an unexpected result: ${issue?.path.join(".") ?? ""} ${issue?.message ?? ""}`,
  );
  return result;
}

/** An `{ ok: false, error }` answer's error as an AppCallError, whatever shape it came in. */
export function toCallError(error: unknown, fallback: string): AppCallError {
  const parsed = AppErrorSchema.safeParse(error);
  if (parsed.success) return new AppCallError(parsed.data);
  return new AppCallError({ code: "bad_answer", message: fallback, action: "retry" });
}

export function appError(code: string, message: string, action: AppError["action"]): AppError {
  return { code, message, action };
}
