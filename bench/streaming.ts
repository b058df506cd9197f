/**
 * Expert streaming benchmark on the full-size synthetic Gemma 4 26B-A4B (30 layers, ~14 GB,
 * made once with `redwing synth` and kept in the benchmark cache, or --model DIR).
 *
 * Every configuration runs `redwing-engine generate` in a fresh process under the same memory
 * limit (a cgroup v2 memory.max or v1 memory.limit_in_bytes child group when writable, else
 * `systemd-run --scope -p MemoryMax=`, else no limit, as reported), after dropping the page
 * cache when permitted:
 *   (a) streamed experts, 16 slots, uniform routing        (--routing-trace synthetic:reuse=0)
 *   (b) streamed experts, 16 slots, a trace with ~50% hits (--routing-trace synthetic:reuse=0.45)
 *   (c) baseline: the expert files mapped with mmap, trace (b), page cache under the same limit
 *   (d) trace (b) with `--memory-budget 2.5G` (the engine picks the slots that fit)
 * Disk throughput is measured through the engine's I/O path with the same read size (one expert,
 * 8 reads in flight, cold cache) right before each streamed configuration, because a shared
 * disk's throughput drifts between runs. The bound for decode is the slower of reading a token's
 * missed experts at that throughput and the token's compute (decode time minus I/O wait).
 * The routing traces are benchmark-only: they replace the router's choice of experts.
 *
 *   node --import tsx bench/streaming.ts [--model DIR] [--prompt 512] [--new 16] [--slots 16]
 *                                        [--limit-mib N] [--skip-baseline]
 */
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { captureOutput, nativeBinary } from "../core/native.ts";
import { synthesizeModel } from "../core/synth/synth.ts";
import { syntheticPrompt } from "./engine.ts";
import {
  greedyGenerateArgs,
  parseGenerateReport,
  type GenerateReport,
  type TokenStat,
} from "./generate-report.ts";
import { dropCaches, memoryLimiter } from "./memory-limit.ts";
import { flag, writeResult } from "./stats.ts";

const MemoryReport = z.object({ total_bytes: z.number(), expert_bytes_each: z.number() });

