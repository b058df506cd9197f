/**
 * `connections.*`: the saved OpenAI-compatible endpoints (add, edit, test, remove). Removing the
 * connection a chat was using puts the chat back on the local model.
 */
import type { AppContext } from "../context.ts";
import { AppFailure } from "../errors.ts";
import type { HandlerGroup } from "./group.ts";

export function connectionsHandlers(ctx: AppContext): HandlerGroup<"connections"> {
  const { connections } = ctx;
  return {
    "connections.list": async () => connections.list(),
    "connections.add": async (input) => connections.add(input),
    "connections.update": async ({ id, ...patch }) => connections.update(id, patch),
    "connections.test": async ({ id }) => {
      const c = await connections.refresh(id);
      if (c.error)
        throw new AppFailure(c.error.code, c.error.message, c.error.action, c.error.detail);
      return c;
    },
    "connections.remove": async ({ id }) => {
      await connections.remove(id);
      if (ctx.settings().remote?.connectionId === id) {
        ctx.updateSettings({ ...ctx.settings(), remote: null });
      }
      return { ok: true as const };
    },
  };
}
