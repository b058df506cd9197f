/** `engine.*`: status, load (which makes the model the active one), unload, reload. */
import { DEMO_MODEL_NAME } from "../../demo/demo.ts";
import type { AppContext } from "../context.ts";
import type { HandlerGroup } from "./group.ts";

export function engineHandlers(ctx: AppContext): HandlerGroup<"engine"> {
  const { engine } = ctx;
  return {
    "engine.status": async () => engine.status(),
    "engine.load": async ({ model }) => {
      const name = model ?? ctx.activeName();
      if (name !== DEMO_MODEL_NAME) await ctx.models.entry(name); // not installed: a clear error
      const status = await engine.load(name);
      const { activeModel } = ctx.settings();
      if (activeModel !== name && !(name === DEMO_MODEL_NAME && activeModel === null)) {
        ctx.updateSettings({ ...ctx.settings(), activeModel: name });
      }
      return status;
    },
    "engine.unload": async () => engine.unload(),
    "engine.reload": async () => engine.reload(ctx.activeName()),
  };
}
