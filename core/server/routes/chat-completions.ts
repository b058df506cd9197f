/**
 * POST /v1/chat/completions: the messages rendered with the model's chat template, with tool
 * declarations, tool calls and tool results where the template puts them (core/server/tools.ts).
 */
import type { FastifyInstance } from "fastify";
import type { ChatMessage } from "../../chat/template.ts";
import { chatFormat, prepare, runCompletion } from "../completion.ts";
import { checkPromptLength, parseBody, type ServerContext } from "../context.ts";
import { ApiError } from "../errors.ts";
import { ChatRequestSchema, contentText } from "../schemas.ts";
import { renderToolPrompt, toolOutputPrefix } from "../tools.ts";

export function registerChatCompletionsRoute(app: FastifyInstance, ctx: ServerContext): void {
  const { tokenizer, template, modelId } = ctx;
  app.post("/v1/chat/completions", async (request, reply) => {
    const body = parseBody(ChatRequestSchema, request.body);
    const toolsOn = (body.tools?.length ?? 0) > 0 && body.tool_choice !== "none";
    const syntax = ctx.tools;
    if (toolsOn && (syntax === null || tokenizer.tokenId(syntax.callOpen) === null)) {
      throw new ApiError(
        400,
        `the model "${modelId}" cannot call tools: its family has no tool-call format or its vocabulary lacks the tool tokens (Gemma 4 models can)`,
        "invalid_request_error",
        "tools_unsupported",
        "tools",
      );
    }
    const choice = body.tool_choice;
    if (toolsOn && choice && typeof choice === "object") {
      if (!body.tools!.some((t) => t.function.name === choice.function.name)) {
        throw new ApiError(
          400,
          `tool_choice names "${choice.function.name}", which is not in tools`,
          "invalid_request_error",
          "invalid_value",
          "tool_choice",
        );
      }
    }
    // Tool results are placed by the template module (inside the model turn for Gemma 4).
    const messages = body.messages.map((m): ChatMessage => {
      const base: ChatMessage = {
        role: m.role === "developer" ? "system" : m.role,
        content: contentText(m.content),
      };
      if (m.role === "assistant" && m.tool_calls) base.tool_calls = m.tool_calls;
      if (m.role === "tool") base.tool_call_id = m.tool_call_id;
      return base;
    });
    checkPromptLength(
      ctx,
      messages.reduce((n, m) => n + (m.content as string).length, 0),
      "messages",
    );
    let text: string;
    try {
      text = template.render(messages, {
        bosToken: tokenizer.bosToken,
        eosToken: tokenizer.eosToken,
        ...(toolsOn ? { tools: body.tools } : {}),
      });
    } catch (error) {
      throw new ApiError(
        400,
        `the model's chat template cannot render these messages: ${(error as Error).message}`,
        "invalid_request_error",
        "template_error",
        "messages",
      );
    }
    if (toolsOn) text = renderToolPrompt(syntax!, text, body.tools ?? [], body.tool_choice);
    checkPromptLength(ctx, text.length, "messages");
    const tokens = await tokenizer.encodeAsync(text, { addBos: true });
    const prepared = prepare(
      ctx,
      body,
      tokens,
      body.max_completion_tokens ?? body.max_tokens,
      toolsOn
        ? {
            syntax: syntax!,
            names: body.tools!.map((t) => t.function.name),
            prefix: toolOutputPrefix(syntax!, choice),
          }
        : null,
    );
    return runCompletion(ctx, reply, prepared, chatFormat);
  });
}
