/**
 * Tool calls on the OpenAI-compatible server: the loaded model family's tool syntax (core/models:
 * `modelFamily(family).tools`; today only Gemma 4 has one) turned into OpenAI's `tool_calls`. Output that starts
 * a tool call but does not parse fails closed: an error, never a half-understood call or the raw
 * markup passed off as text.
 */
import { randomUUID } from "node:crypto";
import { MalformedToolCall, type ToolParseOptions, type ToolSyntax } from "../models/index.ts";
import { ApiError } from "./errors.ts";
import type { FunctionTool, ToolChoice } from "./schemas.ts";

export interface OpenAiToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface ParsedToolCalls {
  /** Text before the first call (often empty). */
  content: string;
  calls: OpenAiToolCall[];
}

/**
 * The tool calls in a generated text, or null when it has none (plain text). Text with
 * malformed calls throws an ApiError (fail closed). `allowed` names the functions the request
 * declared: a call to any other is malformed too.
 */
export function parseToolCalls(
  syntax: ToolSyntax,
  text: string,
  allowed?: readonly string[],
  options: ToolParseOptions = {},
): ParsedToolCalls | null {
  let parsed;
  try {
    parsed = syntax.parse(text, allowed, options);
  } catch (error) {
    if (error instanceof MalformedToolCall) throw malformed(error.message);
    throw error;
  }
  if (!parsed) return null;
  return {
    content: parsed.content,
    calls: parsed.calls.map((call) => ({
      id: `call_${randomUUID().replaceAll("-", "").slice(0, 24)}`,
      type: "function",
      function: { name: call.name, arguments: JSON.stringify(call.arguments) },
    })),
  };
}

function malformed(detail: string): ApiError {
  return new ApiError(
    500,
    `the model produced a malformed tool call (${detail})`,
    "server_error",
    "tool_call_parse_error",
  );
}

/**
 * The generation prompt for a tool request. The template has already declared the tools (Gemma
 * 4's template does); `required` and a named choice are enforced by starting the model's turn
 * with the call opener (and the name), which `toolOutputPrefix` gives back for parsing.
 */
export function renderToolPrompt(
  syntax: ToolSyntax,
  prompt: string,
  tools: readonly FunctionTool[],
  choice: ToolChoice | undefined,
): string {
  // A template without tool support renders the chat without them: the model would never
  // know of the tools, so refuse instead of answering as if they had been offered.
  const missing = tools.filter((t) => !prompt.includes(t.function.name));
  if (!prompt.includes(syntax.declarationOpen) || missing.length > 0) {
    throw new ApiError(
      400,
      "the model's chat template does not declare tools (it has no tool support); use a model whose template does",
      "invalid_request_error",
      "tools_unsupported",
      "tools",
    );
  }
  return prompt + toolOutputPrefix(syntax, choice);
}

/** What the prompt ends with for `choice`, which the model's output continues. */
export function toolOutputPrefix(syntax: ToolSyntax, choice: ToolChoice | undefined): string {
  if (choice === "required") return syntax.forcedCallPrefix();
  if (choice && typeof choice === "object") return syntax.forcedCallPrefix(choice.function.name);
  return "";
}
