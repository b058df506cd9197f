import { readFile } from "node:fs/promises";
import { Option, type Command } from "commander";
import { resolveModel } from "../../core/chat/model.ts";
import { ChatTemplate, loadChatTemplate } from "../../core/chat/template.ts";
import { loadTokenizer } from "../../core/chat/tokenizer.ts";
import { DEMO_LABEL } from "../../core/demo/demo.ts";
import { UserError } from "../../core/errors.ts";
import { FunctionToolSchema } from "../../core/server/schemas.ts";
import { modelFamily } from "../../core/models/index.ts";
import { readMessages } from "./chat.ts";

interface PromptOptions {
  model?: string;
  messagesFile: string;
  toolsFile?: string;
  thinking: "on" | "off";
  ids?: boolean;
  generationPrompt: boolean;
}

/** A JSON array of OpenAI function tools (`{"type": "function", "function": {...}}`). */
async function readTools(path: string): Promise<unknown[]> {
  let value: unknown;
  try {
    value = JSON.parse(await readFile(path, "utf8"));
  } catch (error) {
    throw new UserError(`cannot read --tools-file ${path}: ${(error as Error).message}`);
  }
  if (!Array.isArray(value)) {
    throw new UserError(
      `${path}: expected a JSON array of {"type": "function", "function": {...}}`,
    );
  }
  value.forEach((tool: unknown, i) => {
    const checked = FunctionToolSchema.safeParse(tool);
    if (!checked.success) {
      const issue = checked.error.issues[0]!;
      throw new UserError(`${path}: tool ${i}: ${issue.path.join(".")}: ${issue.message}`);
    }
  });
  return value;
}

/**
 * `redwing prompt`: the exact prompt a chat becomes, through the model's own chat template (as
 * llama.cpp's verbose prompt or `ollama show --template` let one check a template). The text
 * goes to stdout byte for byte, without a newline of its own; `--ids` prints the token ids the
 * engine would receive instead.
 */
export function registerPromptCommand(program: Command): void {
  program
    .command("prompt")
    .description(
      "Print the exact prompt (or token ids) a chat becomes through the model's template",
    )
    .option(
      "--model <name-or-dir>",
      "installed model name or model directory (default: the demo model)",
    )
    .requiredOption(
      "--messages-file <file>",
      'JSON array of {"role", "content"} messages, with tool_calls and tool results ("-": stdin)',
    )
    .option("--tools-file <file>", "JSON array of OpenAI function tools to declare")
    .addOption(
      new Option("--thinking <on|off>", "the model's thinking switch")
        .choices(["on", "off"])
        .default("off"),
    )
    .option("--ids", "print the prompt's token ids (comma-separated) instead of its text")
    .option("--no-generation-prompt", "leave out the start of the model's reply")
    .action(async (opts: PromptOptions) => {
      const messages = await readMessages(opts.messagesFile);
      const tools = opts.toolsFile ? await readTools(opts.toolsFile) : undefined;
      const model = await resolveModel(opts.model, () => {
        process.stderr.write("redwing: creating the built-in demo model (first use)...\n");
      });
      if (model.isDemo) process.stderr.write(`redwing: using the ${DEMO_LABEL}\n`);
      const tokenizer = await loadTokenizer(model.dir);
      const template = new ChatTemplate(
        await loadChatTemplate(
          model.dir,
          tokenizer.configTemplate,
          model.manifest.architecture.family,
        ),
      );
      const text = template.render(messages, {
        bosToken: tokenizer.bosToken,
        eosToken: tokenizer.eosToken,
        enableThinking: opts.thinking === "on",
        addGenerationPrompt: opts.generationPrompt,
        tools,
      });
      const syntax = modelFamily(model.manifest.architecture.family).tools;
      if (tools && tools.length > 0 && !(syntax && text.includes(syntax.declarationOpen))) {
        process.stderr.write(
          "redwing: warning: the model's chat template does not declare tools; the model would not see them\n",
        );
      }
      if (opts.ids) {
        process.stdout.write(`${tokenizer.encode(text, { addBos: true }).join(",")}\n`);
      } else {
        process.stdout.write(text);
      }
    });
}
