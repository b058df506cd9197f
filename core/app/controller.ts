/**
 * The app's main-process logic, the same for Electron and web mode: `createAppController`
 * wires settings, conversations, the one engine, chat, downloads, installed models, the live
 * sampler and the OpenAI-compatible server (context.ts) behind `AppBackend` (api.ts), with one
 * handler group per area of the API (handlers/). Every call answers data that matches its result
 * schema, or rejects with an AppCallError carrying an AppError (`toAppError` turns anything into
 * one); events go to every subscriber.
 *
 * At start the demo model is made if missing and the active model (the demo when none) is
 * loaded in the background; `ready` settles when that is done.
 */
import { join } from "node:path";
import type { z } from "zod";
import { DEMO_MODEL_NAME, ensureDemoModel } from "../demo/demo.ts";
import { exists } from "../fs.ts";
import { API, AppCallError, type AppBackend, type Method, type Result } from "./api.ts";
import { createAppContext, type AppContext, type AppControllerOptions } from "./context.ts";
import { AppFailure, toAppError } from "./errors.ts";
import { createHandlers } from "./handlers/index.ts";

export type { AppControllerOptions } from "./context.ts";

export interface AppController extends AppBackend {
  /** Settles when the start-up work (demo model, first load, server) is done. */
  readonly ready: Promise<void>;
  /** Stops replies, the server, downloads (keeping partials), the sampler, then the engine. */
  close(): Promise<void>;
}

export async function createAppController(options: AppControllerOptions): Promise<AppController> {
  const ctx = createAppContext(options);
  const { engine, live, log, lifecycle } = ctx;
  const handlers = createHandlers(ctx);

  // Chat requests made meanwhile wait for this (engine.settled) instead of finding no model.
  const ready = engine.track(startUp(ctx));

  live.start();
  // Each connection's models, for the picker; failures stay with their connection.
  ctx.connections.refreshAll().catch((e: unknown) => log(`connections: ${toAppError(e).message}`));

  return {
    ready,
    async call<M extends Method>(
      method: M,
      params: z.infer<(typeof API)[M]["params"]>,
    ): Promise<Result<M>> {
      if (lifecycle.closing) {
        throw new AppCallError({ code: "closing", message: "The app is closing.", action: null });
      }
      let result: unknown;
      try {
        const handler = handlers[method] as (p: unknown) => Promise<unknown>;
        if (!handler) throw new AppFailure("unknown_method", `unknown call "${method}"`);
        result = await handler(params ?? {});
      } catch (error) {
        throw error instanceof AppCallError ? error : new AppCallError(toAppError(error));
      }
      const checked = API[method].result.safeParse(result);
      if (!checked.success) {
        // A bug here, not the caller's fault: say so rather than send a wrong shape.
        const issue = checked.error.issues[0];
        throw new AppCallError({
          code: "internal",
          message: `Something went wrong: the answer to ${method} is malformed.`,
          action: null,
          detail: `${issue?.path.join(".")}: ${issue?.message}`,
        });
      }
      return checked.data as Result<M>;
    },
    subscribe(listener) {
      ctx.listeners.add(listener);
      return () => ctx.listeners.delete(listener);
    },
    async close() {
      if (lifecycle.closing) return;
      // No new calls from here; the stopped replies still announce themselves (chat.done).
      lifecycle.closing = true;
      live.stop();
      await ctx.chat.stopAll();
      await ctx.server.close().catch((e: unknown) => log(`closing the server: ${String(e)}`));
      await ctx.downloads.close().catch((e: unknown) => log(`stopping downloads: ${String(e)}`));
      ctx.models.close();
      await engine.close();
      await ready.catch(() => undefined);
      await ctx.conversations.flush();
      ctx.listeners.clear();
    },
  };
}

/**
 * Makes the demo model if missing, then loads the active model (the demo when the active one is
 * not installed any more, with a notice). Failures are logged: the app starts without a model.
 */
async function startUp(ctx: AppContext): Promise<void> {
  if (ctx.options.autoLoad === false) return;
  try {
    await ensureDemoModel(join(ctx.modelsDir, DEMO_MODEL_NAME));
  } catch (error) {
    ctx.log(`cannot make the demo model: ${toAppError(error).message}`);
  }
  ctx.emitModels();
  let name = ctx.activeName();
  if (name !== DEMO_MODEL_NAME && !(await exists(join(ctx.modelsDir, name, "manifest.json")))) {
    ctx.notice(
      `The active model "${name}" is not installed any more; the demo model is loaded instead.`,
    );
    ctx.updateSettings({ ...ctx.settings(), activeModel: null });
    name = DEMO_MODEL_NAME;
  }
  if (ctx.lifecycle.closing) return;
  try {
    await ctx.engine.load(name);
  } catch (error) {
    ctx.log(`cannot load ${name}: ${toAppError(error).message}`);
  }
}
