/**
 * Chat templates: the model's own Jinja template (chat_template.jinja, else tokenizer_config.json's
 * chat_template) rendered with @huggingface/jinja (configured in jinja.ts to render what Python's
 * Jinja2 renders). A directory without a template gets its family's fallback (core/models:
 * Redwing's gemma4.jinja for Gemma 4, Gemma 3's published template for Gemma 3).
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Template } from "./jinja.ts";
import { UserError } from "../errors.ts";
import {
  type FamilyId,
  type TemplateMessage,
  messagesForTemplate,
  modelFamily,
} from "../models/index.ts";

export type ChatRole = "system" | "user" | "assistant" | "tool";

/** A call the model made, as OpenAI writes it; `arguments` may be a JSON string or an object. */
export interface ChatToolCall {
  id?: string;
  type?: "function";
  function: { name: string; arguments: unknown };
}

export interface ChatMessage {
  role: ChatRole;
  content: string;
  /** Assistant messages: the calls the model made. */
  tool_calls?: ChatToolCall[];
  /** Tool messages: the call this result answers. */
  tool_call_id?: string;
  /** Tool messages: the function's name, when the call cannot be found by id. */
  name?: string;
}

export interface RenderOptions {
  bosToken?: string | null;
  eosToken?: string | null;
  /** Append the prompt that starts the model's turn. Default true. */
  addGenerationPrompt?: boolean;
  /** Gemma 4's thinking switch (`<|think|>` in the system turn). Default false. */
  enableThinking?: boolean;
  /** OpenAI-style tool declarations (`{type: "function", function: {...}}`), given to the template. */
  tools?: readonly unknown[];
}

/**
 * The chat template of a model directory: chat_template.jinja, else `configTemplate` (from
 * tokenizer_config.json), else the family's fallback.
 */
export async function loadChatTemplate(
  modelDir: string,
  configTemplate: string | null,
  family: FamilyId,
): Promise<string> {
  try {
    return await readFile(join(modelDir, "chat_template.jinja"), "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") {
      throw new UserError(
        `cannot read ${join(modelDir, "chat_template.jinja")}: ${(error as Error).message}`,
      );
    }
  }
  if (configTemplate !== null) return configTemplate;
  return modelFamily(family).fallbackChatTemplate();
}

/** Checks a parsed JSON value is a list of chat messages; names the bad entry. */
export function parseMessages(value: unknown, source: string): ChatMessage[] {
  if (!Array.isArray(value)) {
    throw new UserError(`${source}: expected a JSON array of {"role", "content"} messages`);
  }
  return value.map((m: unknown, i) => {
    const entry = m as Record<string, unknown> | null;
    if (!entry || typeof entry !== "object") {
      throw new UserError(`${source}: message ${i} is not an object`);
    }
    const role = entry.role;
    if (role !== "system" && role !== "user" && role !== "assistant" && role !== "tool") {
      throw new UserError(
        `${source}: message ${i} has role ${JSON.stringify(role)}; expected system, user, assistant or tool`,
      );
    }
    const content = entry.content ?? (role === "assistant" && entry.tool_calls ? "" : undefined);
    if (typeof content !== "string") {
      throw new UserError(`${source}: message ${i} has no string "content"`);
    }
    const message: ChatMessage = { role, content };
    if (entry.tool_calls !== undefined) {
      if (role !== "assistant" || !Array.isArray(entry.tool_calls)) {
        throw new UserError(`${source}: message ${i}: "tool_calls" must be a list on an assistant`);
      }
      message.tool_calls = entry.tool_calls.map((c: unknown, j) => {
        const call = c as { id?: unknown; function?: { name?: unknown; arguments?: unknown } };
        if (typeof call?.function?.name !== "string") {
          throw new UserError(`${source}: message ${i}: tool call ${j} has no function name`);
        }
        return {
          ...(typeof call.id === "string" ? { id: call.id } : {}),
          type: "function",
          function: { name: call.function.name, arguments: call.function.arguments ?? {} },
        };
      });
    }
    if (role === "tool") {
      if (typeof entry.tool_call_id === "string") message.tool_call_id = entry.tool_call_id;
      if (typeof entry.name === "string") message.name = entry.name;
    }
    return message;
  });
}

/**
 * Brings messages into the shape templates read: tool-call arguments sent as a JSON string
 * (OpenAI's wire form) become objects, then the family whose template this is places what only
 * it places (Gemma 4 folds tool results into the model turn that made the calls; a tool result
 * that answers no call is refused rather than dropped).
 */
export function templateMessages(
  template: string,
  messages: readonly ChatMessage[],
): TemplateMessage[] {
  const entries = messages.map((m) => {
    const entry: TemplateMessage = { role: m.role, content: m.content };
    if (m.tool_calls) {
      entry.tool_calls = m.tool_calls.map((c) => ({
        ...c,
        function: { name: c.function.name, arguments: argumentsObject(c.function.arguments) },
      }));
    }
    if (m.tool_call_id !== undefined) entry.tool_call_id = m.tool_call_id;
    if (m.name !== undefined) entry.name = m.name;
    return entry;
  });
  return messagesForTemplate(template, entries);
}

/** A JSON-object string becomes the object; anything else is left for the template to judge. */
function argumentsObject(args: unknown): unknown {
  if (typeof args !== "string") return args;
  try {
    const parsed = JSON.parse(args) as unknown;
    return parsed && typeof parsed === "object" && !Array.isArray(parsed) ? parsed : args;
  } catch {
    return args;
  }
}

/** A chat template compiled once, rendered per request. */
export class ChatTemplate {
  private readonly compiled: Template;

  constructor(readonly text: string) {
    try {
      this.compiled = new Template(text);
    } catch (error) {
      throw new UserError(`the chat template does not parse: ${(error as Error).message}`);
    }
  }

  /** Renders `messages`; template errors (and tool results that answer no call) are UserErrors. */
  render(messages: readonly ChatMessage[], options: RenderOptions = {}): string {
    const prepared = templateMessages(this.text, messages);
    try {
      return this.compiled.render({
        messages: prepared,
        bos_token: options.bosToken ?? "",
        eos_token: options.eosToken ?? "",
        add_generation_prompt: options.addGenerationPrompt ?? true,
        enable_thinking: options.enableThinking ?? false,
        ...(options.tools && options.tools.length > 0 ? { tools: options.tools } : {}),
      });
    } catch (error) {
      throw new UserError(`cannot render the chat: ${(error as Error).message}`);
    }
  }
}

/** Renders `messages` with a Jinja chat template; template errors become UserErrors. */
export function renderChat(
  template: string,
  messages: readonly ChatMessage[],
  options: RenderOptions = {},
): string {
  return new ChatTemplate(template).render(messages, options);
}
