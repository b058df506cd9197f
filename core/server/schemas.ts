/**
 * The OpenAI request bodies the server accepts, as zod schemas. Unknown fields are ignored (as
 * OpenAI's own SDKs add new ones over time); fields that would change the answer but are not
 * supported (n > 1, logprobs, echo, ...) are refused with a 400 rather than silently ignored.
 */
import { z } from "zod";

const TextPart = z.object({ type: z.literal("text"), text: z.string() });
/** A message's content: a string, or a list of text parts (images and audio are refused). */
const Content = z.union([z.string(), z.array(TextPart)]);

const ToolCall = z.object({
  id: z.string().optional(),
  type: z.literal("function").optional(),
  function: z.object({ name: z.string(), arguments: z.string() }),
});

export const MessageSchema = z.discriminatedUnion("role", [
  z.object({ role: z.literal("system"), content: Content, name: z.string().optional() }),
  z.object({ role: z.literal("developer"), content: Content, name: z.string().optional() }),
  z.object({ role: z.literal("user"), content: Content, name: z.string().optional() }),
  z.object({
    role: z.literal("assistant"),
    content: Content.nullable().optional(),
    name: z.string().optional(),
    tool_calls: z.array(ToolCall).optional(),
  }),
  z.object({ role: z.literal("tool"), content: Content, tool_call_id: z.string() }),
]);
export type Message = z.infer<typeof MessageSchema>;

export const FunctionToolSchema = z.object({
  type: z.literal("function"),
  function: z.object({
    name: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "a function name: letters, digits, _ and -"),
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).optional(),
    strict: z.boolean().nullable().optional(),
  }),
});
export type FunctionTool = z.infer<typeof FunctionToolSchema>;

export const ToolChoiceSchema = z.union([
  z.enum(["auto", "none", "required"]),
  z.object({ type: z.literal("function"), function: z.object({ name: z.string() }) }),
]);
export type ToolChoice = z.infer<typeof ToolChoiceSchema>;

const Stop = z
  .union([z.string(), z.array(z.string()).max(4)])
  .nullable()
  .optional();

/** Sampling and length fields common to both endpoints. */
const common = {
  model: z.string().min(1),
  temperature: z.number().min(0).max(2).nullable().optional(),
  top_p: z.number().min(0).max(1).nullable().optional(),
  /** Not OpenAI's, but common among local servers (vLLM, llama.cpp). */
  top_k: z.number().int().min(0).nullable().optional(),
  repetition_penalty: z.number().positive().nullable().optional(),
  seed: z.number().int().min(0).nullable().optional(),
  stop: Stop,
  max_tokens: z.number().int().min(1).nullable().optional(),
  n: z.literal(1).nullable().optional(),
  stream: z.boolean().nullable().optional(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).nullable().optional(),
  /** vLLM's extension: generate through end-of-turn tokens (benchmarks and tests). */
  ignore_eos: z.boolean().optional(),
  user: z.string().optional(),
  // Accepted only at their no-op values.
  frequency_penalty: z.literal(0).nullable().optional(),
  presence_penalty: z.literal(0).nullable().optional(),
  logprobs: z.literal(false).nullable().optional(),
};

export const ChatRequestSchema = z.object({
  ...common,
  messages: z.array(MessageSchema).min(1),
  max_completion_tokens: z.number().int().min(1).nullable().optional(),
  tools: z.array(FunctionToolSchema).optional(),
  tool_choice: ToolChoiceSchema.optional(),
  parallel_tool_calls: z.boolean().optional(),
  top_logprobs: z.literal(0).nullable().optional(),
});
export type ChatRequest = z.infer<typeof ChatRequestSchema>;

export const CompletionRequestSchema = z.object({
  ...common,
  prompt: z.union([z.string(), z.array(z.string()).length(1)]),
  echo: z.literal(false).nullable().optional(),
  best_of: z.literal(1).nullable().optional(),
  suffix: z.null().optional(),
});
export type CompletionRequest = z.infer<typeof CompletionRequestSchema>;

/** The text of a message's content. */
export function contentText(content: string | { text: string }[] | null | undefined): string {
  if (content === null || content === undefined) return "";
  return typeof content === "string" ? content : content.map((p) => p.text).join("");
}
