/**
 * The memory-limited case of `npm run bench -- vs-llama-cpp --memory-limit 3.5G`: the case our
 * users live in, a machine whose RAM is smaller than the model. Each engine runs once, alone, in
 * a fresh memory group of that size (bench/memory-limit.ts), after the page cache is dropped:
 *   - llama.cpp as it runs by default (node-llama-cpp's defaults: the file mapped, and the weights
 *     the CPU backend can repack copied into repacked buffers in RAM),
 *   - llama.cpp reading the weights from the mapped file, repacking off (`--no-repack`, through
 *     bench/peers/no-repack.c preloaded: node-llama-cpp does not expose the option), so the
 *     kernel pages the 14 GB file through the limit,
 *   - Redwing streaming experts with `--memory-budget` equal to the limit (what users do; the
 *     engine picks the expert slots that fit, printed).
 * Each reports decode and prefill rates for a short prompt, the process's peak RSS, the group's
 * peak (page cache included), the bytes read from the disk per decode token (Redwing counts its
 * own expert reads; llama.cpp's come from /proc/self/io, page faults included) and how a run
 * ended: a run killed by the limit is reported as such (the group's OOM kill count tells), never
 * as a crash of the bench. One run each: the runs are bound by the disk, not by the cores.
 */
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { z } from "zod";
import { captureOutput, nativeBinary } from "../core/native.ts";
import { formatBytes } from "../core/units.ts";
import { syntheticPrompt } from "./engine.ts";
import { greedyGenerateArgs, parseGenerateReport } from "./generate-report.ts";
import {
  describeOutcome,
  dropCaches,
  memoryLimiter,
  runChild,
  runOutcome,
  type ChildExit,
} from "./memory-limit.ts";

/** The report line of bench/peers/llama-run.mjs (the fields the memory-limited case reads). */
const LlamaRunReport = z.object({
  load_seconds: z.number(),
  prompt_tokens: z.number(),
  prefill_seconds: z.number(),
  decode_tokens: z.number(),
  decode_seconds: z.number(),
  peak_rss_bytes: z.number(),
  decode_read_bytes: z.number().nullable(),
  model_buffers_mib: z.record(z.string(), z.number()),
});
export type LlamaRunReport = z.infer<typeof LlamaRunReport>;

const LlamaEvent = z.union([
  z.object({ event: z.literal("loaded"), load_seconds: z.number() }),
  z.object({ event: z.literal("model_buffer"), type: z.string(), mib: z.number() }),
]);

/**
 * What llama-run.mjs printed, however far it got: whether the model finished loading, the model
 * buffers llama.cpp allocated (it prints them before reading the weights, so a run killed while
 * loading has them too) and the report, when it got to the end.
 */
export function parseLlamaRun(stdout: string): {
  loaded: boolean;
  buffersMib: Record<string, number>;
  report: LlamaRunReport | null;
} {
  let loaded = false;
  let report: LlamaRunReport | null = null;
  const buffersMib: Record<string, number> = {};
  for (const line of stdout.split("\n")) {
    if (!line.startsWith("{")) continue;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      continue; // a line cut short by the kill
    }
    const event = LlamaEvent.safeParse(value);
    if (event.success) {
      if (event.data.event === "loaded") loaded = true;
      else buffersMib[event.data.type] = (buffersMib[event.data.type] ?? 0) + event.data.mib;
      continue;
    }
    const parsed = LlamaRunReport.safeParse(value);
    if (parsed.success) report = parsed.data;
  }
  return { loaded, buffersMib, report };
}

export interface LimitedRow {
  engine: string;
  /** How the run ended, in words ("ran", "killed by the memory limit while loading", ...). */
  outcome: string;
  decode_tok_s: number | null;
  prefill_tok_s: number | null;
  peak_rss_bytes: number | null;
  /** The memory group's peak: the process and the page cache charged to it. */
  group_peak_bytes: number | null;
  decode_read_bytes_per_token: number | null;
  /** Redwing's expert slots per layer (the budget's pick). */
  slots: number | null;
  /** llama.cpp's model buffers by type (MiB): CPU_Mapped is the file, the others copies in RAM. */
  model_buffers_mib: Record<string, number> | null;
}

