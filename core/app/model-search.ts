/**
 * `models.search` for the app: model discovery (core/install/discover.ts) with this app's hub
 * settings (HF_ENDPOINT, HF_TOKEN from its environment), the engine's memory plan at the saved
 * engine settings (asked of a weightless skeleton of each result's install, so the figure is the
 * one `models.list` shows once it is installed), and which results are installed already.
 *
 * One search runs at a time: a new one aborts the one before (the Models view searches as the
 * user types), whose call then fails with `search_superseded`.
 */
import { totalmem } from "node:os";
import { join } from "node:path";
import { discoverModels } from "../install/discover.ts";
import { writeSkeleton } from "../install/plan-skeleton.ts";
import type { ModelSearch } from "./api.ts";
import type { AppContext } from "./context.ts";
import { AppFailure } from "./errors.ts";

export class ModelSearcher {
  private current: AbortController | null = null;

  constructor(private readonly ctx: AppContext) {}

  async search(query: string, limit?: number): Promise<ModelSearch> {
    this.current?.abort(
      new AppFailure("search_superseded", "A newer search replaced this one.", null),
    );
    const controller = new AbortController();
    this.current = controller;
    const { ctx } = this;
    const engineSettings = ctx.settings().engine;
    const skeletons = join(ctx.dataDir, "plan-skeletons");
    try {
      const found = await discoverModels(query, {
        env: ctx.options.env ?? process.env,
        ...(limit !== undefined ? { limit } : {}),
        signal: controller.signal,
        totalMemoryBytes: totalmem(),
        planMemory: async (manifest) =>
          (await ctx.engine.plan(await writeSkeleton(skeletons, manifest), engineSettings))
            .total_bytes,
      });
      const installed = await ctx.models.entries();
      return {
        ...found,
        models: found.models.map((m) => ({
          ...m,
          installedAs:
            installed.find((e) => e.manifest.source.repo?.toLowerCase() === m.repo.toLowerCase())
              ?.name ?? null,
        })),
      };
    } catch (error) {
      if (controller.signal.aborted && controller.signal.reason instanceof AppFailure) {
        throw controller.signal.reason;
      }
      throw error; // a UserError says what happened (offline, 401, 429): toAppError shows it
    } finally {
      if (this.current === controller) this.current = null;
    }
  }
}
