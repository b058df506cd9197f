/**
 * Connections: OpenAI-compatible servers (vLLM, llama.cpp's server, another Redwing...) whose
 * models Chat can use next to the local ones (docs/remote.md). Add, edit, test, remove; each
 * shows its models or why they could not be listed. API keys go in and never come back: the
 * list says only where a key is kept.
 */
import { useState, type FormEvent } from "react";
import type { Connection } from "../../../core/app/api.ts";
import { ConfirmDialog } from "../components/ConfirmDialog.tsx";
import { ErrorAlert } from "../components/ErrorAlert.tsx";
import { Badge, Button } from "../components/ui.tsx";
import { useActions, useAppState } from "../state/context.tsx";

const INPUT = "min-w-0 rounded-md border border-line bg-bg px-3 py-1.5 text-sm";

const KEY_TEXT: Record<NonNullable<Connection["keyStorage"]> | "none", string> = {
  keychain: "key in the OS keychain",
  file: "key in a file only you can read",
  none: "no API key",
};

export function ConnectionsView() {
  const connections = useAppState((s) => s.connections);
  return (
    <div className="mx-auto flex max-w-3xl flex-col gap-6 p-4 md:p-6">
      <div>
        <h1 className="text-xl font-semibold">Connections</h1>
        <p className="mt-1 text-sm text-muted">
          OpenAI-compatible servers (vLLM, llama.cpp&apos;s <code>llama-server</code>, SGLang,
          Ollama, LM Studio, another Redwing) whose models you can chat with from the Chat
          view&apos;s model picker, for a model too big for this machine. How to run one on a GPU
          server and reach it safely: <code>docs/remote.md</code>.
        </p>
      </div>
      <AddForm />
      <section aria-labelledby="connections-title" className="flex flex-col gap-3">
        <h2 id="connections-title" className="font-semibold">
          Saved connections
        </h2>
        {connections === null ? (
          <p className="text-sm text-muted">Loading…</p>
        ) : connections.length === 0 ? (
          <p className="text-sm text-muted">None yet.</p>
        ) : (
          <ul className="flex flex-col gap-3">
            {connections.map((c) => (
              <ConnectionCard key={c.id} connection={c} />
            ))}
          </ul>
        )}
      </section>
    </div>
  );
}

function AddForm() {
  const { client, store, run } = useActions();
  const [name, setName] = useState("");
  const [baseUrl, setBaseUrl] = useState("");
  const [apiKey, setApiKey] = useState("");
  const [busy, setBusy] = useState(false);

  async function submit(e: FormEvent): Promise<void> {
    e.preventDefault();
    setBusy(true);
    try {
      const added = await run(() =>
        client.call("connections.add", {
          name: name.trim(),
          baseUrl: baseUrl.trim(),
          ...(apiKey !== "" ? { apiKey } : {}),
        }),
      );
      if (added) {
        setName("");
        setBaseUrl("");
        setApiKey("");
        const list = await run(() => client.call("connections.list", {}));
        if (list)
          store.dispatch({ type: "event", event: { type: "connections", connections: list } });
      }
    } finally {
      setBusy(false);
    }
  }

  return (
    <form
      aria-labelledby="add-connection-title"
      onSubmit={(e) => void submit(e)}
      className="flex flex-col gap-3 rounded-lg border border-line bg-panel p-4"
    >
      <h2 id="add-connection-title" className="font-semibold">
        Add a connection
      </h2>
      <div className="grid gap-3 sm:grid-cols-2">
        <label className="flex flex-col gap-1 text-sm">
          <span className="font-medium">Name</span>
          <input
            className={INPUT}
            value={name}
            onChange={(e) => setName(e.target.value)}
            placeholder="GPU server"
            autoComplete="off"
          />
        </label>
        <label className="flex flex-col gap-1 text-sm">
          <span className="font-medium">Base URL</span>
          <input
            className={INPUT}
            value={baseUrl}
            onChange={(e) => setBaseUrl(e.target.value)}
            placeholder="http://127.0.0.1:8000/v1"
            spellCheck={false}
            autoComplete="off"
          />
        </label>
        <label className="flex flex-col gap-1 text-sm sm:col-span-2">
          <span className="font-medium">API key (optional)</span>
          <input
            className={INPUT}
            type="password"
            value={apiKey}
            onChange={(e) => setApiKey(e.target.value)}
            autoComplete="off"
          />
          <span className="text-xs text-muted">
            Kept in the OS keychain in the desktop app, else in a file only you can read. Sent only
            to this server.
          </span>
        </label>
      </div>
      <div>
        <Button type="submit" variant="primary" disabled={busy || !name.trim() || !baseUrl.trim()}>
          {busy ? "Adding…" : "Add connection"}
        </Button>
      </div>
    </form>
  );
}

