/**
 * The app shell: left navigation (a top bar on narrow windows), the current view, and the compact
 * Live aside on wide windows. Owns the store, the event subscription, toasts and navigation.
 */
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { AppCallError, type AppError, type Conversation } from "../../core/app/api.ts";
import type { RendererClient } from "./api/types.ts";
import { ErrorAlert } from "./components/ErrorAlert.tsx";
import { LiveAside } from "./components/LiveAside.tsx";
import { Sidebar } from "./components/Sidebar.tsx";
import { Toasts, type Toast } from "./components/Toasts.tsx";
import {
  ActionsContext,
  Store,
  useAppState,
  type AppActions,
  type View,
} from "./state/context.tsx";
import { isNewChatKey } from "./lib/keys.ts";
import { loadAll } from "./state/load.ts";
import { ChatView } from "./views/ChatView.tsx";
import { ConnectionsView } from "./views/ConnectionsView.tsx";
import { LiveView } from "./views/LiveView.tsx";
import { ModelsView } from "./views/ModelsView.tsx";
import { ServerView } from "./views/ServerView.tsx";
import { TuningView } from "./views/TuningView.tsx";

const VIEW_KEY = "redwing.view";
const VIEWS: View[] = ["models", "chat", "tuning", "live", "server", "connections"];
const MAX_TOASTS = 4;

function initialView(): View {
  try {
    const saved = sessionStorage.getItem(VIEW_KEY);
    if (saved && (VIEWS as string[]).includes(saved)) return saved as View;
  } catch {
    // Storage disabled: start in Chat.
  }
  return "chat";
}

function toAppError(e: unknown): AppError {
  if (e instanceof AppCallError) return e.error;
  return { code: "internal", message: e instanceof Error ? e.message : String(e), action: null };
}

