#!/usr/bin/env node
// Formats (or with --check, verifies) every C++ source under native/.
import { execFileSync, spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const check = process.argv.includes("--check");
const files = execFileSync(
  "git",
  ["ls-files", "--cached", "--others", "--exclude-standard", "native"],
  { cwd: root },
)
  .toString()
  .split("\n")
  .filter((f) => /\.(cpp|h|hpp|cc|mm)$/.test(f));
if (files.length === 0) process.exit(0);
const args = check ? ["--dry-run", "--Werror", ...files] : ["-i", ...files];
const result = spawnSync("clang-format", args, { cwd: root, stdio: "inherit" });
if (result.status !== 0 && check) console.error("C++ formatting differs: run `npm run format`");
process.exit(result.status ?? 1);