function option(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

async function benchModel(): Promise<string> {
  const given = option("model");
  if (given) return resolve(given);
  const cache = process.env.REDWING_BENCH_DIR ?? join(tmpdir(), "redwing-bench");
  const dir = join(cache, "gemma-4-26b-a4b-30l");
  if (!existsSync(join(dir, "manifest.json"))) {
    console.error(`streaming bench: writing the full synthetic model ${dir} (~14 GB)`);
    await synthesizeModel({ preset: "gemma-4-26b-a4b", out: dir, force: true });
  }
  return dir;
}

/**
 * Cold read throughput of random experts through the engine's own I/O path (`redwing-engine
 * diskbench`: the same uncached open, piece size and reads in flight as the expert store), so the
 * decode bound compares like with like.
 */
async function diskThroughput(model: string, totalBytes: number): Promise<number> {
  const out = await captureOutput([
    nativeBinary("redwing-engine"),
    "diskbench",
    "--model",
    model,
    "--megabytes",
    String(Math.round(totalBytes / 2 ** 20)),
  ]);
  return z.object({ bytes_per_second: z.number().positive() }).parse(JSON.parse(out))
    .bytes_per_second;
}

interface Row {
  name: string;
  decode_tok_s: number;
  ttft_s: number;
  peak_rss_mib: number;
  bytes_read_per_token_mib: number | null;
  hit_rate: number | null;
  io_wait_share: number | null;
  compute_ms_per_token: number;
  direct_io: boolean;
  /** Expert slots per layer the run used (the budget picks them in (d)). */
  slots: number | null;
  /** Disk throughput probed right before this run; null for the mmap baseline. */
  disk_mib_s: number | null;
  /** Where a decode step's time goes (experts include the wait for reads). */
  parts_ms_per_token: Record<string, number> | null;
}

function summarize(name: string, r: GenerateReport, diskBytesPerS: number | null): Row {
  const steps = r.token_stats.slice(1);
  const sum = (f: (t: TokenStat) => number) => steps.reduce((a, t) => a + f(t), 0);
  const n = Math.max(1, steps.length);
  const uses = sum((t) => t.hits + t.misses);
  const ioWait = sum((t) => t.io_wait_ms);
  const compute = sum((t) => t.compute_ms);
  return {
    name,
    decode_tok_s: r.tokens.length > 1 ? (r.tokens.length - 1) / r.decode_seconds : 0,
    ttft_s: r.prefill_seconds,
    peak_rss_mib: r.peak_rss_bytes / 2 ** 20,
    // The mapped baseline reads through page faults, which the engine does not count.
    bytes_read_per_token_mib: uses > 0 ? sum((t) => t.bytes_read) / n / 2 ** 20 : null,
    hit_rate: uses > 0 ? sum((t) => t.hits) / uses : null,
    io_wait_share: uses > 0 ? ioWait / (ioWait + compute) : null,
    compute_ms_per_token: compute / n,
    direct_io: r.direct_io,
    slots: r.expert_cache_slots,
    disk_mib_s: diskBytesPerS === null ? null : diskBytesPerS / 2 ** 20,
    parts_ms_per_token: r.decode_parts_ms_per_token,
  };
}

export async function runStreamingBench(): Promise<void> {
  const promptLength = flag("prompt", 512);
  const maxNew = flag("new", 16);
  const slots = flag("slots", 16);
  const model = await benchModel();
  const binary = nativeBinary("redwing-engine");
  const context = 4096;
  const plan = MemoryReport.parse(
    JSON.parse(
      await captureOutput([
        binary,
        "memory",
        "--model",
        model,
        "--context",
        String(context),
        "--expert-cache-slots",
        String(slots),
      ]),
    ),
  );
  const limitBytes = option("limit-mib")
    ? flag("limit-mib", 1) * 2 ** 20
    : Math.ceil((Math.max(plan.total_bytes, 2.5 * 2 ** 30) * 1.1) / 2 ** 20) * 2 ** 20;
  const limiter = memoryLimiter(limitBytes);
  const dropped = dropCaches();
  const prompt = syntheticPrompt(promptLength);
  const common = [...greedyGenerateArgs(model, prompt, maxNew), "--context", String(context)];
  const budget = ["--memory-budget", "2.5G"];
  const configs: [string, string[]][] = [
    [
      "(a) stream, uniform routing",
      ["--expert-cache-slots", String(slots), "--routing-trace", "synthetic:reuse=0,seed=1"],
    ],
    [
      "(b) stream, ~50% hit trace",
      ["--expert-cache-slots", String(slots), "--routing-trace", "synthetic:reuse=0.45,seed=1"],
    ],
  ];
  if (!process.argv.includes("--skip-baseline"))
    configs.push([
      "(c) mmap baseline, trace (b)",
      ["--expert-mmap", "on", "--routing-trace", "synthetic:reuse=0.45,seed=1"],
    ]);
  configs.push([
    "(d) ~50% trace, budget 2.5G",
    [...budget, "--routing-trace", "synthetic:reuse=0.45,seed=1"],
  ]);
  const rows: Row[] = [];
  try {
    for (const [name, flags] of configs) {
      const mapped = flags.includes("--expert-mmap");
      dropCaches();
      const throughput = mapped ? null : await diskThroughput(model, 2 ** 30);
      dropCaches();
      console.error(`streaming bench: ${name}`);
      const report = parseGenerateReport(
        await captureOutput(limiter.wrap([binary, ...common, ...flags])),
      );
      rows.push(summarize(name, report, throughput));
    }
  } finally {
    limiter.dispose();
  }
  // The decode bound: per token, the slower of reading its misses at the measured throughput and
  // its compute (measured in the same run).
  const bound = (r: Row) => {
    if (r.bytes_read_per_token_mib === null || r.disk_mib_s === null) return null;
    const ioS = r.bytes_read_per_token_mib / r.disk_mib_s;
    return 1 / Math.max(ioS, r.compute_ms_per_token / 1000);
  };
  const result = {
    model: `${model} (synthetic gemma-4-26b-a4b, 30 layers)`,
    prompt_tokens: promptLength,
    max_new: maxNew,
    context,
    slots,
    memory_limit_mib: limitBytes / 2 ** 20,
    memory_limit_how: limiter.how,
    page_cache_dropped: dropped,
    rows: rows.map((r) => {
      const b = bound(r);
      return { ...r, bound_tok_s: b, of_bound: b === null ? null : r.decode_tok_s / b };
    }),
  };
  const fmt = (v: number | null, digits: number, width: number) =>
    (v === null ? "-" : v.toFixed(digits)).padStart(width);
  console.log(result.model);
  console.log(
    `limit ${result.memory_limit_mib.toFixed(0)} MiB via ${limiter.how}; page cache dropped: ${dropped}; disk probed before each run (cold, ${plan.expert_bytes_each} B reads, 8 in flight)`,
  );
  console.log(
    "config                          slots  tok/s  TTFT s  peak MiB  MiB/tok  hit    io-wait  disk MiB/s  bound  of-bound",
  );
  for (const r of result.rows)
    console.log(
      `${r.name.padEnd(30)} ${fmt(r.slots, 0, 6)} ${r.decode_tok_s.toFixed(2).padStart(6)} ${r.ttft_s.toFixed(1).padStart(7)} ${r.peak_rss_mib.toFixed(0).padStart(9)} ${fmt(r.bytes_read_per_token_mib, 0, 8)}  ${r.hit_rate === null ? "  -  " : r.hit_rate.toFixed(2)}  ${r.io_wait_share === null ? "   -   " : r.io_wait_share.toFixed(2).padStart(7)}  ${fmt(r.disk_mib_s, 0, 10)}  ${fmt(r.bound_tok_s, 2, 5)}  ${fmt(r.of_bound, 2, 8)}`,
    );
  console.log("decode ms per token by part (experts = their compute + the wait for reads):");
  for (const r of result.rows) {
    if (!r.parts_ms_per_token) continue;
    const p = r.parts_ms_per_token;
    const text = Object.entries(p)
      .map(([k, v]) => `${k} ${v.toFixed(1)}`)
      .join(", ");
    console.log(`  ${r.name}: ${text}`);
  }
  const b = result.rows.find((r) => r.name.startsWith("(b)"));
  const c = result.rows.find((r) => r.name.startsWith("(c)"));
  if (b && c && c.decode_tok_s > 0)
    console.log(`(b) decodes ${(b.decode_tok_s / c.decode_tok_s).toFixed(1)}x faster than (c)`);
  await writeResult("streaming", result);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await runStreamingBench();
}
