/**
 * Redwing against llama.cpp on the same model shapes, the same machine, in the same run.
 *
 *   npm run bench -- vs-llama-cpp [--layers 30] [--runs 3] [--threads 2] [--decode 32]
 *                                 [--prompt 512] [--context 4096 | 0: no long case]
 *                                 [--memory-limit SIZE | --memory-limit-only SIZE]
 *                                 [--memory-budget SIZE] [--limited-prompt 16] [--limited-decode 8]
 *                                 [--limited-timeout 1800]
 *
 * Both engines get a model with the shapes of Gemma 4 26B-A4B and random weights: Redwing the
 * synthetic model of `redwing synth --preset gemma-4-26b-a4b`, llama.cpp a GGUF with the same
 * tensors written by bench/gguf-gemma4.ts (Q4_0 where Redwing has 4-bit groups, Q8_0 for the
 * router), every expert in memory for both. llama.cpp is node-llama-cpp's prebuilt CPU build,
 * pinned in bench/peers/package.json and installed there on first use (`npm ci --prefix
 * bench/peers`), never a dependency of the app.
 *
 * Redwing runs three times: exact float32 products (--activations exact), the default plan
 * (--activations head: 8-bit inputs on the output head only) and 8-bit inputs everywhere
 * (--activations int8). Each round runs, for each engine in turn (rotating which goes first): a prompt of --prompt
 * tokens then --decode greedy tokens (prefill rate, and decode rate at short context), and a
 * prompt of --context tokens then --decode tokens (decode rate at long context). Rates are the
 * medians over rounds; the table prints Redwing / llama.cpp. Models are cached in
 * REDWING_BENCH_DIR (default: the temp dir); the 30-layer pair takes about 28 GB of disk.
 *
 * --memory-limit SIZE (e.g. 3.5G) adds, after the table, the case our users live in: each engine
 * once under a memory group of SIZE with the page cache dropped first (as root), llama.cpp as it
 * runs by default, llama.cpp from the mapped file with repacking off, and Redwing streaming
 * experts with --memory-budget SIZE (or --memory-budget): bench/vs-llama-cpp-memory.ts.
 * --memory-limit-only SIZE runs that case alone. It needs the 30-layer model to mean anything
 * (fewer layers fit in 3.5 GiB).
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { captureOutput, nativeBinary } from "../core/native.ts";
import { synthesizeModel } from "../core/synth/synth.ts";
import { syntheticPrompt } from "./engine.ts";
import { greedyGenerateArgs, parseGenerateReport } from "./generate-report.ts";
import { cachedGemma4Gguf, gemma4Gguf } from "./gguf-gemma4.ts";
import { tensorBytes } from "./gguf.ts";
import { flag, median, sizeFlag, writeResult } from "./stats.ts";
import { formatLimitedTable, runMemoryLimitedCase } from "./vs-llama-cpp-memory.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
const peers = join(root, "bench", "peers");

const LlamaReport = z.object({
  prompt_tokens: z.number(),
  prefill_seconds: z.number(),
  decode_tokens: z.number(),
  decode_seconds: z.number(),
});

/** The activation plans Redwing runs with (`--activations`). */
const PLANS = ["exact", "head", "int8"] as const;
type Plan = (typeof PLANS)[number];

interface Rates {
  prefill: number; // prompt tokens per second
  decode: number; // generated tokens per second after the first
}

async function models(layers: number): Promise<{ redwing: string; gguf: string }> {
  const cache = process.env.REDWING_BENCH_DIR ?? join(tmpdir(), "redwing-bench");
  await mkdir(cache, { recursive: true });
  const redwing = join(cache, `gemma-4-26b-a4b-${layers}l`);
  if (!existsSync(join(redwing, "manifest.json"))) {
    console.error(`vs-llama-cpp: writing the synthetic Redwing model ${redwing}`);
    await synthesizeModel({ preset: "gemma-4-26b-a4b", out: redwing, layers, force: true });
  }
  return { redwing, gguf: await cachedGemma4Gguf(cache, layers, "vs-llama-cpp") };
}