function ConnectionCard({ connection: c }: { connection: Connection }) {
  const { client, store, run } = useActions();
  const [editing, setEditing] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const [testing, setTesting] = useState(false);
  const [tested, setTested] = useState<string | null>(null);

  async function test(): Promise<void> {
    setTesting(true);
    setTested(null);
    const started = performance.now();
    try {
      // A failure stays on the card (the list event carries it); no toast on top.
      const ok = await client.call("connections.test", { id: c.id }).catch(() => null);
      if (ok) {
        const ms = Math.round(performance.now() - started);
        const n = ok.models?.length ?? 0;
        setTested(`Reached in ${ms} ms: ${n} model${n === 1 ? "" : "s"}.`);
      }
    } finally {
      setTesting(false);
    }
  }

  async function remove(): Promise<void> {
    const done = await run(() => client.call("connections.remove", { id: c.id }));
    if (done) {
      const list = await run(() => client.call("connections.list", {}));
      if (list)
        store.dispatch({ type: "event", event: { type: "connections", connections: list } });
    }
  }

  const key = KEY_TEXT[c.keyStorage ?? "none"];
  return (
    <li
      aria-label={c.name}
      data-testid="connection"
      className="flex flex-col gap-2 rounded-lg border border-line bg-panel p-4"
    >
      <div className="flex flex-wrap items-start justify-between gap-2">
        <div className="min-w-0">
          <p className="font-medium">{c.name}</p>
          <p className="font-mono text-xs break-all text-muted">{c.baseUrl}</p>
        </div>
        <div className="flex shrink-0 flex-wrap gap-2">
          <Button small onClick={() => void test()} disabled={testing}>
            {testing ? "Testing…" : "Test"}
          </Button>
          <Button small onClick={() => setEditing((v) => !v)} aria-expanded={editing}>
            Edit
          </Button>
          <Button small variant="danger" onClick={() => setConfirming(true)}>
            Remove
          </Button>
        </div>
      </div>
      <div className="flex flex-wrap items-center gap-2">
        <Badge tone={c.keyStorage ? "ok" : "neutral"}>{key}</Badge>
      </div>
      {c.warning && (
        <p role="note" className="rounded-md bg-warn/15 px-3 py-2 text-sm text-fg">
          {c.warning}
        </p>
      )}
      {tested && (
        <p role="status" className="text-sm text-ok">
          {tested}
        </p>
      )}
      {c.error && <ErrorAlert error={c.error} onRetry={() => void test()} />}
      <div className="text-sm">
        <span className="text-muted">Models: </span>
        {c.models === null ? (
          <span className="text-muted">not listed yet</span>
        ) : c.models.length === 0 ? (
          <span className="text-muted">none</span>
        ) : (
          <span data-testid="connection-models" className="font-mono break-all">
            {c.models.join(", ")}
          </span>
        )}
      </div>
      {editing && <EditForm connection={c} onDone={() => setEditing(false)} />}
      {confirming && (
        <ConfirmDialog
          title={`Remove ${c.name}?`}
          body="Its address and API key will be forgotten. Conversations with its models are kept."
          confirmLabel="Remove connection"
          onConfirm={() => void remove()}
          onClose={() => setConfirming(false)}
        />
      )}
    </li>
  );
}

function EditForm({ connection: c, onDone }: { connection: Connection; onDone: () => void }) {
  const { client, run } = useActions();
  const [name, setName] = useState(c.name);
  const [baseUrl, setBaseUrl] = useState(c.baseUrl);
  const [apiKey, setApiKey] = useState("");
  const [dropKey, setDropKey] = useState(false);

  async function save(e: FormEvent): Promise<void> {
    e.preventDefault();
    const saved = await run(() =>
      client.call("connections.update", {
        id: c.id,
        name: name.trim(),
        baseUrl: baseUrl.trim(),
        // Blank keeps the saved key.
        ...(dropKey ? { apiKey: null } : apiKey !== "" ? { apiKey } : {}),
      }),
    );
    if (saved) onDone();
  }

  return (
    <form
      aria-label={`Edit ${c.name}`}
      onSubmit={(e) => void save(e)}
      className="grid gap-3 border-t border-line pt-3 sm:grid-cols-2"
    >
      <label className="flex flex-col gap-1 text-sm">
        <span className="font-medium">Name</span>
        <input className={INPUT} value={name} onChange={(e) => setName(e.target.value)} />
      </label>
      <label className="flex flex-col gap-1 text-sm">
        <span className="font-medium">Base URL</span>
        <input
          className={INPUT}
          value={baseUrl}
          onChange={(e) => setBaseUrl(e.target.value)}
          spellCheck={false}
        />
      </label>
      <label className="flex flex-col gap-1 text-sm">
        <span className="font-medium">New API key</span>
        <input
          className={INPUT}
          type="password"
          value={apiKey}
          disabled={dropKey}
          onChange={(e) => setApiKey(e.target.value)}
          placeholder={c.keyStorage ? "blank: keep the saved key" : "none"}
          autoComplete="off"
        />
      </label>
      {c.keyStorage && (
        <label className="flex items-center gap-2 self-end text-sm">
          <input type="checkbox" checked={dropKey} onChange={(e) => setDropKey(e.target.checked)} />
          Remove the saved key
        </label>
      )}
      <div className="flex gap-2 sm:col-span-2">
        <Button type="submit" variant="primary" disabled={!name.trim() || !baseUrl.trim()}>
          Save
        </Button>
        <Button onClick={onDone}>Cancel</Button>
      </div>
    </form>
  );
}
