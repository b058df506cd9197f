/**
 * The web-mode transport (`redwing ui`): calls are `POST /api/call/<method>` with the per-launch
 * token as a Bearer header; events come over server-sent events from `/api/events?token=` (an
 * EventSource cannot send headers). The token arrives once in the address (`#token=`), is kept in
 * sessionStorage for reloads of this tab, and is removed from the address bar and history.
 */
import { AppCallError, type AppEvent, type Method } from "../../../core/app/api.ts";
import type { ConnectionState } from "../state/store.ts";
import type { RendererClient } from "./types.ts";
import { appError, checkResult, parseEvent, toCallError } from "./validate.ts";

const TOKEN_KEY = "redwing.token";
/** Reconnect delays after the event stream closes: doubling, capped. */
const RETRY_MIN_MS = 500;
const RETRY_MAX_MS = 10_000;

/** The token in a `#token=<hex>` fragment, or null. */
export function tokenFromHash(hash: string): string | null {
  const params = new URLSearchParams(hash.startsWith("#") ? hash.slice(1) : hash);
  const token = params.get("token");
  return token && /^[A-Za-z0-9_-]{8,512}$/.test(token) ? token : null;
}

/** Reads the token from the address (then strips it) or from this tab's session storage. */
export function takeToken(): string | null {
  const fromHash = tokenFromHash(window.location.hash);
  if (fromHash) {
    try {
      sessionStorage.setItem(TOKEN_KEY, fromHash);
    } catch {
      // Storage disabled: the token still works until the tab is reloaded.
    }
    // Out of the address bar, bookmarks and history entries.
    history.replaceState(history.state, "", window.location.pathname + window.location.search);
    return fromHash;
  }
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

export function retryDelayMs(attempt: number): number {
  return Math.min(RETRY_MAX_MS, RETRY_MIN_MS * 2 ** Math.max(0, attempt));
}

const UNAUTHORIZED = appError(
  "unauthorized",
  "This page has no valid access token. Open the address that `redwing ui` printed (it ends in #token=…).",
  null,
);

export function createHttpClient(token: string | null, base = "/"): RendererClient {
  const listeners = new Set<(event: AppEvent) => void>();
  const connectionListeners = new Set<(state: ConnectionState) => void>();
  let connection: ConnectionState = token ? "connecting" : "unauthorized";
  let source: EventSource | null = null;
  let attempt = 0;
  let retryTimer: ReturnType<typeof setTimeout> | null = null;

  function setConnection(next: ConnectionState): void {
    if (next === connection) return;
    connection = next;
    for (const l of connectionListeners) l(next);
  }

  async function call(method: string, params: unknown): Promise<unknown> {
    if (!token) throw new AppCallError(UNAUTHORIZED);
    let response: Response;
    const body = JSON.stringify(params ?? {});
    try {
      response = await fetch(`${base}api/call/${encodeURIComponent(method)}`, {
        method: "POST",
        headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
        body,
        // A save made as the page closes (pagehide) must still reach the server; browsers cap
        // keepalive bodies at 64 KiB, so larger ones go as ordinary requests.
        keepalive: body.length < 60_000,
      });
    } catch {
      throw new AppCallError(
        appError("unreachable", "Cannot reach Redwing. Is `redwing ui` still running?", "retry"),
      );
    }
    let answer: unknown = null;
    try {
      answer = await response.json();
    } catch {
      // Not JSON (a proxy's error page): handled below by status.
    }
    if (response.status === 401) {
      setConnection("unauthorized");
      throw new AppCallError(UNAUTHORIZED);
    }
    if (typeof answer === "object" && answer !== null && "ok" in answer) {
      if (answer.ok === true && "result" in answer) {
        return checkResult(method as Method, answer.result);
      }
      if (answer.ok === false && "error" in answer) {
        throw toCallError(answer.error, `${method} failed (HTTP ${response.status})`);
      }
    }
    throw new AppCallError(
      appError("bad_answer", `Redwing answered ${method} with HTTP ${response.status}`, "retry"),
    );
  }

  function open(): void {
    if (!token || source) return;
    const es = new EventSource(`${base}api/events?token=${encodeURIComponent(token)}`);
    source = es;
    es.onopen = () => {
      attempt = 0;
      setConnection("open");
    };
    es.onmessage = (message: MessageEvent<string>) => {
      let raw: unknown;
      try {
        raw = JSON.parse(message.data);
      } catch {
        console.warn("redwing: dropped an event that is not JSON");
        return;
      }
      const event = parseEvent(raw);
      if (event) for (const l of listeners) l(event);
    };
    es.onerror = () => {
      if (es.readyState !== EventSource.CLOSED) {
        // The browser retries by itself (connection dropped): show it.
        if (connection === "open") setConnection("reconnecting");
        return;
      }
      // Closed for good (HTTP error, server gone): find out why, then retry ourselves.
      es.close();
      source = null;
      if (connection !== "connecting") setConnection("reconnecting");
      scheduleReconnect();
    };
  }

  function scheduleReconnect(): void {
    if (retryTimer || listeners.size === 0) return;
    retryTimer = setTimeout(() => {
      retryTimer = null;
      attempt++;
      // A cheap call tells a dead server from a rejected token (EventSource hides the status).
      call("app.info", {}).then(
        () => open(),
        (e: unknown) => {
          if (e instanceof AppCallError && e.error.code === "unauthorized") return;
          scheduleReconnect();
        },
      );
    }, retryDelayMs(attempt));
  }

  function close(): void {
    if (retryTimer) clearTimeout(retryTimer);
    retryTimer = null;
    source?.close();
    source = null;
  }

  return {
    shell: "web",
    call: call as RendererClient["call"],
    subscribe(listener) {
      listeners.add(listener);
      open();
      return () => {
        listeners.delete(listener);
        if (listeners.size === 0) close();
      };
    },
    onConnection(listener) {
      connectionListeners.add(listener);
      listener(connection);
      return () => connectionListeners.delete(listener);
    },
  };
}
