/** `models.*`: the catalog, hub search, installed models, downloads, verify, remove and reveal. */
import type { AppContext } from "../context.ts";
import { AppFailure } from "../errors.ts";
import { ModelSearcher } from "../model-search.ts";
import type { HandlerGroup } from "./group.ts";

export function modelsHandlers(ctx: AppContext): HandlerGroup<"models"> {
  const { models, downloads, engine } = ctx;
  const searcher = new ModelSearcher(ctx);
  return {
    "models.catalog": async () => models.catalog(),
    "models.list": async () => models.list(engine.loaded?.name ?? null),
    "models.search": async ({ query, limit }) => searcher.search(query, limit),
    "models.install": async ({ ref, name }) => downloads.install(ref, name),
    "models.downloads": async () => downloads.list(),
    "models.pause": async ({ taskId }) => downloads.pause(taskId),
    "models.resume": async ({ taskId }) => downloads.resume(taskId),
    "models.cancel": async ({ taskId }) => downloads.cancel(taskId),
    "models.dismiss": async ({ taskId }) => {
      downloads.dismiss(taskId);
      return { ok: true as const };
    },
    "models.verify": async ({ name }) => models.startVerify(name),
    "models.remove": async ({ name }) => {
      const entry = await models.entry(name);
      if (downloads.busyNames().has(name)) {
        throw new AppFailure(
          "download_active",
          `"${name}" is being downloaded; cancel the download first.`,
          null,
        );
      }
      if (engine.loaded?.name === name || engine.status().model === name) {
        await engine.unload();
      }
      await models.remove(name);
      engine.forget(entry.dir);
      if (ctx.settings().activeModel === name) {
        ctx.updateSettings({ ...ctx.settings(), activeModel: null });
      }
      ctx.emitModels();
      return { ok: true as const };
    },
    "models.reveal": async ({ name }) => {
      const { dir } = await models.entry(name);
      if (!ctx.options.reveal) return { path: dir, shown: false };
      const shown = await ctx.options.reveal(dir);
      return { path: dir, shown: shown !== false };
    },
  };
}