/** The row for a llama.cpp run from its exit, its group's counters and what it printed. */
export function llamaRow(
  engine: string,
  exit: Pick<ChildExit, "code" | "signal" | "stderrTail" | "timedOut" | "stdout">,
  oomKills: number | null,
  groupPeak: number | null,
): LimitedRow {
  const { loaded, buffersMib, report } = parseLlamaRun(exit.stdout);
  const outcome = runOutcome(exit, oomKills);
  const ran = outcome.kind === "ok" && report !== null;
  return {
    engine,
    outcome:
      outcome.kind === "ok" && report === null
        ? "failed (no report)"
        : describeOutcome(outcome, loaded ? "running" : "loading"),
    decode_tok_s: ran ? report.decode_tokens / report.decode_seconds : null,
    prefill_tok_s: ran ? report.prompt_tokens / report.prefill_seconds : null,
    peak_rss_bytes: ran ? report.peak_rss_bytes : null,
    group_peak_bytes: groupPeak,
    decode_read_bytes_per_token:
      ran && report.decode_read_bytes !== null && report.decode_tokens > 0
        ? report.decode_read_bytes / report.decode_tokens
        : null,
    slots: null,
    model_buffers_mib: Object.keys(buffersMib).length > 0 ? buffersMib : null,
  };
}

/** The row for a Redwing run (`redwing-engine generate`'s report on stdout). */
export function redwingRow(
  engine: string,
  exit: Pick<ChildExit, "code" | "signal" | "stderrTail" | "timedOut" | "stdout">,
  oomKills: number | null,
  groupPeak: number | null,
  plannedSlots: number | null,
): LimitedRow {
  const outcome = runOutcome(exit, oomKills);
  const base = {
    engine,
    group_peak_bytes: groupPeak,
    model_buffers_mib: null,
  };
  if (outcome.kind !== "ok")
    return {
      ...base,
      outcome: describeOutcome(outcome),
      decode_tok_s: null,
      prefill_tok_s: null,
      peak_rss_bytes: null,
      decode_read_bytes_per_token: null,
      slots: plannedSlots,
    };
  const r = parseGenerateReport(exit.stdout);
  return {
    ...base,
    outcome: describeOutcome(outcome),
    decode_tok_s: r.tokens.length > 1 ? (r.tokens.length - 1) / r.decode_seconds : null,
    prefill_tok_s: r.prompt_tokens / r.prefill_seconds,
    peak_rss_bytes: r.peak_rss_bytes,
    decode_read_bytes_per_token: r.decode_bytes_read_per_token,
    slots: r.expert_cache_slots,
  };
}

export interface LimitedResult {
  date: string;
  model: string;
  memory_limit_bytes: number;
  memory_limit_how: string;
  /** Whether the page cache could be dropped before every run (root only). */
  page_cache_dropped: boolean;
  threads: number;
  prompt_tokens: number;
  decode_tokens: number;
  /** The machine's load averages (1, 5, 15 minutes) before the first run and after the last. */
  load_average_before: number[];
  load_average_after: number[];
  rows: LimitedRow[];
  /** Redwing's rates over llama.cpp's from the mapped file with repacking off (null: one did not run). */
  decode_ratio: number | null;
  prefill_ratio: number | null;
}

const num = (v: number | null, digits: number) => (v === null ? "-" : v.toFixed(digits));
const bytes = (v: number | null) => (v === null ? "-" : formatBytes(v));

/** The ratio of two rates where both ran. */
export function rateRatio(ours: number | null, theirs: number | null): number | null {
  return ours === null || theirs === null || theirs <= 0 ? null : ours / theirs;
}

const load = (averages: number[]) => averages.map((l) => l.toFixed(1)).join(" ");

