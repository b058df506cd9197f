import type { Command } from "commander";
import { UserError } from "../../core/errors.ts";
import { verifyModelFiles, type FileCheck } from "../../core/format/read.ts";

function describe(check: FileCheck): string {
  switch (check.status) {
    case "ok":
      return `ok       ${check.path}`;
    case "missing":
      return `MISSING  ${check.path}`;
    case "size":
      return `BAD      ${check.path}: size ${check.detail ?? ""}`;
    case "sha256":
      return `BAD      ${check.path}: ${check.detail ?? ""}`;
    case "not_regular":
      return `BAD      ${check.path}: ${check.detail ?? "not a regular file"}`;
    case "unexpected":
      return `EXTRA    ${check.path}: ${check.detail ?? "not part of the model"}`;
  }
}

export function registerVerifyCommand(program: Command): void {
  program
    .command("verify")
    .description(
      "Rehash every file of a model directory against its manifest (without loading the model)",
    )
    .argument("<model-dir>", "an installed Redwing model directory")
    .action(async (modelDir: string) => {
      const { checks } = await verifyModelFiles(modelDir, (check) => {
        process.stdout.write(`${describe(check)}\n`);
      });
      const bad = checks.filter((c) => c.status !== "ok");
      if (bad.length > 0) {
        throw new UserError(
          `${modelDir} does not match its manifest: ${bad.map((c) => `${c.path} (${c.status === "sha256" ? "contents differ" : c.status.replace("_", " ")})`).join(", ")}; reinstall the model`,
          "model_corrupt",
        );
      }
      process.stdout.write(`all ${checks.length} files match the manifest\n`);
    });
}
