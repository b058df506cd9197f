/** GET /health: the model, the engine's process, the queue and the request metrics. */
import type { FastifyInstance } from "fastify";
import type { ServerContext } from "../context.ts";

export function registerHealthRoute(app: FastifyInstance, ctx: ServerContext): void {
  app.get("/health", async () => ({
    status: "ok",
    model: ctx.modelId,
    engine_pid: ctx.engine().pid ?? null,
    queue: { active: ctx.queue.active, waiting: ctx.queue.waiting, limit: ctx.queue.limit },
    metrics: ctx.metrics,
  }));
}
