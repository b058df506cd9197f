import type { Command } from "commander";
import { registerImportCommand } from "./import.ts";
import { registerLogitsCommand } from "./logits.ts";
import { registerVerifyCommand } from "./verify.ts";
import { registerSynthCommand } from "./synth.ts";
import { registerChatCommand } from "./chat.ts";
import { registerCompleteCommand } from "./complete.ts";
import { registerModelsCommand } from "./models.ts";
import { registerInstallCommand } from "./install.ts";
import { registerServeCommand } from "./serve.ts";
import { registerUiCommand } from "./ui.ts";
import { registerPromptCommand } from "./prompt.ts";
import { registerPerplexityCommand } from "./perplexity.ts";
import { registerSearchCommand } from "./search.ts";

/** Each command lives in its own file and registers itself here. */
export function registerCommands(program: Command): void {
  void program;
  registerImportCommand(program);
  registerVerifyCommand(program);
  registerSynthCommand(program);
  registerLogitsCommand(program);
  registerChatCommand(program);
  registerCompleteCommand(program);
  registerModelsCommand(program);
  registerInstallCommand(program);
  registerSearchCommand(program);
  registerServeCommand(program);
  registerUiCommand(program);
  registerPromptCommand(program);
  registerPerplexityCommand(program);
}
