/**
 * Running a benchmark's child process under a memory limit, as on a machine with little RAM:
 * a cgroup v2 memory.max or v1 memory.limit_in_bytes child group when writable (then the group's
 * peak memory and its OOM kills are read back), else `systemd-run --scope -p MemoryMax=`, else no
 * limit, as reported. Shared by bench/streaming.ts and bench/vs-llama-cpp.ts.
 */
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** Drops the page cache (root only), so that the next run reads its model from the disk; says whether it worked. */
export function dropCaches(): boolean {
  try {
    spawnSync("sync");
    writeFileSync("/proc/sys/vm/drop_caches", "3\n");
    return true;
  } catch {
    return false;
  }
}

export interface Limiter {
  /** How the limit is applied, for the report. */
  how: string;
  /** The command line that runs `argv` under the limit. */
  wrap(argv: string[]): string[];
  /** The group's peak memory so far (its processes' memory and the page cache charged to it); null where not readable. */
  peakBytes(): number | null;
  /** The processes the kernel killed for the group's limit so far; null where not readable. */
  oomKills(): number | null;
  dispose(): void;
}

/**
 * `key value` lines (cgroup v2 memory.events, v1 memory.oom_control) as numbers; lines that are
 * not one name and one integer are skipped.
 */
export function parseKeyedCounts(text: string): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const line of text.split("\n")) {
    const m = /^\s*(\w+)\s+(\d+)\s*$/.exec(line);
    if (m) counts[m[1]!] = Number(m[2]);
  }
  return counts;
}

/** The OOM kill count in a memory.events (v2) or memory.oom_control (v1) text; null when it has none (kernels before 4.13). */
export function oomKillCount(text: string): number | null {
  return parseKeyedCounts(text)["oom_kill"] ?? null;
}

function readNumberFile(path: string): number | null {
  try {
    const value = Number(readFileSync(path, "utf8").trim());
    return Number.isFinite(value) ? value : null;
  } catch {
    return null;
  }
}

let groups = 0;

/**
 * A memory limit for child processes: cgroup v2, cgroup v1, systemd-run, or none. Each call makes
 * its own group, so a limiter made per run reports that run's peak and OOM kills alone.
 */
export function memoryLimiter(bytes: number): Limiter {
  const name = `redwing-bench-${process.pid}-${++groups}`;
  const files = (v2: boolean) =>
    v2
      ? {
          limit: "memory.max",
          swap: "memory.swap.max",
          peak: "memory.peak",
          events: "memory.events",
        }
      : {
          limit: "memory.limit_in_bytes",
          // memory + swap, set to the same value: no swapping out of the limit.
          swap: "memory.memsw.limit_in_bytes",
          peak: "memory.max_usage_in_bytes",
          events: "memory.oom_control",
        };
  const tryGroup = (dir: string, v2: boolean, how: string): Limiter | null => {
    const f = files(v2);
    try {
      mkdirSync(dir);
    } catch {
      return null;
    }
    try {
      writeFileSync(join(dir, f.limit), String(bytes));
    } catch {
      rmdirSync(dir);
      return null;
    }
    try {
      if (existsSync(join(dir, f.swap))) writeFileSync(join(dir, f.swap), v2 ? "0" : String(bytes));
    } catch {
      /* no swap accounting: the host's swap (often none) stays usable */
    }
    return {
      how,
      wrap: (argv) => ["sh", "-c", `echo $$ > ${dir}/cgroup.procs && exec "$@"`, "sh", ...argv],
      peakBytes: () => readNumberFile(join(dir, f.peak)),
      oomKills: () => {
        try {
          return oomKillCount(readFileSync(join(dir, f.events), "utf8"));
        } catch {
          return null;
        }
      },
      dispose: () => {
        try {
          rmdirSync(dir);
        } catch {
          /* still busy: left for the system */
        }
      },
    };
  };
  const root = "/sys/fs/cgroup";
  if (existsSync(join(root, "cgroup.controllers"))) {
    const g = tryGroup(join(root, name), true, "cgroup v2 memory.max");
    if (g) return g;
  }
  if (existsSync(join(root, "memory", "memory.limit_in_bytes"))) {
    const g = tryGroup(join(root, "memory", name), false, "cgroup v1 memory.limit_in_bytes");
    if (g) return g;
  }
  const unread = { peakBytes: () => null, oomKills: () => null, dispose: () => {} };
  const probe = spawnSync("systemd-run", ["--scope", "-q", "-p", `MemoryMax=${bytes}`, "true"]);
  if (probe.status === 0)
    return {
      how: "systemd-run --scope -p MemoryMax",
      wrap: (argv) => ["systemd-run", "--scope", "-q", "-p", `MemoryMax=${bytes}`, ...argv],
      ...unread,
    };
  return { how: "none (no writable cgroup, no systemd)", wrap: (argv) => argv, ...unread };
}

