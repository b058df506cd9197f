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
// Seed corpora live in native/fuzz/corpus/<target>/ and are read, never written: new inputs go to
// a temporary directory. A crash or sanitizer report fails the run; its reproducer is copied to
// native/fuzz/crashes/<target>/ (fix the bug, then move the file into the seed corpus so every
// later run replays it).
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
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

function runNative(target) {
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
  const r = spawnSync(
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
      encoding: "utf8",
      cwd: work,
      env: { ...process.env, ASAN_OPTIONS: "detect_leaks=1", UBSAN_OPTIONS: "print_stacktrace=1" },
      maxBuffer: 256 * 1024 * 1024,
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
  results.push({ target: `native ${target}`, executions, seconds: wall, ok: r.status === 0 });
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

if (!tsOnly) {
  for (const t of nativeTargets) if (!only || only === t) runNative(t);
}
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