/** Installs the pinned peer into bench/peers on first use. */
async function ensurePeer(): Promise<void> {
  if (existsSync(join(peers, "node_modules", "node-llama-cpp", "package.json"))) return;
  console.error("vs-llama-cpp: installing node-llama-cpp into bench/peers (npm ci)");
  const code = await new Promise<number>((done, fail) => {
    const child = spawn("npm", ["ci", "--prefix", peers, "--no-audit", "--no-fund"], {
      stdio: "inherit",
    });
    child.on("error", fail);
    child.on("close", (c) => done(c ?? 1));
  });
  if (code !== 0) throw new Error(`npm ci --prefix bench/peers failed (exit ${code})`);
}

async function runRedwing(
  model: string,
  threads: number,
  prompt: number,
  decode: number,
  context: number,
  activations: Plan,
): Promise<Rates & { parts?: Record<string, number> }> {
  const out = await captureOutput(
    [
      nativeBinary("redwing-engine"),
      ...greedyGenerateArgs(model, syntheticPrompt(prompt), decode + 1),
      "--threads",
      String(threads),
      "--context",
      String(context),
      "--activations",
      activations,
    ],
    { inheritStderr: true },
  );
  const r = parseGenerateReport(out);
  return {
    prefill: r.prompt_tokens / r.prefill_seconds,
    decode: (r.tokens.length - 1) / r.decode_seconds,
    parts: r.decode_parts_ms_per_token,
  };
}

async function runLlama(
  gguf: string,
  threads: number,
  prompt: number,
  decode: number,
  context: number,
): Promise<Rates> {
  const out = await captureOutput(
    [
      process.execPath,
      join(peers, "llama-run.mjs"),
      gguf,
      String(threads),
      String(prompt),
      String(decode),
      String(context),
    ],
    { inheritStderr: true },
  );
  const line = out.trim().split("\n").at(-1) ?? "";
  const r = LlamaReport.parse(JSON.parse(line));
  return {
    prefill: r.prompt_tokens / r.prefill_seconds,
    decode: r.decode_tokens / r.decode_seconds,
  };
}

/**
 * Weight bytes one decode token reads: every matrix once, the routed experts' share of the
 * expert tensors (top_k of num_experts), the tied head once. The same for both engines (both
 * store 4.5 bits per 4-bit weight and 8.5 per router weight).
 */
export function decodeWeightBytes(layers: number, topK = 8, experts = 128): number {
  let bytes = 0;
  for (const t of gemma4Gguf(layers).tensors) {
    const size = tensorBytes(t.dims, t.type);
    bytes += t.dims.length === 3 ? (size * topK) / experts : size;
  }
  return bytes;
}

const KernelBenchReport = z.object({ bandwidth_gbps_by_threads: z.record(z.string(), z.number()) });

/** The memory read bandwidth at `threads` threads, from the kernel benchmark's probe. */
async function bandwidthProbe(threads: number): Promise<number | null> {
  try {
    const out = await captureOutput([
      nativeBinary("redwing-bench-kernels"),
      "--threads",
      String(threads),
      "--quick",
      "--only",
      "none",
    ]);
    return (
      KernelBenchReport.parse(JSON.parse(out)).bandwidth_gbps_by_threads[String(threads)] ?? null
    );
  } catch {
    return null;
  }
}

export async function runVsLlamaCppBench(): Promise<void> {
  const layers = flag("layers", 30);
  const runs = flag("runs", 3);
  const threads = flag("threads", 2);
  const decode = flag("decode", 32);
  const prompt = flag("prompt", 512);
  const longContext = flag("context", 4096, 0);
  await ensurePeer();
  const onlyLimited = sizeFlag("memory-limit-only");
  const limit = onlyLimited ?? sizeFlag("memory-limit");
  const { redwing, gguf } = await models(layers);
  if (onlyLimited === undefined)
    await runTable({ layers, runs, threads, decode, prompt, longContext, redwing, gguf });
  if (limit !== undefined) {
    const result = await runMemoryLimitedCase({
      redwing,
      gguf,
      peers,
      layers,
      limitBytes: limit,
      budgetBytes: sizeFlag("memory-budget") ?? limit,
      threads,
      prompt: flag("limited-prompt", 16),
      decode: flag("limited-decode", 8),
      timeoutMs: flag("limited-timeout", 1800) * 1000,
    });
    console.log(formatLimitedTable(result).join("\n"));
    await writeResult("vs-llama-cpp-memory-limit", result);
  }
}

