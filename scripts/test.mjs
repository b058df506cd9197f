#!/usr/bin/env node
// Runs every test suite in order and stops at the first failure:
// static checks, TypeScript tests (vitest), C++ tests (ctest).
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const steps = [
  ["typecheck", "npx", ["tsc", "--noEmit", "-p", "."]],
  ["eslint", "npx", ["eslint", "."]],
  ["prettier", "npx", ["prettier", "--check", "."]],
  ["clang-format", "node", ["scripts/clang-format.mjs", "--check"]],
  ["C++ tests", "ctest", ["--test-dir", "native/build", "--output-on-failure", "-j2"]],
  ["TypeScript tests", "npx", ["vitest", "run"]],
];

for (const [name, command, args] of steps) {
  console.error(`\n=== ${name}`);
  const started = Date.now();
  const result = spawnSync(command, args, { stdio: "inherit", cwd: root });
  console.error(
    `=== ${name}: ${result.status === 0 ? "ok" : "FAILED"} in ${((Date.now() - started) / 1000).toFixed(1)} s`,
  );
  if (result.status !== 0) process.exit(result.status ?? 1);
}