export function App({ client }: { client: RendererClient }) {
  const [store] = useState(() => new Store());
  const [view, setView] = useState<View>(initialView);
  const [toasts, setToasts] = useState<Toast[]>([]);
  const nextToast = useRef(1);
  /** The conversation "New chat" is creating (see AppActions.newChat). */
  const pendingNew = useRef<Promise<Conversation | undefined> | null>(null);

  const notify = useCallback((error: AppError, retry?: () => void) => {
    const id = nextToast.current++;
    setToasts((list) => {
      // The same failure again replaces its toast instead of stacking copies.
      const rest = list.filter((t) => t.error.message !== error.message);
      return [...rest, { id, error, retry }].slice(-MAX_TOASTS);
    });
  }, []);

  const dismiss = useCallback((id: number) => {
    setToasts((list) => list.filter((t) => t.id !== id));
  }, []);

  const navigate = useCallback((next: View, focusId?: string) => {
    setView(next);
    try {
      sessionStorage.setItem(VIEW_KEY, next);
    } catch {
      // Not remembered across reloads then.
    }
    if (focusId) {
      // After the view has rendered.
      requestAnimationFrame(() => {
        const el = document.getElementById(focusId);
        el?.scrollIntoView({ block: "center" });
        el?.focus();
      });
    }
  }, []);

  const actions = useMemo<AppActions>(() => {
    const run = async <T,>(what: () => Promise<T>): Promise<T | undefined> => {
      try {
        return await what();
      } catch (e) {
        const error = toAppError(e);
        notify(error, error.action === "retry" ? () => void run(what) : undefined);
        return undefined;
      }
    };
    const newChat = (): Promise<Conversation | undefined> => {
      if (pendingNew.current) return pendingNew.current;
      store.dispatch({ type: "newChatStarted" });
      const creating = run(() => client.call("chat.create", {})).then((conversation) => {
        if (conversation) store.dispatch({ type: "conversation", conversation, select: true });
        else store.dispatch({ type: "newChatFailed" });
        return conversation;
      });
      const pending = creating.finally(() => {
        pendingNew.current = null;
      });
      pendingNew.current = pending;
      return pending;
    };
    const pendingNewChat = () => pendingNew.current;
    return { client, store, navigate, notify, run, newChat, pendingNewChat };
  }, [client, store, navigate, notify]);

  // App-wide keys: Ctrl/Cmd+Shift+O starts a new chat (from any view, as in ChatGPT).
  useEffect(() => {
    const onKeyDown = (e: KeyboardEvent): void => {
      if (isNewChatKey(e)) {
        e.preventDefault();
        navigate("chat");
        void actions.newChat().then((c) => {
          if (c) document.getElementById("composer")?.focus();
        });
      }
    };
    document.addEventListener("keydown", onKeyDown);
    return () => document.removeEventListener("keydown", onKeyDown);
  }, [actions, navigate]);

  // Events in, connection state, and a full refresh at start and after each reconnect.
  useEffect(() => {
    const offEvents = client.subscribe((event) => store.dispatch({ type: "event", event }));
    let opened = false;
    const offConnection = client.onConnection((state) => {
      store.dispatch({ type: "connection", state });
      if (state === "open") {
        if (opened) void loadAll(client, store, notify);
        opened = true;
      }
    });
    void loadAll(client, store, notify);
    return () => {
      offEvents();
      offConnection();
    };
  }, [client, store, notify]);

  // The catalog's "installed" and memory figures depend on the installed models and settings.
  useEffect(() => {
    let models = store.getState().models;
    let engine = store.getState().settings?.engine;
    let timer: ReturnType<typeof setTimeout> | null = null;
    const off = store.subscribe(() => {
      const s = store.getState();
      if (s.models === models && s.settings?.engine === engine) return;
      const first = models === null;
      models = s.models;
      engine = s.settings?.engine;
      if (first) return; // loadAll fetches the first catalog itself
      if (timer) clearTimeout(timer);
      timer = setTimeout(() => {
        client.call("models.catalog", {}).then(
          (catalog) => store.dispatch({ type: "catalog", catalog }),
          () => {
            // Keep the previous catalog; the next change retries.
          },
        );
      }, 400);
    });
    return () => {
      off();
      if (timer) clearTimeout(timer);
    };
  }, [client, store]);

  return (
    <ActionsContext.Provider value={actions}>
      <div className="flex h-dvh flex-col bg-bg text-fg md:flex-row">
        <a
          href="#main"
          className="sr-only z-50 rounded bg-panel px-3 py-2 focus:not-sr-only focus:fixed focus:top-2 focus:left-2"
        >
          Skip to content
        </a>
        <Sidebar view={view} onNavigate={navigate} />
        <main id="main" tabIndex={-1} className="flex min-h-0 min-w-0 flex-1 flex-col outline-none">
          <Banners />
          {/* Keyed by view: each view starts at its top, not at the previous view's offset. */}
          <div
            key={view}
            data-testid="view-scroller"
            className={`min-h-0 flex-1 ${view === "chat" ? "overflow-hidden" : "overflow-y-auto"}`}
          >
            {view === "models" && <ModelsView />}
            {view === "chat" && <ChatView />}
            {view === "tuning" && <TuningView />}
            {view === "live" && <LiveView />}
            {view === "server" && <ServerView />}
            {view === "connections" && <ConnectionsView />}
          </div>
        </main>
        <LiveAside />
        <Toasts toasts={toasts} dismiss={dismiss} />
      </div>
    </ActionsContext.Provider>
  );
}

/** Connection trouble and the engine's error, above every view. */
function Banners() {
  const connection = useAppState((s) => s.connection);
  const engineError = useAppState((s) => s.engine?.error ?? null);
  return (
    <>
      {connection === "reconnecting" && (
        <div
          role="status"
          className="shrink-0 border-b border-warn/40 bg-warn/15 px-4 py-1.5 text-sm text-fg"
        >
          Connection to Redwing lost: reconnecting…
        </div>
      )}
      {connection === "unauthorized" && (
        <div
          role="alert"
          className="shrink-0 border-b border-danger/40 bg-danger/10 px-4 py-2 text-sm"
        >
          This page has no valid access token. Open the address that <code>redwing ui</code> printed
          (it ends in <code>#token=…</code>).
        </div>
      )}
      {engineError && (
        <div className="shrink-0 px-4 pt-3">
          <ErrorAlert error={engineError} engineBanner />
        </div>
      )}
    </>
  );
}
