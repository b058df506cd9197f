#!/usr/bin/env node
// Runs every test suite in order and stops at the first failure: static checks, C++ tests
// (ctest), TypeScript tests (vitest), then the app's end-to-end tests (Playwright in Debian's
// Chromium against web mode, and in Electron where its binary exists).
//
// The two check builds (the macOS cross build and the sanitizer build) depend on nothing the
// earlier steps make and write only their own build directories, so they start at once in the
// background, at low priority: they use the core that the single-threaded checks (tsc, eslint,
// prettier) leave idle. Each is still reported at its place in the order, with its output; the
// run waits for it there and stops there if it failed (a failing earlier step stops it too).
import { spawn, spawnSync } from "node:child_process";
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
        ["macOS cross build", "node", ["scripts/macos-cross.mjs"], { background: true }],
      ]),
  ["C++ tests", "ctest", ["--test-dir", "native/build", "--output-on-failure", "-j2"]],
  // AddressSanitizer + UndefinedBehaviorSanitizer: the C++ tests again, then each libFuzzer
  // target for a few seconds from its seed corpus (docs/security.md "Fuzzing").
  ["sanitizer build", "node", ["scripts/setup.mjs", "--sanitizers"], { background: true }],
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

const seconds = (ms) => (ms / 1000).toFixed(1);

/** A step started in the background: its output is kept and printed at its place in the order. */
function startInBackground(command, args) {
  // nice(1): the foreground step keeps its core; the build takes what is left. Its own process
  // group, so that stopping the run stops the compilers under it too.
  const child = spawn("nice", ["-n", "10", command, ...args], {
    cwd: root,
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  const job = { child, started: Date.now(), output: [], finished: 0 };
  child.stdout.on("data", (chunk) => job.output.push(chunk));
  child.stderr.on("data", (chunk) => job.output.push(chunk));
  job.done = new Promise((resolve) => {
    child.on("error", (error) => {
      job.output.push(Buffer.from(`${command}: ${error.message}\n`));
      job.finished = Date.now();
      resolve(1);
    });
    child.on("close", (code, signal) => {
      job.finished = Date.now();
      resolve(signal ? 1 : (code ?? 1));
    });
  });
  return job;
}

const background = new Map();
function stopBackground() {
  for (const job of background.values()) {
    if (job.finished) continue;
    try {
      process.kill(-job.child.pid, "SIGTERM");
    } catch {
      // already gone
    }
  }
}
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    stopBackground();
    process.exit(130);
  });
}

// The sanitizer build's Debian packages (clang, its runtimes) first, in the foreground: apt-get
// may need sudo's password, and no two apt-gets may run at once.
if (
  spawnSync("node", ["scripts/setup.mjs", "--sanitizers", "--packages-only"], {
    stdio: "inherit",
    cwd: root,
  }).status !== 0
)
  process.exit(1);
for (const [name, command, args, options] of steps) {
  if (options?.background) background.set(name, startInBackground(command, args));
}

for (const [name, command, args] of steps) {
  console.error(`\n=== ${name}`);
  const started = Date.now();
  let status;
  let note = "";
  const job = background.get(name);
  if (job) {
    status = await job.done;
    process.stderr.write(Buffer.concat(job.output));
    note = ` (in the background since the start of the run: ${seconds(job.finished - job.started)} s)`;
  } else {
    status = spawnSync(command, args, { stdio: "inherit", cwd: root }).status;
  }
  console.error(
    `=== ${name}: ${status === 0 ? "ok" : "FAILED"} in ${seconds(Date.now() - started)} s${note}`,
  );
  if (status !== 0) {
    stopBackground();
    process.exit(status ?? 1);
  }
}
