/** `server.*`: the OpenAI-compatible server on the app's engine; its switch and port persist. */
import type { AppContext } from "../context.ts";
import { AppFailure } from "../errors.ts";
import type { HandlerGroup } from "./group.ts";

export function serverHandlers(ctx: AppContext): HandlerGroup<"server"> {
  const { server } = ctx;
  return {
    "server.status": async () => server.status(),
    "server.cancel": async ({ id }) => {
      if (!server.cancel(id)) {
        throw new AppFailure("not_found", "That server request has already finished.", null);
      }
      return { ok: true as const };
    },
    "server.set": async ({ enabled, port }) => {
      const wantedPort = port ?? ctx.settings().server.port;
      try {
        const status = await server.sync(enabled, wantedPort);
        ctx.updateSettings({ ...ctx.settings(), server: { enabled, port: wantedPort } });
        return status;
      } catch (error) {
        ctx.updateSettings({ ...ctx.settings(), server: { enabled: false, port: wantedPort } });
        throw error;
      }
    },
  };
}
