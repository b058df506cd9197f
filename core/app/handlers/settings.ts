/** `settings.*`: read, patch and reset the settings, and the Tuning view's memory plan. */
import { DEFAULT_SETTINGS, effectiveVramBudget } from "../api.ts";
import type { AppContext } from "../context.ts";
import { freeMemoryBytes } from "../live.ts";
import { memoryPlan } from "../memory.ts";
import { applyPatch } from "../settings.ts";
import type { HandlerGroup } from "./group.ts";

export function settingsHandlers(ctx: AppContext): HandlerGroup<"settings"> {
  const { engine } = ctx;
  return {
    "settings.get": async () => ctx.settings(),
    "settings.update": async (patch) => {
      ctx.updateSettings(applyPatch(ctx.settings(), patch));
      engine.emit(); // reloadNeeded may have changed
      if (patch.engine) ctx.emitModels(); // memory estimates follow the engine settings
      return { settings: ctx.settings(), reloadNeeded: engine.status().reloadNeeded };
    },
    "settings.reset": async () => {
      // Back to the defaults, except which model is active (local or on a connection) and
      // whether the server is on.
      const settings = ctx.settings();
      ctx.updateSettings({
        ...structuredClone(DEFAULT_SETTINGS),
        activeModel: settings.activeModel,
        remote: settings.remote,
        server: { ...DEFAULT_SETTINGS.server, enabled: settings.server.enabled },
      });
      engine.emit();
      ctx.emitModels();
      return ctx.settings();
    },
    "settings.memoryPlan": async (params) => {
      const name = params.model ?? engine.loaded?.name ?? ctx.activeName();
      const entry = await ctx.models.entry(name);
      const engineSettings = { ...ctx.settings().engine, ...params.engine };
      const loadedHere = engine.loaded?.name === name;
      return memoryPlan(
        name,
        await ctx.engine.plan(entry.dir, engineSettings),
        entry.manifest.architecture.moe?.num_experts ?? 0,
        await freeMemoryBytes(),
        ctx.hitRates,
        loadedHere ? (ctx.live.history.at(-1)?.rssBytes ?? 0) : 0,
        engineSettings.memoryBudgetBytes,
        effectiveVramBudget(engineSettings) ?? null,
      );
    },
  };
}
