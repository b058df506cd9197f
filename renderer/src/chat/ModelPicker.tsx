/**
 * The model to chat with: choosing one loads it with its own settings (engine.load makes it the
 * active model). A load the settings cannot satisfy is refused with its fix and the model loaded
 * before stays, so the picker follows the engine, not the choice.
 */
import { useActions, useAppState } from "../state/context.tsx";

export function ModelPicker() {
  const { client, run } = useActions();
  const models = useAppState((s) => s.models);
  const engine = useAppState((s) => s.engine);
  const selected = engine?.model ?? "";
  const busy = engine?.state === "loading" || engine?.state === "starting";
  if (!models || models.length === 0) return null;
  return (
    <label className="ml-auto flex max-w-[14rem] shrink-0 items-center gap-2 text-sm text-muted">
      <span>Model</span>
      <select
        className="min-w-0 truncate rounded-md border border-line bg-panel px-2 py-1 text-fg"
        value={selected}
        disabled={busy}
        onChange={(e) => {
          const model = e.target.value;
          if (model) void run(() => client.call("engine.load", { model }));
        }}
      >
        {selected === "" && <option value="">None loaded</option>}
        {models.map((m) => (
          <option key={m.name} value={m.name}>
            {m.name}
          </option>
        ))}
      </select>
    </label>
  );
}
