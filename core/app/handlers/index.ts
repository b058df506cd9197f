/**
 * Every API method's handler, from the groups in this folder: app and live, settings, models,
 * engine, chat, server. The type checker holds the union to the API: a method without a handler
 * does not compile.
 */
import type { AppContext } from "../context.ts";
import { appHandlers } from "./app.ts";
import { chatHandlers } from "./chat.ts";
import { connectionsHandlers } from "./connections.ts";
import { engineHandlers } from "./engine.ts";
import type { Handlers } from "./group.ts";
import { modelsHandlers } from "./models.ts";
import { serverHandlers } from "./server.ts";
import { settingsHandlers } from "./settings.ts";

export type { Handler, HandlerGroup, Handlers } from "./group.ts";

export function createHandlers(ctx: AppContext): Handlers {
  return {
    ...appHandlers(ctx),
    ...settingsHandlers(ctx),
    ...modelsHandlers(ctx),
    ...engineHandlers(ctx),
    ...chatHandlers(ctx),
    ...serverHandlers(ctx),
    ...connectionsHandlers(ctx),
  };
}
