import type { Command } from "commander";
import { UserError } from "../../core/errors.ts";
import { runNative } from "../../core/native.ts";
import { addForwardPassOptions, backendOption, vramBudgetOption } from "./chat.ts";

interface LogitsOptions {
  model: string;
  tokens: string;
  mode: string;
  kvDtype: string;
  activations: string;
  chunk: string;
  threads?: string;
  backend?: string;
  vramBudget?: number;
}

function positiveInteger(value: string, flag: string): string {
  if (!/^[1-9]\d*$/.test(value)) throw new UserError(`${flag} must be a positive integer`);
  return value;
}

/**
 * `redwing logits`: the engine's logits at every position of a token sequence, as JSON
 * (`{"logits": [[...], ...]}`, one row of vocabulary-size floats per token). A correctness tool:
 * it runs the native engine (`redwing-engine logits`) and passes its output through.
 */
export function registerLogitsCommand(program: Command): void {
  const cmd = program
    .command("logits")
    .description("Print the model's logits at every position of a token sequence (JSON)")
    .requiredOption("--model <model-dir>", "an installed Redwing model directory")
    .requiredOption("--tokens <ids>", "comma-separated token ids, e.g. 2,17,99")
    .option("--mode <mode>", "prefill (batched chunks) or decode (one token at a time)", "prefill")
    .addOption(backendOption())
    .addOption(vramBudgetOption());
  addForwardPassOptions(cmd).action(async (options: LogitsOptions) => {
    const tokens = options.tokens.replace(/\s+/g, "");
    if (!/^\d+(,\d+)*$/.test(tokens)) {
      throw new UserError("--tokens must be comma-separated token ids, e.g. 2,17,99");
    }
    if (options.mode !== "prefill" && options.mode !== "decode") {
      throw new UserError("--mode must be prefill or decode");
    }
    if (options.kvDtype !== "f16" && options.kvDtype !== "f32") {
      throw new UserError("--kv-dtype must be f16 or f32");
    }
    const args = [
      "logits",
      "--model",
      options.model,
      "--tokens",
      tokens,
      "--mode",
      options.mode,
      "--kv-dtype",
      options.kvDtype,
      "--activations",
      options.activations,
      "--chunk",
      positiveInteger(options.chunk, "--chunk"),
    ];
    if (options.threads !== undefined) {
      args.push("--threads", positiveInteger(options.threads, "--threads"));
    }
    if (options.backend !== undefined) args.push("--backend", options.backend);
    if (options.vramBudget !== undefined) args.push("--vram-budget", String(options.vramBudget));
    const status = await runNative("redwing-engine", args);
    if (status !== 0) process.exitCode = status;
  });
}
