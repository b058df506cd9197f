/** `app.info` (version, platform, paths, features, start-up notices) and `live.history`. */
import { arch, availableParallelism, platform, totalmem } from "node:os";
import type { AppContext } from "../context.ts";
import { APP_VERSION } from "../settings.ts";
import type { HandlerGroup } from "./group.ts";

export function appHandlers(ctx: AppContext): HandlerGroup<"app" | "live"> {
  const { options } = ctx;
  return {
    "app.info": async () => ({
      version: APP_VERSION,
      shell: options.shell,
      platform: platform(),
      arch: arch(),
      dataDir: ctx.dataDir,
      modelsDir: ctx.modelsDir,
      hardwareThreads: availableParallelism(),
      totalMemoryBytes: totalmem(),
      features: {
        energy: ctx.power !== null,
        // Electron passes a reader everywhere; only macOS reports a state.
        thermal:
          options.thermal !== undefined && (platform() === "darwin" || options.thermal() !== null),
        reveal: options.reveal !== undefined,
      },
      ...(ctx.notices.length > 0 ? { notices: [...ctx.notices] } : {}),
    }),

    "live.history": async () => [...ctx.live.history],
  };
}
