/** GET /v1/models and /v1/models/{id}: the one model this server serves. */
import type { FastifyInstance } from "fastify";
import { unknownModel, type ServerContext } from "../context.ts";

export function registerModelRoutes(app: FastifyInstance, ctx: ServerContext): void {
  const modelObject = {
    id: ctx.modelId,
    object: "model",
    created: ctx.created,
    owned_by: "redwing",
  };
  app.get("/v1/models", async () => ({ object: "list", data: [modelObject] }));
  app.get<{ Params: { id: string } }>("/v1/models/:id", async (request) => {
    if (request.params.id !== ctx.modelId) throw unknownModel(ctx, request.params.id);
    return modelObject;
  });
}
