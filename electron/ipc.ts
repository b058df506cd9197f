/**
 * The main process's side of the preload bridge, kept free of Electron imports so it is tested in
 * plain Node: every `redwing:call` is checked (sender, method, params against the core's zod
 * schemas) before it reaches the backend, and answers a `CallOutcome` (never throws across IPC,
 * where Electron would flatten the error into an opaque string).
 */
import {
  parseCall,
  type AppBackend,
  type AppError,
  type AppEvent,
  type CallOutcome,
  type Method,
} from "../core/app/api.ts";
import { toAppError } from "../core/app/errors.ts";
import { isTrustedSender } from "./security.ts";

/** IPC channel names, shared with the preload. */
export { CALL_CHANNEL, EVENT_CHANNEL, SUBSCRIBE_CHANNEL } from "./channels.ts";

const FORBIDDEN: AppError = {
  code: "forbidden",
  message: "this window may not talk to Redwing",
  action: null,
};

/**
 * Handles one call from the renderer. `senderUrl` is the sending frame's URL when it is the main
 * frame of the app's window, else null (main.ts decides that; this function checks the origin).
 */
export async function handleCall(
  backend: AppBackend,
  method: unknown,
  params: unknown,
  senderUrl: string | null,
): Promise<CallOutcome<Method>> {
  if (!isTrustedSender(senderUrl)) return { ok: false, error: FORBIDDEN };
  if (typeof method !== "string" || method.length > 100) {
    return {
      ok: false,
      error: { code: "bad_request", message: "a call needs a method name", action: null },
    };
  }
  const parsed = parseCall(method, params);
  if (!parsed.ok) return parsed;
  try {
    const result = await backend.call(parsed.method, parsed.params as never);
    return { ok: true, result } as CallOutcome<Method>;
  } catch (error) {
    return { ok: false, error: toAppError(error) };
  }
}

/**
 * The current state as events, in the order web mode sends them when an event stream connects:
 * settings, models, engine, server, conversations, then each download.
 */
export async function snapshotEvents(backend: AppBackend): Promise<AppEvent[]> {
  const [settings, models, engine, server, conversations, downloads] = await Promise.all([
    backend.call("settings.get", {}),
    backend.call("models.list", {}),
    backend.call("engine.status", {}),
    backend.call("server.status", {}),
    backend.call("chat.list", {}),
    backend.call("models.downloads", {}),
  ]);
  return [
    { type: "settings", settings, reloadNeeded: engine.reloadNeeded },
    { type: "models", models },
    { type: "engine", status: engine },
    { type: "server", status: server },
    { type: "conversations", conversations },
    ...downloads.map((download): AppEvent => ({ type: "download", download })),
  ];
}

/**
 * Carries the backend's events to one window. When the renderer subscribes (its first `onEvent`
 * listener), the window gets the current state first; live events raised while that snapshot is
 * being gathered are held back and sent after it, so an older snapshot never overwrites a newer
 * event.
 */
export class EventPump {
  private readonly unsubscribe: () => void;
  private held: AppEvent[] | null = null;
  private closed = false;

  constructor(
    private readonly backend: AppBackend,
    private readonly send: (event: AppEvent) => void,
    private readonly onError: (error: unknown) => void = () => {},
  ) {
    this.unsubscribe = backend.subscribe((event) => {
      if (this.closed) return;
      if (this.held) this.held.push(event);
      else this.deliver(event);
    });
  }

  /** The renderer (re)subscribed: send the current state, then what happened meanwhile. */
  async resync(): Promise<void> {
    // One already gathering covers this request too: its snapshot is newer than the request and
    // everything raised meanwhile is held for after it.
    if (this.closed || this.held !== null) return;
    const held: AppEvent[] = [];
    this.held = held;
    let snapshot: AppEvent[] = [];
    try {
      snapshot = await snapshotEvents(this.backend);
    } catch (error) {
      this.onError(error);
    }
    if (this.held !== held) return; // closed meanwhile
    this.held = null;
    for (const event of [...snapshot, ...held]) this.deliver(event);
  }

  close(): void {
    this.closed = true;
    this.held = null;
    this.unsubscribe();
  }

  private deliver(event: AppEvent): void {
    if (this.closed) return;
    try {
      this.send(event);
    } catch (error) {
      this.onError(error);
    }
  }
}

/**
 * Waits for `close` (the controller's: it stops the engine child, the server, downloads) at most
 * `timeoutMs`, so quitting never hangs on a stuck engine; the engine client's exit hook and the
 * service's parent-death watch still end the child then.
 */
export async function closeWithin(
  close: () => Promise<void>,
  timeoutMs: number,
): Promise<"closed" | "timeout" | "failed"> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), timeoutMs);
  });
  try {
    return await Promise.race([
      close().then(
        () => "closed" as const,
        () => "failed" as const,
      ),
      timeout,
    ]);
  } finally {
    clearTimeout(timer);
  }
}
