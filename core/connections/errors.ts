/**
 * A remote endpoint's failures in plain words, each with what to do: the server is not running,
 * the key was refused, the server is busy (and for how long), the server failed, the reply was
 * cut, it timed out. Both the app (as an AppError, core/app/errors.ts) and the CLI (as a
 * UserError line) show `message` as it is.
 */
import OpenAI from "openai";
import { UserError } from "../errors.ts";

export type RemoteErrorCode =
  | "remote_refused"
  | "remote_unreachable"
  | "remote_auth"
  | "remote_busy"
  | "remote_server_error"
  | "remote_not_found"
  | "remote_bad_request"
  | "remote_cut"
  | "remote_timeout"
  | "remote_protocol";

export class RemoteError extends UserError {
  constructor(
    message: string,
    override readonly code: RemoteErrorCode,
    /** The HTTP status, when the server answered one. */
    readonly status: number | null = null,
    /** Seconds the server asked to wait (Retry-After), when it said. */
    readonly retryAfterSeconds: number | null = null,
    /** The server's own words, or the network error, for the details line. */
    readonly detail: string | null = null,
  ) {
    super(message, code);
    this.name = "RemoteError";
  }
}

/**
 * Retry-After as seconds: a whole number of seconds or an HTTP date (RFC 9110 10.2.3); null when
 * absent or unreadable.
 */
export function retryAfterSeconds(
  value: string | null | undefined,
  now = Date.now(),
): number | null {
  if (value == null) return null;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text);
  const date = Date.parse(text);
  if (Number.isNaN(date)) return null;
  return Math.max(0, Math.ceil((date - now) / 1000));
}

function errnoOf(error: unknown): string | null {
  let e: unknown = error;
  for (let depth = 0; depth < 5 && e; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && /^[A-Z_]+$/.test(code)) return code;
    e = (e as { cause?: unknown }).cause;
  }
  return null;
}

function causeText(error: unknown): string {
  const parts: string[] = [];
  let e: unknown = error;
  for (let depth = 0; depth < 5 && e; depth++) {
    if (e instanceof Error && e.message) parts.push(e.message);
    e = (e as { cause?: unknown }).cause;
  }
  return parts.join(": ");
}

/** The server's own message inside an OpenAI-shaped error body, if any. */
function serverWords(error: InstanceType<typeof OpenAI.APIError>): string | null {
  const body = error.error as { message?: unknown } | undefined;
  if (body && typeof body.message === "string" && body.message.trim() !== "") return body.message;
  return null;
}

/** A network failure before any answer (refused, unknown host, TLS, reset). */
export function connectionError(error: unknown, url: string): RemoteError {
  const errno = errnoOf(error);
  const detail = causeText(error) || String(error);
  const host = (() => {
    try {
      return new URL(url).host;
    } catch {
      return url;
    }
  })();
  if (errno === "ECONNREFUSED") {
    return new RemoteError(
      `Could not connect to ${url}: the connection was refused. Is the server running at ${url}?`,
      "remote_refused",
      null,
      null,
      detail,
    );
  }
  if (errno === "ENOTFOUND" || errno === "EAI_AGAIN") {
    return new RemoteError(
      `The host ${host} was not found. Check the URL, and the network connection.`,
      "remote_unreachable",
      null,
      null,
      detail,
    );
  }
  if (errno === "ETIMEDOUT" || errno === "UND_ERR_CONNECT_TIMEOUT") {
    return new RemoteError(
      `Connecting to ${url} timed out. Is the server running, and reachable from this machine (firewall, tunnel)?`,
      "remote_timeout",
      null,
      null,
      detail,
    );
  }
  if (errno !== null && /CERT|SSL|TLS|SELF_SIGNED|ERR_TLS/.test(errno)) {
    return new RemoteError(
      `The TLS certificate of ${host} was not accepted (${errno}). Check the https address, or the proxy's certificate.`,
      "remote_unreachable",
      null,
      null,
      detail,
    );
  }
  return new RemoteError(
    `The connection to ${url} failed${errno ? ` (${errno})` : ""}. Is the server running at ${url}?`,
    "remote_unreachable",
    null,
    null,
    detail,
  );
}

/** An HTTP error answer from the server. */
export function statusError(
  error: InstanceType<typeof OpenAI.APIError>,
  url: string,
  opts: { hasKey: boolean; model?: string },
): RemoteError {
  const status = error.status ?? 0;
  const words = serverWords(error);
  const detail = words ?? error.message;
  const wait = retryAfterSeconds(error.headers?.get("retry-after"));
  if (status === 401 || status === 403) {
    return new RemoteError(
      opts.hasKey
        ? `The API key was refused by ${url} (HTTP ${status}). Check the key in Connections (or --api-key-env).`
        : `${url} needs an API key (HTTP ${status}). Add one in Connections (or pass --api-key-env).`,
      "remote_auth",
      status,
      null,
      detail,
    );
  }
  if (status === 429) {
    return new RemoteError(
      `The server at ${url} is busy (HTTP 429)${wait !== null ? ` and asks to wait ${wait} s` : ""}. Retry in a moment.`,
      "remote_busy",
      status,
      wait,
      detail,
    );
  }
  if (status === 404) {
    return new RemoteError(
      opts.model
        ? `The server at ${url} has no model "${opts.model}"${words ? ` (${words})` : ""}. Pick one of its models.`
        : `${url} answered 404: is this the API's base URL (usually ending in /v1)?`,
      "remote_not_found",
      status,
      null,
      detail,
    );
  }
  if (status >= 500) {
    const restarting = status === 503 && wait !== null;
    return new RemoteError(
      restarting
        ? `The server at ${url} is not available for now (HTTP 503)${words ? `: ${words}` : ""}; it asks to wait ${wait} s. Retry then.`
        : `The server at ${url} failed (HTTP ${status})${words ? `: ${words}` : ""}. Retry; if it keeps failing, look at the server's log.`,
      "remote_server_error",
      status,
      wait,
      detail,
    );
  }
  return new RemoteError(
    `The server at ${url} refused the request (HTTP ${status})${words ? `: ${words}` : ""}.`,
    "remote_bad_request",
    status,
    null,
    detail,
  );
}
