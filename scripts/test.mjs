#!/usr/bin/env node
// Runs every test suite in order and stops at the first failure: static checks, C++ tests
// (ctest), TypeScript tests (vitest), then the app's end-to-end tests (Playwright in Debian's
// Chromium against web mode, and in Electron where its binary exists).
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const CHROMIUM = "/usr/bin/chromium";
const steps = [
  ["typecheck", "npx", ["tsc", "--noEmit", "-p", "."]],
  ["typecheck (renderer)", "npx", ["tsc", "--noEmit", "-p", "renderer"]],
  ["eslint", "npx", ["eslint", "."]],
  ["prettier", "npx", ["prettier", "--check", "."]],
  ["clang-format", "node", ["scripts/clang-format.mjs", "--check"]],
  // The Metal kernels are SPIRV-Cross's output for the current GPU kernels (Debian's tools; a
  // Mac compiles them with Xcode instead), and the engine cross-compiles for macOS on Linux.
  ...(process.platform === "darwin"
    ? []
    : [
        ["Metal kernels", "node", ["scripts/metal-kernels.mjs", "--check"]],
        ["macOS cross build", "node", ["scripts/macos-cross.mjs"]],
      ]),
  ["C++ tests", "ctest", ["--test-dir", "native/build", "--output-on-failure", "-j2"]],
  // AddressSanitizer + UndefinedBehaviorSanitizer: the C++ tests again, then each libFuzzer
  // target for a few seconds from its seed corpus (docs/security.md "Fuzzing").
  ["sanitizer build", "node", ["scripts/setup.mjs", "--sanitizers"]],
  [
    "C++ tests (ASan + UBSan)",
    "ctest",
    ["--test-dir", "native/build-asan", "--output-on-failure", "-j2"],
  ],
  ["fuzz (native, bounded)", "node", ["scripts/fuzz.mjs", "--seconds", "10", "--native-only"]],
  ["TypeScript tests", "npx", ["vitest", "run"]],
  // The browser the e2e tests drive: a Debian package, installed only for testing.
  ...(existsSync(CHROMIUM) ? [] : [["chromium", "node", ["scripts/setup.mjs", "--chromium"]]]),
  ["e2e", "npx", ["playwright", "test"]],
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
