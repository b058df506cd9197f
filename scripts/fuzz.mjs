#!/usr/bin/env node
// Runs the fuzzers for a bounded time and prints how many inputs each one tried:
//   - libFuzzer targets in native/fuzz/ (AddressSanitizer + UndefinedBehaviorSanitizer, built in
//     native/build-asan by `node scripts/setup.mjs --sanitizers`): the manifest reader, the decode
//     service's message parser, the routing trace reader;
//   - fast-check properties on the TypeScript manifest reader (core/format/manifest.fuzz.test.ts).
//
//   npm run fuzz -- --seconds 600        every target for 600 s each
//   node scripts/fuzz.mjs --seconds 10 --native-only    (what `npm test` runs)
//   node scripts/fuzz.mjs --target protocol --seconds 60
//
// The native targets run side by side, one per core.
//
// Seed corpora live in native/fuzz/corpus/<target>/ and are read, never written: new inputs go to
// a temporary directory. A crash or sanitizer report fails the run; its reproducer is copied to
// native/fuzz/crashes/<target>/ (fix the bug, then move the file into the seed corpus so every
// later run replays it).
import { spawn, spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const seconds = Number(option("seconds", "10"));
const only = option("target", null);
const nativeOnly = args.includes("--native-only");
const tsOnly = args.includes("--ts-only");
if (!(seconds > 0)) {
  console.error("fuzz: --seconds must be a positive number");
  process.exit(2);
}

const build = join(root, "native", "build-asan");
const nativeTargets = ["manifest", "protocol", "routing_trace"];
const results = [];
let failed = false;

/** A child process's exit status and stderr (libFuzzer reports on stderr). */
function runForStderr(command, args, options) {
  return new Promise((resolve) => {
    const child = spawn(command, args, { ...options, stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk) => (stderr += chunk));
    child.on("error", (error) => resolve({ status: 1, stderr: `${stderr}${error.message}\n` }));
    child.on("close", (code, signal) => resolve({ status: signal ? 1 : code, stderr }));
  });
}

async function runNative(target) {
  const binary = join(build, `fuzz_${target}`);
  if (!existsSync(binary)) {
    console.error(`fuzz: ${binary} is missing; run: node scripts/setup.mjs --sanitizers`);
    process.exit(1);
  }
  const seeds = join(root, "native", "fuzz", "corpus", target);
  const work = mkdtempSync(join(tmpdir(), `redwing-fuzz-${target}-`));
  const dict = join(root, "native", "fuzz", `${target}.dict`);
  mkdirSync(join(work, "corpus"));
  const started = Date.now();
  const r = await runForStderr(
    binary,
    [
      `-max_total_time=${seconds}`,
      "-print_final_stats=1",
      "-timeout=10",
      "-rss_limit_mb=2048",
      `-artifact_prefix=${work}/`,
      ...(existsSync(dict) ? [`-dict=${dict}`] : []),
      join(work, "corpus"),
      seeds,
    ],
    {
      cwd: work,
      env: { ...process.env, ASAN_OPTIONS: "detect_leaks=1", UBSAN_OPTIONS: "print_stacktrace=1" },
    },
  );
  const wall = (Date.now() - started) / 1000;
  const executions = Number(/stat::number_of_executed_units:\s*(\d+)/.exec(r.stderr)?.[1] ?? 0);
  const artifacts = readdirSync(work).filter((f) => /^(crash|leak|timeout|oom)-/.test(f));
  if (r.status !== 0 || artifacts.length > 0) {
    failed = true;
    const keep = join(root, "native", "fuzz", "crashes", target);
    mkdirSync(keep, { recursive: true });
    for (const f of artifacts) copyFileSync(join(work, f), join(keep, f));
    console.error(r.stderr.split("\n").slice(-60).join("\n"));
    console.error(`fuzz ${target}: FAILED (reproducers in ${keep})`);
  }
  rmSync(work, { recursive: true, force: true });
  return { target: `native ${target}`, executions, seconds: wall, ok: r.status === 0 };
}

/**
 * The native targets, one per core at a time (each is one process on one core, so on two cores
 * three targets of 10 s take 20 s, not 30), reported in the targets' order.
 */
async function runNativeTargets(targets) {
  const outcomes = new Array(targets.length);
  let next = 0;
  const lane = async () => {
    while (next < targets.length) {
      const i = next++;
      outcomes[i] = await runNative(targets[i]);
    }
  };
  const lanes = Math.max(1, Math.min(availableParallelism(), targets.length));
  await Promise.all(Array.from({ length: lanes }, lane));
  results.push(...outcomes);
}

function runTypeScript() {
  const started = Date.now();
  const r = spawnSync(
    "npx",
    ["vitest", "run", "core/format/manifest.fuzz.test.ts", "--testTimeout", String(seconds * 4000)],
    {
      cwd: root,
      encoding: "utf8",
      env: { ...process.env, REDWING_FUZZ_SECONDS: String(seconds) },
      maxBuffer: 64 * 1024 * 1024,
    },
  );
  const wall = (Date.now() - started) / 1000;
  const counts = [...r.stdout.matchAll(/fuzz ([^:\n]+): (\d+) executions/g)];
  for (const [, name, n] of counts) {
    results.push({
      target: `ts ${name}`,
      executions: Number(n),
      seconds: wall,
      ok: r.status === 0,
    });
  }
  if (r.status !== 0) {
    failed = true;
    console.error(r.stdout.split("\n").slice(-60).join("\n"));
    console.error(r.stderr.split("\n").slice(-30).join("\n"));
    console.error("fuzz: the TypeScript manifest fuzzer FAILED");
  }
}

if (!tsOnly) await runNativeTargets(nativeTargets.filter((t) => !only || only === t));
if (!nativeOnly && (!only || only === "ts")) runTypeScript();

let total = 0;
for (const r of results) {
  total += r.executions;
  console.error(
    `fuzz ${r.target.padEnd(28)} ${String(r.executions).padStart(10)} executions  ${r.seconds.toFixed(1)} s  ${r.ok ? "ok" : "FAILED"}`,
  );
}
console.error(`fuzz total: ${total} executions`);
process.exit(failed ? 1 : 0);