/** The readable table (markdown) for a memory-limited run. */
export function formatLimitedTable(r: LimitedResult): string[] {
  const lines = [
    `Under a memory limit of ${formatBytes(r.memory_limit_bytes)} (${r.memory_limit_how}), ${r.model}; ` +
      `${r.prompt_tokens}-token prompt, ${r.decode_tokens} decode tokens, ${r.threads} threads; ` +
      `one run each (the runs are bound by the disk); ${r.date}; load average ${load(r.load_average_before)} before, ${load(r.load_average_after)} after`,
    r.page_cache_dropped
      ? "Page cache dropped before each run."
      : "The page cache could NOT be dropped (not root): the runs may read from a warm cache.",
    "| | outcome | decode tok/s | prefill tok/s | peak RSS | group peak | read per decode token |",
    "|---|---|---|---|---|---|---|",
  ];
  for (const row of r.rows)
    lines.push(
      `| ${row.engine}${row.slots ? ` (${row.slots} slots)` : ""} | ${row.outcome} | ${num(row.decode_tok_s, 2)} | ` +
        `${num(row.prefill_tok_s, 2)} | ${bytes(row.peak_rss_bytes)} | ${bytes(row.group_peak_bytes)} | ` +
        `${bytes(row.decode_read_bytes_per_token)} |`,
    );
  for (const row of r.rows)
    if (row.model_buffers_mib)
      lines.push(
        `${row.engine}: model buffers ` +
          Object.entries(row.model_buffers_mib)
            .map(([type, mib]) => `${type} ${formatBytes(mib * 2 ** 20)}`)
            .join(", "),
      );
  lines.push(
    r.decode_ratio === null
      ? "Redwing / llama.cpp (mapped, no repacking): - (one of them did not run)"
      : `Redwing / llama.cpp (mapped, no repacking): decode ${r.decode_ratio.toFixed(1)}x` +
          (r.prefill_ratio === null ? "" : `, prefill ${r.prefill_ratio.toFixed(1)}x`),
  );
  return lines;
}

/**
 * bench/peers/no-repack.c built into a temporary folder (with the system's C compiler), or the
 * reason it could not be.
 */
export async function buildNoRepackShim(
  peers: string,
): Promise<{ path: string } | { error: string }> {
  const dir = await mkdtemp(join(tmpdir(), "redwing-no-repack-"));
  const path = join(dir, "no-repack.so");
  const source = join(peers, "no-repack.c");
  for (const cc of [process.env.CC, "cc", "gcc", "clang"].filter(Boolean) as string[]) {
    const r = spawnSync(cc, ["-shared", "-fPIC", "-O2", "-o", path, source, "-ldl"], {
      encoding: "utf8",
    });
    if (r.status === 0 && existsSync(path)) return { path };
    if (r.error === undefined) {
      await rm(dir, { recursive: true, force: true });
      return { error: `${cc} failed: ${r.stderr.trim().slice(0, 300)}` };
    }
  }
  await rm(dir, { recursive: true, force: true });
  return { error: "no C compiler (cc, gcc or clang) to build bench/peers/no-repack.c" };
}

const PlanReport = z.object({ slots: z.number(), total_bytes: z.number() });

export interface LimitedOptions {
  redwing: string;
  gguf: string;
  peers: string;
  layers: number;
  limitBytes: number;
  /** Redwing's --memory-budget (bytes). */
  budgetBytes: number;
  threads: number;
  prompt: number;
  decode: number;
  timeoutMs: number;
}

