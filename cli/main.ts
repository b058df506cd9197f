import { Command, CommanderError } from "commander";
import { UserError } from "../core/errors.ts";
import { registerCommands } from "./commands/index.ts";

/** Runs the `redwing` command line and returns the process exit status. */
export async function main(argv: string[]): Promise<number> {
  const program = new Command()
    .name("redwing")
    .description("Run large language models on ordinary machines.")
    .exitOverride()
    .showHelpAfterError();
  registerCommands(program);
  try {
    await program.parseAsync(argv);
    return typeof process.exitCode === "number" ? process.exitCode : 0;
  } catch (error) {
    if (error instanceof CommanderError) return error.exitCode;
    if (error instanceof UserError) {
      process.stderr.write(`redwing: ${error.message}\n`);
      return 1;
    }
    throw error;
  }
}
