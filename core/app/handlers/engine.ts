/**
 * `engine.*`: status, load (which makes the model the active one, with its own settings),
 * unload, reload.
 */
import { DEMO_MODEL_NAME } from "../../demo/demo.ts";
import type { Settings } from "../api.ts";
import type { AppContext } from "../context.ts";
import { applyPatch, installedModelDefaults, switchModel } from "../settings.ts";
import type { HandlerGroup } from "./group.ts";

export function engineHandlers(ctx: AppContext): HandlerGroup<"engine"> {
  const { engine } = ctx;
  /** The demo stays `null` in `activeModel` when it was (the first-run state). */
  const withActive = (s: Settings, name: string, before: Settings): Settings => ({
    ...s,
    activeModel: name === DEMO_MODEL_NAME && before.activeModel === null ? null : name,
  });
  return {
    "engine.status": async () => engine.status(),
    "engine.load": async ({ model, engine: fix }) => {
      const name = model ?? ctx.activeName();
      if (name !== DEMO_MODEL_NAME) await ctx.models.entry(name); // not installed: a clear error
      const currentName = engine.loaded?.name ?? ctx.activeName();
      const before = ctx.settings();
      if (name !== currentName || fix) {
        // The model's own settings become the current ones (saved, so Tuning shows them).
        const dir = await engine.modelDir(name);
        const { manifest } = await ctx.models.entry(name);
        let next =
          name === currentName
            ? before
            : switchModel(
                before,
                currentName,
                name,
                await installedModelDefaults(name, dir, manifest),
              );
        if (fix) next = applyPatch(next, { engine: fix });
        ctx.updateSettings(withActive(next, name, before));
      }
      try {
        return await engine.load(name);
      } catch (error) {
        // Refused or failed with the model loaded before still there: it stays the active one
        // (with its settings); the new model keeps the settings tried, for the error's fix.
        if (name !== currentName && engine.loaded?.name === currentName) {
          const now = ctx.settings();
          const back = switchModel(now, name, currentName, now.models[currentName] ?? now);
          ctx.updateSettings({ ...back, activeModel: before.activeModel });
        }
        throw error;
      }
    },
    "engine.unload": async () => engine.unload(),
    "engine.reload": async () => engine.reload(ctx.activeName()),
  };
}
