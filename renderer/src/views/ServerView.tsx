/** Server: the OpenAI-compatible server's switch, address and a ready-to-paste example. */
import { useState } from "react";
import { CopyButton } from "../components/CopyButton.tsx";
import { ErrorAlert } from "../components/ErrorAlert.tsx";
import { NumberField, numberParser } from "../components/NumberField.tsx";
import type { ServerStatus } from "../../../core/app/api.ts";
import { Button } from "../components/ui.tsx";
import { useActions, useAppState } from "../state/context.tsx";

export function ServerView() {
  const server = useAppState((s) => s.server);
  const settings = useAppState((s) => s.settings);
  const { client, store, run } = useActions();
  const [busy, setBusy] = useState(false);
  const running = server?.running ?? false;
  const port = settings?.server.port ?? 8080;

  async function toggle(): Promise<void> {
    setBusy(true);
    try {
      const status = await run(() => client.call("server.set", { enabled: !running, port }));
      if (status) store.dispatch({ type: "event", event: { type: "server", status } });
    } finally {
      setBusy(false);
    }
  }

  async function savePort(p: number): Promise<void> {
    const r = await run(() => client.call("settings.update", { server: { port: p } }));
    if (r) {
      store.dispatch({
        type: "event",
        event: { type: "settings", settings: r.settings, reloadNeeded: r.reloadNeeded },
      });
    }
  }

  return (
    <div className="mx-auto flex max-w-3xl flex-col gap-6 p-4 md:p-6">
      <h1 className="text-xl font-semibold">Server</h1>
      <section
        className="flex flex-col gap-4 rounded-lg border border-line bg-panel p-4"
        aria-labelledby="server-switch-label"
      >
        <div className="flex items-center justify-between gap-4">
          <div>
            <p id="server-switch-label" className="font-medium">
              OpenAI-compatible server
            </p>
            <p className="text-xs text-muted">
              Lets other programs on this machine chat with the loaded model through the OpenAI API
              (<code>/v1/chat/completions</code>). It listens on loopback only.
            </p>
          </div>
          <button
            type="button"
            role="switch"
            aria-checked={running}
            aria-labelledby="server-switch-label"
            disabled={busy || !server}
            onClick={() => void toggle()}
            className={`relative inline-flex h-7 w-12 shrink-0 items-center rounded-full border border-line transition-colors disabled:opacity-50 ${
              running ? "bg-accent" : "bg-panel-2"
            }`}
          >
            <span
              aria-hidden="true"
              className={`inline-block size-5 rounded-full bg-white shadow transition-transform ${
                running ? "translate-x-6" : "translate-x-1"
              }`}
            />
          </button>
        </div>
        <div className="max-w-48">
          <NumberField
            id="field-server-port"
            label="Port"
            value={port}
            parse={numberParser({ min: 1, max: 65535, integer: true })}
            onCommit={(v) => v != null && void savePort(v)}
            min={1}
            max={65535}
            step={1}
            help={running ? "Used the next time the server starts." : undefined}
          />
        </div>
        {server?.error && <ErrorAlert error={server.error} onRetry={() => void toggle()} />}
        {running && server?.unavailable && (
          <p role="status" data-testid="server-unavailable" className="text-sm text-muted">
            Answering 503 (retry later) for now: {server.unavailable}.
          </p>
        )}
        <div className="text-sm">
          <span className="text-muted">Address: </span>
          <span data-testid="server-url" className="font-mono break-all">
            {running && server?.url ? server.url : "not running"}
          </span>
          {running && server?.modelId && (
            <span className="text-muted">
              {" "}
              · model id <code>{server.modelId}</code>
            </span>
          )}
        </div>
      </section>
      {running && server && <RequestList requests={server.requests} />}
      {running && server?.example && (
        <section
          aria-labelledby="example-title"
          className="flex flex-col gap-2 rounded-lg border border-line bg-panel p-4"
        >
          <div className="flex items-center justify-between gap-2">
            <h2 id="example-title" className="font-semibold">
              Example
            </h2>
            <div className="flex items-center gap-2">
              <CopyButton
                label="Copy example"
                variant="secondary"
                getText={() => server.example ?? ""}
                small={false}
              />
            </div>
          </div>
          <pre className="overflow-x-auto rounded-md bg-code p-3 text-xs text-code-fg">
            <code>{server.example}</code>
          </pre>
        </section>
      )}
    </div>
  );
}

/** The server's requests in flight: who sent them, how far they are, and Cancel. */
function RequestList({ requests }: { requests: ServerStatus["requests"] }) {
  const { client, run } = useActions();
  const [cancelling, setCancelling] = useState<Set<string>>(new Set());
  return (
    <section
      aria-labelledby="requests-title"
      className="flex flex-col gap-2 rounded-lg border border-line bg-panel p-4"
    >
      <h2 id="requests-title" className="font-semibold">
        Requests
      </h2>
      {requests.length === 0 ? (
        <p className="text-sm text-muted">None in progress.</p>
      ) : (
        <ul data-testid="server-requests" className="flex flex-col divide-y divide-line text-sm">
          {requests.map((r) => (
            <li
              key={r.id}
              data-state={r.state}
              className="flex flex-wrap items-center justify-between gap-2 py-2"
            >
              <span className="min-w-0 break-all">
                <span className="font-medium">{r.state === "running" ? "Running" : "Queued"}</span>
                <span className="text-muted">
                  {" "}
                  · {r.endpoint === "chat" ? "chat" : "completion"} from{" "}
                  <span className="font-mono">{r.client}</span>
                </span>
                {r.state === "running" && (
                  <span className="tabular-nums text-muted">
                    {" "}
                    · {r.tokens} of at most {r.maxTokens} tokens
                  </span>
                )}
              </span>
              <Button
                small
                variant="secondary"
                aria-label={`Cancel the request from ${r.client}`}
                disabled={cancelling.has(r.id)}
                onClick={() => {
                  setCancelling((c) => new Set(c).add(r.id));
                  void run(() => client.call("server.cancel", { id: r.id }));
                }}
              >
                Cancel
              </Button>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}