export async function runMemoryLimitedCase(o: LimitedOptions): Promise<LimitedResult> {
  const loadBefore = loadavg();
  const context = o.prompt + o.decode + 8;
  const binary = nativeBinary("redwing-engine");
  const plan = PlanReport.parse(
    JSON.parse(
      await captureOutput([
        binary,
        "memory",
        "--model",
        o.redwing,
        "--context",
        String(context),
        "--memory-budget",
        String(o.budgetBytes),
      ]),
    ),
  );
  console.error(
    `vs-llama-cpp: Redwing's --memory-budget ${formatBytes(o.budgetBytes)} picks ${plan.slots} expert slots per layer (plan: ${formatBytes(plan.total_bytes)})`,
  );
  const shim = await buildNoRepackShim(o.peers);
  const llamaArgv = (extra: string[]) => [
    process.execPath,
    join(o.peers, "llama-run.mjs"),
    o.gguf,
    String(o.threads),
    String(o.prompt),
    String(o.decode),
    String(context),
    "--ignore-memory-checks",
    ...extra,
  ];
  const runs: {
    engine: string;
    argv: string[];
    env?: NodeJS.ProcessEnv;
    row: (exit: ChildExit, kills: number | null, peak: number | null) => LimitedRow;
  }[] = [
    {
      engine: "llama.cpp, as it runs by default",
      argv: llamaArgv([]),
      row: (exit, kills, peak) => llamaRow("llama.cpp, as it runs by default", exit, kills, peak),
    },
  ];
  const mappedName = "llama.cpp, mapped file, no repacking";
  if ("path" in shim)
    runs.push({
      engine: mappedName,
      argv: llamaArgv(["--mmap", "on"]),
      env: { ...process.env, LD_PRELOAD: shim.path },
      row: (exit, kills, peak) => {
        const row = llamaRow(mappedName, exit, kills, peak);
        // llama.cpp's own log says whether the preload took: no repacked or AMX copies.
        const copies = Object.keys(row.model_buffers_mib ?? {}).filter((t) =>
          /REPACK|AMX/i.test(t),
        );
        if (copies.length > 0)
          row.outcome += ` (but llama.cpp made ${copies.join(", ")} buffers: repacking was not off)`;
        return row;
      },
    });
  const redwingName = `Redwing, --memory-budget ${formatBytes(o.budgetBytes)}`;
  runs.push({
    engine: redwingName,
    argv: [
      binary,
      ...greedyGenerateArgs(o.redwing, syntheticPrompt(o.prompt), o.decode + 1),
      "--threads",
      String(o.threads),
      "--context",
      String(context),
      "--memory-budget",
      String(o.budgetBytes),
    ],
    row: (exit, kills, peak) => redwingRow(redwingName, exit, kills, peak, plan.slots),
  });

  const rows: LimitedRow[] = [];
  let allDropped = true;
  let how = "";
  for (const run of runs) {
    const limiter = memoryLimiter(o.limitBytes);
    how = limiter.how;
    try {
      allDropped = dropCaches() && allDropped;
      console.error(
        `vs-llama-cpp: under ${formatBytes(o.limitBytes)} (${limiter.how}): ${run.engine}`,
      );
      const exit = await runChild(limiter.wrap(run.argv), {
        env: run.env ?? process.env,
        timeoutMs: o.timeoutMs,
      });
      const row = run.row(exit, limiter.oomKills(), limiter.peakBytes());
      console.error(
        `vs-llama-cpp: ${run.engine}: ${row.outcome}; decode ${num(row.decode_tok_s, 2)} tok/s, prefill ${num(row.prefill_tok_s, 2)} tok/s`,
      );
      rows.push(row);
    } finally {
      limiter.dispose();
    }
  }
  if ("error" in shim)
    rows.splice(1, 0, {
      engine: mappedName,
      outcome: `not run: ${shim.error}`,
      decode_tok_s: null,
      prefill_tok_s: null,
      peak_rss_bytes: null,
      group_peak_bytes: null,
      decode_read_bytes_per_token: null,
      slots: null,
      model_buffers_mib: null,
    });
  if ("path" in shim) await rm(dirname(shim.path), { recursive: true, force: true });
  const mapped = rows.find((r) => r.engine === mappedName);
  const ours = rows.find((r) => r.engine === redwingName);
  return {
    date: new Date().toISOString(),
    model:
      `synthetic gemma-4-26b-a4b, ${o.layers} of 30 layers` +
      (o.layers < 30 ? " (reduced: it may fit the limit)" : ""),
    memory_limit_bytes: o.limitBytes,
    memory_limit_how: how,
    page_cache_dropped: allDropped,
    threads: o.threads,
    prompt_tokens: o.prompt,
    decode_tokens: o.decode,
    load_average_before: loadBefore,
    load_average_after: loadavg(),
    rows,
    decode_ratio: rateRatio(ours?.decode_tok_s ?? null, mapped?.decode_tok_s ?? null),
    prefill_ratio: rateRatio(ours?.prefill_tok_s ?? null, mapped?.prefill_tok_s ?? null),
  };
}