export interface ChildExit {
  stdout: string;
  /** The end of what it wrote to stderr (all of it also goes to this process's stderr). */
  stderrTail: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  /** Killed by runChild for running past its timeout. */
  timedOut: boolean;
}

/**
 * Runs `argv` to its end, whatever its exit (or kills it after `timeoutMs`); stderr goes through
 * to ours.
 */
export function runChild(
  argv: string[],
  options: { env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<ChildExit> {
  return new Promise((done, fail) => {
    const child = spawn(argv[0]!, argv.slice(1), {
      stdio: ["ignore", "pipe", "pipe"],
      env: options.env ?? process.env,
    });
    const out: Buffer[] = [];
    let tail = "";
    let timedOut = false;
    const timer =
      options.timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            timedOut = true;
            child.kill("SIGKILL");
          }, options.timeoutMs);
    child.stdout.on("data", (chunk: Buffer) => out.push(chunk));
    child.stderr.on("data", (chunk: Buffer) => {
      process.stderr.write(chunk);
      tail = (tail + chunk.toString("utf8")).slice(-4000);
    });
    child.on("error", (error) => {
      clearTimeout(timer);
      fail(error);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      done({
        stdout: Buffer.concat(out).toString("utf8"),
        stderrTail: tail,
        code,
        signal,
        timedOut,
      });
    });
  });
}

export type Outcome =
  | { kind: "ok" }
  /** Killed, and the group counted an OOM kill (or the only killer around is the limit's). */
  | { kind: "memory-limit"; confirmed: boolean }
  | { kind: "failed"; detail: string };

/**
 * How a run under a limiter ended. SIGKILL (or a shell's 137) with an OOM kill counted by the
 * group is the limit's doing; with no count to read, it is most likely the limit (said so); with a
 * count of zero it is something else.
 */
export function runOutcome(
  exit: Pick<ChildExit, "code" | "signal" | "stderrTail" | "timedOut">,
  oomKills: number | null,
): Outcome {
  if (exit.code === 0) return { kind: "ok" };
  if (exit.timedOut) return { kind: "failed", detail: "stopped: it ran past its time limit" };
  const killed = exit.signal === "SIGKILL" || exit.code === 137;
  if (killed && oomKills !== 0) return { kind: "memory-limit", confirmed: oomKills !== null };
  const last = exit.stderrTail.trim().split("\n").at(-1) ?? "";
  const how = exit.signal ? `killed by ${exit.signal}` : `exit ${exit.code}`;
  return { kind: "failed", detail: last ? `${how}: ${last.slice(0, 200)}` : how };
}

/** The outcome in words for a table; `phase` is what the run was doing when it ended, where known. */
export function describeOutcome(outcome: Outcome, phase?: "loading" | "running"): string {
  switch (outcome.kind) {
    case "ok":
      return "ran";
    case "memory-limit":
      return (
        `killed by the memory limit${phase ? ` while ${phase}` : ""}` +
        (outcome.confirmed ? "" : " (SIGKILL; the group's OOM count is not readable)")
      );
    case "failed":
      return `failed (${outcome.detail})`;
  }
}
