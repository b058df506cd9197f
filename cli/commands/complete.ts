import type { Command } from "commander";
import {
  addGenerationOptions,
  generateText,
  loadModel,
  openBackend,
  resultJson,
  type GenerationCliOptions,
} from "./chat.ts";

interface CompleteOptions extends GenerationCliOptions {
  prompt: string;
}

/** `redwing complete`: raw text completion (BOS plus the prompt; no chat template). */
export function registerCompleteCommand(program: Command): void {
  const cmd = program
    .command("complete")
    .description("Continue a text prompt (raw completion, no chat template)")
    .requiredOption("--prompt <text>", "the text to continue");
  addGenerationOptions(cmd).action(async (opts: CompleteOptions) => {
    const loaded = await loadModel(opts);
    const ids = loaded.tokenizer.encode(opts.prompt, { addBos: true });
    const backend = await openBackend();
    try {
      const result = await generateText(backend, loaded, ids, opts);
      if (opts.json) process.stdout.write(resultJson(result, ids.length));
    } finally {
      await backend.close();
    }
  });
}
