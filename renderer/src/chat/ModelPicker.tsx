/**
 * The model to chat with: the installed models, then each connection's models (grouped by
 * connection, docs/remote.md). Choosing a local one loads it with its own settings (engine.load
 * makes it the active model; a load the settings cannot satisfy is refused with its fix and the
 * model loaded before stays, so the picker follows the engine, not the choice). Choosing a
 * remote one saves it as the chat's target (`settings.remote`): replies come from that server.
 */
import type { Connection } from "../../../core/app/api.ts";
import { useActions, useAppState } from "../state/context.tsx";

/** A remote option's value (a local model's is its name, as before connections existed). */
function remoteValue(connectionId: string, model: string): string {
  return `remote:${connectionId}|${model}`;
}

/** The label of the chosen remote model, or null when chatting with the local one. */
export function remoteLabel(
  remote: { connectionId: string; model: string } | null | undefined,
  connections: Connection[] | null,
): string | null {
  if (!remote) return null;
  const c = connections?.find((x) => x.id === remote.connectionId);
  return `${remote.model} (${c?.name ?? "removed connection"})`;
}

export function ModelPicker() {
  const { client, store, run } = useActions();
  const models = useAppState((s) => s.models);
  const engine = useAppState((s) => s.engine);
  const remote = useAppState((s) => s.settings?.remote ?? null);
  const connections = useAppState((s) => s.connections);
  const listed = (connections ?? []).filter((c) => (c.models?.length ?? 0) > 0);
  const selected = remote ? remoteValue(remote.connectionId, remote.model) : (engine?.model ?? "");
  const busy = engine?.state === "loading" || engine?.state === "starting";
  if ((!models || models.length === 0) && listed.length === 0) return null;

  async function saveRemote(target: { connectionId: string; model: string } | null) {
    const r = await run(() => client.call("settings.update", { remote: target }));
    if (r) {
      store.dispatch({
        type: "event",
        event: { type: "settings", settings: r.settings, reloadNeeded: r.reloadNeeded },
      });
    }
    return r;
  }

  async function choose(value: string): Promise<void> {
    // A remote option only when it names a listed connection: a local name may hold anything.
    const rest = value.startsWith("remote:") ? value.slice("remote:".length) : null;
    const bar = rest?.indexOf("|") ?? -1;
    const connectionId = rest !== null && bar > 0 ? rest.slice(0, bar) : null;
    if (rest !== null && connectionId && listed.some((c) => c.id === connectionId)) {
      await saveRemote({ connectionId, model: rest.slice(bar + 1) });
      return;
    }
    const model = value;
    if (!model) return;
    if (remote && !(await saveRemote(null))) return;
    if (model !== engine?.model) await run(() => client.call("engine.load", { model }));
  }

  return (
    <label className="ml-auto flex max-w-[16rem] shrink-0 items-center gap-2 text-sm text-muted">
      <span>Model</span>
      <select
        data-testid="model-picker"
        className="min-w-0 truncate rounded-md border border-line bg-panel px-2 py-1 text-fg"
        value={selected}
        disabled={busy}
        onChange={(e) => void choose(e.target.value)}
      >
        {selected === "" && <option value="">None loaded</option>}
        {remote && !listed.some((c) => c.id === remote.connectionId) && (
          <option value={selected}>{remoteLabel(remote, connections)}</option>
        )}
        <optgroup label="On this machine">
          {(models ?? []).map((m) => (
            <option key={m.name} value={m.name}>
              {m.name}
            </option>
          ))}
        </optgroup>
        {listed.map((c) => (
          <optgroup key={c.id} label={c.name}>
            {c.models!.map((m) => (
              <option key={m} value={remoteValue(c.id, m)}>
                {m}
              </option>
            ))}
          </optgroup>
        ))}
      </select>
    </label>
  );
}
