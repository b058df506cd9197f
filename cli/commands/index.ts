import type { Command } from "commander";
import { registerImportCommand } from "./import.ts";
import { registerLogitsCommand } from "./logits.ts";
import { registerVerifyCommand } from "./verify.ts";
import { registerSynthCommand } from "./synth.ts";

/** Each command lives in its own file and registers itself here. */
export function registerCommands(program: Command): void {
  void program;
  registerImportCommand(program);
  registerVerifyCommand(program);
  registerSynthCommand(program);
  registerLogitsCommand(program);
}
