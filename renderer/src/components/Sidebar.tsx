import type { EngineStatus } from "../../../core/app/api.ts";
import { engineStateText } from "../lib/format.ts";
import { useActions, useAppState, type View } from "../state/context.tsx";
import type { ConnectionState } from "../state/store.ts";
import { Button } from "./ui.tsx";

const ITEMS: { view: View; label: string; icon: string }[] = [
  { view: "models", label: "Models", icon: "▦" },
  { view: "chat", label: "Chat", icon: "✎" },
  { view: "tuning", label: "Tuning", icon: "⚙" },
  { view: "live", label: "Live", icon: "∿" },
  { view: "server", label: "Server", icon: "⇄" },
  { view: "connections", label: "Connections", icon: "☁" },
];

const STATE_TONE: Record<string, string> = {
  ready: "bg-ok",
  generating: "bg-accent animate-pulse",
  loading: "bg-warn animate-pulse",
  starting: "bg-warn animate-pulse",
  crashed: "bg-danger",
  stopped: "bg-muted",
};

/** Left column on wide windows, a top bar on narrow ones. */
/**
 * The engine's state as the app last heard it; while the connection to the app is down that is
 * not known, and the status says so instead of a stale green "ready".
 */
function statusOf(
  engine: EngineStatus | null,
  connection: ConnectionState,
): { text: string; tone: string } {
  if (connection === "reconnecting") return { text: "app not responding", tone: "bg-danger" };
  if (connection === "unauthorized") return { text: "no access", tone: "bg-danger" };
  if (connection === "connecting" && !engine) return { text: "connecting", tone: "bg-muted" };
  return {
    text: engineStateText(engine),
    tone: STATE_TONE[engine?.state ?? "stopped"] ?? "bg-muted",
  };
}

export function Sidebar({ view, onNavigate }: { view: View; onNavigate: (v: View) => void }) {
  const engine = useAppState((s) => s.engine);
  const connection = useAppState((s) => s.connection);
  const { client, run } = useActions();
  const { text, tone } = statusOf(engine, connection);
  const crashed = connection !== "reconnecting" && engine?.state === "crashed";

  // The status follows from the engine's events; the call's answer (the status when the load
  // ended) could be older than them by the time it arrives.
  function restart(): void {
    void run(() => client.call("engine.reload", {}));
  }

  return (
    <header className="flex shrink-0 flex-col gap-2 border-b border-line bg-panel px-3 py-2 md:w-44 md:border-r md:border-b-0 md:px-3 md:py-4">
      <div className="flex items-center justify-between gap-2 md:flex-col md:items-start">
        <span className="text-base font-semibold tracking-tight">
          <span aria-hidden="true" className="text-accent">
            ◆{" "}
          </span>
          Redwing
        </span>
        <div className="flex min-w-0 items-center gap-2 md:w-full md:flex-col md:items-start">
          <p className="flex max-w-full min-w-0 items-center gap-1.5 text-xs text-muted">
            <span
              aria-hidden="true"
              className={`inline-block size-2 shrink-0 rounded-full ${tone}`}
            />
            <span className="sr-only">Engine: </span>
            <span data-testid="engine-state" className="min-w-0 truncate" title={text}>
              {text}
            </span>
          </p>
          {crashed && (
            <Button small variant="danger" onClick={restart}>
              Restart
            </Button>
          )}
        </div>
      </div>
      <nav aria-label="Main" className="-mx-1 overflow-x-auto md:mx-0 md:mt-4 md:overflow-visible">
        <ul className="flex gap-1 md:flex-col">
          {ITEMS.map((item) => (
            <li key={item.view}>
              <button
                type="button"
                aria-current={view === item.view ? "page" : undefined}
                onClick={() => onNavigate(item.view)}
                className={`flex w-full items-center gap-2 rounded-md px-2.5 py-1.5 text-sm whitespace-nowrap transition-colors ${
                  view === item.view
                    ? "bg-accent/15 font-semibold text-accent"
                    : "text-fg hover:bg-panel-2"
                }`}
              >
                <span aria-hidden="true" className="hidden w-4 text-center md:inline">
                  {item.icon}
                </span>
                {item.label}
              </button>
            </li>
          ))}
        </ul>
      </nav>
    </header>
  );
}
