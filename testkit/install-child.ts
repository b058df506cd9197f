/**
 * Runs one install in a child process (for the kill-and-resume test and the benchmark):
 *
 *   node --import tsx testkit/install-child.ts '<json>'
 *
 * with `{ "repo", "revision", "dest", "options" }` (InstallOptions without callbacks). Prints
 * one JSON line: `{ ok, fetchedBytes, reusedBytes, seconds, maxRssBytes }` or
 * `{ ok: false, code, message }`.
 */
import { readFileSync } from "node:fs";
import { installModel, type InstallOptions } from "../core/install/installer.ts";

/**
 * Peak resident set size of this process. Linux: VmHWM, which starts afresh at exec (unlike
 * getrusage's ru_maxrss, which a child inherits from the parent it was forked from); elsewhere
 * the largest RSS sampled every 10 ms.
 */
let sampled = process.memoryUsage().rss;
setInterval(() => (sampled = Math.max(sampled, process.memoryUsage().rss)), 10).unref();
function peakRss(): number {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"));
    if (m) return Number(m[1]) * 1024;
  } catch {
    // not Linux
  }
  return Math.max(sampled, process.memoryUsage().rss);
}

interface ChildInput {
  repo: string;
  revision?: string | null;
  dest: string;
  options?: InstallOptions;
}

const input = JSON.parse(process.argv[2] ?? "{}") as ChildInput;
try {
  const r = await installModel(
    { repo: input.repo, revision: input.revision ?? null, dest: input.dest },
    input.options ?? {},
  );
  process.stdout.write(
    JSON.stringify({
      ok: true,
      fetchedBytes: r.fetchedBytes,
      reusedBytes: r.reusedBytes,
      seconds: r.seconds,
      retries: r.retries,
      maxRssBytes: peakRss(),
    }) + "\n",
  );
} catch (error) {
  const e = error as { code?: string; message?: string };
  process.stdout.write(JSON.stringify({ ok: false, code: e.code, message: e.message }) + "\n");
  process.exitCode = 1;
}
