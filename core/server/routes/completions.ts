/** POST /v1/completions: raw text completion (BOS plus the prompt; no chat template). */
import type { FastifyInstance } from "fastify";
import { completionFormat, prepare, runCompletion } from "../completion.ts";
import { checkPromptLength, parseBody, type ServerContext } from "../context.ts";
import { CompletionRequestSchema } from "../schemas.ts";

export function registerCompletionsRoute(app: FastifyInstance, ctx: ServerContext): void {
  app.post("/v1/completions", async (request, reply) => {
    const body = parseBody(CompletionRequestSchema, request.body);
    const prompt = typeof body.prompt === "string" ? body.prompt : body.prompt[0]!;
    checkPromptLength(ctx, prompt.length, "prompt");
    const tokens = await ctx.tokenizer.encodeAsync(prompt, { addBos: true });
    return runCompletion(
      ctx,
      reply,
      prepare(ctx, body, tokens, body.max_tokens, null),
      completionFormat,
    );
  });
}