async function runTable(o: {
  layers: number;
  runs: number;
  threads: number;
  decode: number;
  prompt: number;
  longContext: number;
  redwing: string;
  gguf: string;
}): Promise<void> {
  const { layers, runs, threads, decode, prompt, longContext, redwing, gguf } = o;

  // --context 0 leaves out the long case (the 30-layer model's 4096-token prefills take ~20 min
  // a round on 2 threads; attention per layer is the same at any depth).
  const cases = [
    { name: "short", prompt, context: prompt + decode + 8 },
    ...(longContext > 0
      ? [{ name: "long", prompt: longContext, context: longContext + decode + 8 }]
      : []),
  ] as const;
  // Redwing runs once per activation plan and case (PLANS), llama.cpp once per case.
  const engines = [...PLANS.map((p) => `redwing-${p}`), "llama"];
  const samples: Record<string, Record<string, Rates[]>> = Object.fromEntries(
    engines.map((e) => [e, {}]),
  );
  const lastParts: Record<string, Record<string, number> | undefined> = {};
  const probes: number[] = [];
  for (let round = 0; round < runs; round++) {
    for (const c of cases) {
      // Rotate who goes first, so no engine always gets the cooler machine.
      const shift = (round + (c.name === "long" ? 1 : 0)) % engines.length;
      const order = [...engines.slice(shift), ...engines.slice(0, shift)];
      for (const engine of order) {
        const rates =
          engine === "llama"
            ? await runLlama(gguf, threads, c.prompt, decode, c.context)
            : await runRedwing(
                redwing,
                threads,
                c.prompt,
                decode,
                c.context,
                engine.slice("redwing-".length) as Plan,
              );
        if (engine !== "llama" && c.name === "short")
          lastParts[engine] = (rates as { parts?: Record<string, number> }).parts;
        (samples[engine]![c.name] ??= []).push(rates);
        console.error(
          `vs-llama-cpp: round ${round + 1} ${c.name} ${engine}: prefill ${rates.prefill.toFixed(1)} tok/s, decode ${rates.decode.toFixed(2)} tok/s`,
        );
      }
    }
    // The probe once a round, between the engines' runs: on a shared machine the bandwidth moves
    // from minute to minute (46-70 GB/s within seconds on the EPYC guest), so one probe at the end
    // made the shares below say more about that moment than about the engines.
    const gbps = await bandwidthProbe(threads);
    if (gbps !== null) probes.push(gbps);
  }
  const pick = (engine: string, c: string, k: keyof Rates) =>
    median(samples[engine]![c]!.map((r) => r[k]));
  const rows = [
    { what: `decode (after a ${prompt}-token prompt)`, c: "short", k: "decode" as const },
    { what: `prefill ${prompt}`, c: "short", k: "prefill" as const },
    { what: `decode at ${longContext} context`, c: "long", k: "decode" as const },
    { what: `prefill ${longContext}`, c: "long", k: "prefill" as const },
  ]
    .filter((r) => samples["llama"]![r.c] !== undefined)
    .map((r) => {
      const llama = pick("llama", r.c, r.k);
      const ours = pick("redwing-exact", r.c, r.k);
      const head = pick("redwing-head", r.c, r.k);
      const int8 = pick("redwing-int8", r.c, r.k);
      return {
        what: r.what,
        llama_cpp: llama,
        redwing: ours,
        ratio: ours / llama,
        redwing_head: head,
        ratio_head: head / llama,
        redwing_int8: int8,
        ratio_int8: int8 / llama,
      };
    });
  const probe = probes.length > 0 ? median(probes) : null;
  const bytesPerToken = decodeWeightBytes(layers);
  const decodeGbps = (rate: number) => (bytesPerToken * rate) / 1e9;
  const bandwidth = {
    weight_bytes_per_decode_token: bytesPerToken,
    probe_gbps: probe,
    probe_gbps_by_round: probes,
    redwing_decode_gbps: decodeGbps(rows[0]!.redwing),
    redwing_head_decode_gbps: decodeGbps(rows[0]!.redwing_head),
    redwing_int8_decode_gbps: decodeGbps(rows[0]!.redwing_int8),
    llama_cpp_decode_gbps: decodeGbps(rows[0]!.llama_cpp),
  };
  const result = {
    model:
      `synthetic gemma-4-26b-a4b, ${layers} of 30 layers` +
      (layers < 30 ? " (reduced: same per-layer shapes, fewer layers)" : "") +
      ", every expert in memory",
    threads,
    runs,
    // The machine's 1-minute load average at the end: other work on the cores slows llama.cpp's
    // spinning thread barriers far more than it slows Redwing, so read ratios with this in mind.
    load_average_at_end: loadavg()[0] ?? 0,
    decode_tokens: decode,
    peer: "llama.cpp via node-llama-cpp (prebuilt CPU binaries), bench/peers/package.json",
    rows,
    redwing_decode_parts_ms_per_token: lastParts["redwing-exact"] ?? null,
    redwing_head_decode_parts_ms_per_token: lastParts["redwing-head"] ?? null,
    redwing_int8_decode_parts_ms_per_token: lastParts["redwing-int8"] ?? null,
    bandwidth,
  };
  console.log(result.model);
  console.log(
    `${threads} threads, medians of ${runs} interleaved runs, tokens/s; load average at the end ${result.load_average_at_end.toFixed(1)}`,
  );
  console.log(
    "| | llama.cpp | Redwing exact | exact / llama.cpp | Redwing head (default) | head / llama.cpp | Redwing int8 | int8 / llama.cpp |",
  );
  console.log("|---|---|---|---|---|---|---|---|");
  for (const r of rows)
    console.log(
      `| ${r.what} | ${r.llama_cpp.toFixed(2)} | ${r.redwing.toFixed(2)} | ${r.ratio.toFixed(2)} | ` +
        `${r.redwing_head.toFixed(2)} | ${r.ratio_head.toFixed(2)} | ` +
        `${r.redwing_int8.toFixed(2)} | ${r.ratio_int8.toFixed(2)} |`,
    );
  const share = (gbps: number) =>
    probe ? ` (${((100 * gbps) / probe).toFixed(0)}% of the probe)` : "";
  console.log(
    `Decode reads ${(bytesPerToken / 1e9).toFixed(2)} GB of weights per token: Redwing ` +
      `${bandwidth.redwing_decode_gbps.toFixed(1)} GB/s${share(bandwidth.redwing_decode_gbps)} exact, ` +
      `${bandwidth.redwing_head_decode_gbps.toFixed(1)} GB/s${share(bandwidth.redwing_head_decode_gbps)} head, ` +
      `${bandwidth.redwing_int8_decode_gbps.toFixed(1)} GB/s${share(bandwidth.redwing_int8_decode_gbps)} int8, ` +
      `llama.cpp ${bandwidth.llama_cpp_decode_gbps.toFixed(1)} GB/s${share(bandwidth.llama_cpp_decode_gbps)}; ` +
      `bandwidth probe ${probe?.toFixed(1) ?? "n/a"} GB/s at ${threads} threads (median of one a round: ${probes.map((p) => p.toFixed(1)).join(", ") || "none"})`,
  );
  for (const [engine, parts] of Object.entries(lastParts))
    if (parts) console.log(`${engine} decode parts (ms/token, last run):`, JSON.stringify(parts));
  await writeResult("vs-llama-cpp", result);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await runVsLlamaCppBench();
}
