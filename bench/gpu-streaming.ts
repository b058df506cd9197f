/**
 * Expert streaming on the GPU (docs/gpu.md, "Expert streaming on the GPU"): decode at batch 1
 * with the experts streamed from SSD into GPU slots under several GPU memory budgets, next to
 * every expert resident.
 *
 *   npm run bench -- gpu-streaming [--model DIR | --synth-layers N] [--budgets 2G,4G,8G]
 *                                  [--decode 32] [--trace synthetic:reuse=0.45,seed=1]
 *                                  [--kv-dtype f16] [--direct-io off] [--tier ssd|ram|both]
 *                                  [--gpu-misses split|cpu|copy|both|all]
 *                                  [--gpu-expert-copies N]
 *                                  [--threads N] [--engine PATH] [--out DIR]
 *                                  [--llama-bench PATH [--gguf PATH] [--llama-runs 2]]
 *
 * The model is --model, or the synthetic Gemma 4 26B-A4B cut to --synth-layers N of its 30
 * layers, or by default the gemma4-moe fixture (then the budgets default to a few MiB, so that
 * it streams through lavapipe in seconds). Each budget runs `redwing-engine generate --backend
 * vulkan --vram-budget B` (the engine picks the GPU slots per layer that fit, or every expert
 * when they all do) on an 8-token prompt, once per --tier: `ssd` gives the host as many expert
 * slots as the GPU (every GPU miss is a read), `ram` lets the host keep every expert it has read
 * (the RAM tier of docs/gpu.md: a GPU miss is a read only on the expert's first use, so a short
 * run still reads a lot; --decode sets how long it warms). The routing is --trace (benchmark
 * only: it replaces the router's choice; "router" keeps the model's own, random on a synthetic
 * model). Reported per budget and tier: slots per layer (GPU and host), device memory, decode
 * tok/s, GPU and RAM hit rates, bytes read from the SSD and copied to the GPU per token, I/O wait
 * per token, submissions (host round trips) per token.
 * --gpu-misses (default split, the engine's default): how the RAM tier's GPU misses run, `copy`
 * into a GPU slot and computed there, `cpu` (hybrid experts: computed on the CPU with --threads
 * threads, at most --gpu-expert-copies of them per layer and step also copied to the GPU) or
 * `split` (--gpu-expert-copies of a layer's misses per step copied and computed on the GPU, the
 * rest on the CPU at the same time); the engine's default copies when not given. `both` runs
 * each `ram` row as copy and cpu, `all` as all three. The `ssd` tier has no RAM tier, so it
 * always copies. The rows then also show the experts the CPU computed and its ms per token.
 * --llama-bench PATH (or LLAMA_CPP_DIR with a build of llama.cpp's llama-bench; nothing here
 * builds it) adds llama.cpp `--n-cpu-moe` at each budget beside the `ram` rows, in the same run
 * (bench/llama-cpu-moe.ts): the GGUF of the same shapes (--gguf, else written for the synthetic
 * model's layer count by bench/gguf-gemma4.ts), N the fewest layers whose experts stay on the CPU
 * so that its GPU buffers fit the budget, `llama-bench -ngl 99 -ncmoe N -p 0 -n --decode -r
 * --llama-runs`; the table gives both engines' decode tok/s and the ratio. Only for the synthetic
 * 26B-A4B (--synth-layers or a --model of its shapes).
 * Results go to bench/results/gpu-streaming.json (or --out).
 */
import { existsSync } from "node:fs";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { captureOutput, nativeBinary } from "../core/native.ts";
import { parseByteSize } from "../core/units.ts";
import { parseGenerateReport } from "./generate-report.ts";
import { cachedGemma4Gguf } from "./gguf-gemma4.ts";
import {
  cpuMoeLayers,
  llamaBenchBinary,
  type LlamaCpuMoeResult,
  runLlamaCpuMoe,
} from "./llama-cpu-moe.ts";
import { flag, writeResult } from "./stats.ts";

const root = fileURLToPath(new URL("..", import.meta.url));

const Plan = z.object({ gpu_slots: z.number() });

type Tier = "ssd" | "ram";
type Misses = "copy" | "cpu" | "split";

function option(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

async function defaultModel(): Promise<{ model: string; budgets: string }> {
  const layers = option("synth-layers");
  if (layers !== undefined) {
    const { synthesizeModel } = await import("../core/synth/synth.ts");
    const model = join(tmpdir(), "redwing-bench", `gemma-4-26b-a4b-${layers}l`);
    if (!existsSync(join(model, "manifest.json")))
      await synthesizeModel({ preset: "gemma-4-26b-a4b", out: model, layers: Number(layers) });
    return { model, budgets: "2G,4G,8G" };
  }
  const { importCheckpoint } = await import("../core/import/index.ts");
  const model = join(await mkdtemp(join(tmpdir(), "redwing-gpu-streaming-")), "gemma4-moe");
  await importCheckpoint(join(root, "fixtures", "gemma4-moe", "mlx"), model, { durable: false });
  return { model, budgets: "3.3M,3.5M,8M" };
}

const percent = (rate: number | null) => (rate === null ? "-" : `${(100 * rate).toFixed(1)}%`);

export async function runGpuStreamingBench(): Promise<void> {
  const decode = flag("decode", 32);
  const kvDtype = option("kv-dtype") ?? "f16";
  const trace = option("trace") ?? "synthetic:reuse=0.45,seed=1";
  const engine = option("engine") ?? nativeBinary("redwing-engine");
  const chosen = option("model");
  const { model, budgets } = chosen ? { model: chosen, budgets: "2G,4G,8G" } : await defaultModel();
  const budgetList = (option("budgets") ?? budgets).split(",");
  const manifest = JSON.parse(await readFile(join(model, "manifest.json"), "utf8")) as {
    architecture: { vocab_size: number; hidden_size: number; num_layers: number };
  };
  const llamaBench = llamaBenchBinary(option("llama-bench"));
  const vocab = manifest.architecture.vocab_size;
  const tokens = Array.from({ length: 8 }, (_, i) => (1000 + i * 7919) % vocab).join(",");

  const tierOption = option("tier") ?? "both";
  if (!["ssd", "ram", "both"].includes(tierOption))
    throw new Error(`--tier must be ssd, ram or both, not ${tierOption}`);
  const tiers: Tier[] = tierOption === "both" ? ["ssd", "ram"] : [tierOption as Tier];
  const missesOption = option("gpu-misses") ?? "split";
  if (!["copy", "cpu", "split", "both", "all"].includes(missesOption))
    throw new Error(`--gpu-misses must be split, cpu, copy, both or all, not ${missesOption}`);
  const missModes: Misses[] =
    missesOption === "both"
      ? ["copy", "cpu"]
      : missesOption === "all"
        ? ["copy", "cpu", "split"]
        : [missesOption as Misses];
  const copies = option("gpu-expert-copies");
  const threads = option("threads");

  const engineCommand = (command: string) => [
    engine,
    command,
    "--model",
    model,
    "--backend",
    "vulkan",
    "--kv-dtype",
    kvDtype,
    ...(threads === undefined ? [] : ["--threads", threads]),
  ];

  // `ssd`: the host keeps as many slots as the GPU (the engine's pick for the budget), so every
  // GPU miss is a read; `ram`: the engine's default under --vram-budget, every expert read stays
  // in host memory.
  const hostSlots = async (budget: string, tier: Tier): Promise<string[]> => {
    if (tier === "ram") return [];
    const plan = Plan.parse(
      JSON.parse(await captureOutput([...engineCommand("memory"), "--vram-budget", budget])),
    );
    return plan.gpu_slots > 0 ? ["--expert-cache-slots", String(plan.gpu_slots)] : [];
  };

  const run = async (budget: string | null, tier: Tier | null, misses: Misses = "split") => {
    const argv = [
      ...engineCommand("generate"),
      "--tokens",
      tokens,
      "--max-new",
      String(decode + 1),
      "--temperature",
      "0",
      ...(budget === null ? ["--expert-cache-slots", "0"] : ["--vram-budget", budget]),
      ...(budget === null || tier === null ? [] : await hostSlots(budget, tier)),
      ...(trace === "router" ? [] : ["--routing-trace", trace]),
      // --direct-io off: expert reads through the page cache (a RAM tier once the files are
      // cached), to split the SSD's share of a token from the rest of the streaming path.
      ...(option("direct-io") === "off" ? ["--direct-io", "off"] : []),
      // Always named: the engine's default is not copy.
      ...(budget === null ? [] : ["--gpu-misses", misses]),
      ...(misses !== "copy" && copies !== undefined ? ["--gpu-expert-copies", copies] : []),
    ];
    const r = parseGenerateReport(await captureOutput(argv));
    return {
      budget,
      tier,
      gpu_misses: r.gpu_misses,
      gpu_expert_copies: r.gpu_expert_copies,
      cpu_experts_per_token: r.decode_cpu_experts_per_token,
      cpu_expert_ms_per_token: r.decode_cpu_expert_ms_per_token,
      slots: r.gpu_expert_slots,
      host_slots: r.expert_cache_slots,
      device_memory_bytes: r.device_memory_bytes,
      decode_tokens_per_s: (r.tokens.length - 1) / r.decode_seconds,
      hit_rate: r.decode_hit_rate,
      gpu_hit_rate: r.decode_gpu_hit_rate,
      ram_hit_rate: r.decode_ram_hit_rate,
      gpu_copy_bytes_per_token: r.decode_gpu_copy_bytes_per_token,
      bytes_read_per_token: r.decode_bytes_read_per_token,
      io_wait_ms_per_token: r.decode_io_wait_ms_per_token,
      submissions_per_token: r.decode_submissions_per_token,
      dispatches_per_token: r.decode_dispatches_per_token,
      device: r.device,
      direct_io: r.direct_io,
    };
  };

  const rows = [await run(null, null)];
  const refused: { budget: string; tier: Tier; error: string }[] = [];
  for (const b of budgetList)
    for (const tier of tiers)
      for (const misses of tier === "ssd" ? (["copy"] as Misses[]) : missModes) {
        try {
          rows.push(await run(b, tier, misses));
        } catch (e) {
          // A budget that cannot hold the model: the engine says why; the other budgets still run.
          refused.push({ budget: b, tier, error: e instanceof Error ? e.message : String(e) });
        }
      }
  const direct = rows[1]?.direct_io;
  console.log(
    `${rows[0]!.device}; ${model}; KV ${kvDtype}; routing ${trace}; ${decode} tokens; expert reads ${direct === false ? "through the page cache" : "direct (O_DIRECT)"}`,
  );
  console.log(
    "GPU budget | tier | GPU misses | GPU/host slots per layer | device GB | decode tok/s | GPU hits | RAM hits | MB read/token | MB to GPU/token | CPU experts/token | CPU ms/token | I/O wait ms/token | submissions/token",
  );
  for (const r of rows)
    console.log(
      [
        r.budget ?? "resident",
        r.tier ?? "-",
        r.gpu_misses === "cpu"
          ? `cpu (${r.gpu_expert_copies} copies)`
          : r.gpu_misses === "split"
            ? `split (${r.gpu_expert_copies} to the GPU)`
            : "copy",
        r.slots === 0 ? "all" : `${r.slots}/${r.host_slots === 0 ? "all" : r.host_slots}`,
        (r.device_memory_bytes / 1e9).toFixed(2),
        r.decode_tokens_per_s.toFixed(1),
        percent(r.slots === 0 ? null : r.gpu_hit_rate),
        percent(r.slots === 0 ? null : r.ram_hit_rate),
        (r.bytes_read_per_token / 1e6).toFixed(2),
        (r.gpu_copy_bytes_per_token / 1e6).toFixed(2),
        r.cpu_experts_per_token.toFixed(1),
        r.cpu_expert_ms_per_token.toFixed(2),
        r.io_wait_ms_per_token.toFixed(2),
        r.submissions_per_token.toFixed(1),
      ].join(" | "),
    );
  for (const r of refused) console.log(`${r.budget} ${r.tier}: refused: ${r.error.slice(-400)}`);

  // llama.cpp --n-cpu-moe at the same budgets, after our rows (its CPU work would disturb ours).
  let llama: { budget: string; n_cpu_moe: number; result: LlamaCpuMoeResult | null }[] = [];
  if (llamaBench !== undefined) {
    if (manifest.architecture.hidden_size !== 2816)
      throw new Error("--llama-bench needs the synthetic Gemma 4 26B-A4B (--synth-layers N)");
    const layers = manifest.architecture.num_layers;
    const gguf =
      option("gguf") ??
      (await cachedGemma4Gguf(join(tmpdir(), "redwing-bench"), layers, "gpu-streaming"));
    const ncmoe = budgetList.map((b) => {
      const bytes = parseByteSize(b);
      if (bytes === undefined) throw new Error(`--budgets: ${b} is not a size`);
      return cpuMoeLayers(bytes, layers);
    });
    const results = await runLlamaCpuMoe({
      llamaBench,
      gguf,
      ncmoe,
      decode,
      runs: flag("llama-runs", 2),
      ...(threads === undefined ? {} : { threads: Number(threads) }),
    });
    llama = budgetList.map((budget, i) => ({
      budget,
      n_cpu_moe: ncmoe[i]!,
      result: results.find((r) => r.n_cpu_moe === ncmoe[i]) ?? null,
    }));
    console.log(
      `\nllama.cpp --n-cpu-moe (${llamaBench}, ${gguf}) | Redwing, ram tier (decode tok/s) | llama.cpp tok/s | Redwing / llama.cpp`,
    );
    for (const l of llama) {
      for (const r of rows.filter((row) => row.budget === l.budget && row.tier === "ram")) {
        const theirs = l.result?.avg_ts;
        console.log(
          [
            `${l.budget}, -ncmoe ${l.n_cpu_moe}`,
            `${r.gpu_misses} ${r.decode_tokens_per_s.toFixed(1)}`,
            theirs === undefined ? "-" : `${theirs.toFixed(1)} ± ${l.result!.stddev_ts.toFixed(1)}`,
            theirs === undefined ? "-" : `${(r.decode_tokens_per_s / theirs).toFixed(2)}x`,
          ].join(" | "),
        );
      }
    }
  }
  await writeResult(
    "gpu-streaming",
    { model, kv_dtype: kvDtype, trace, decode_tokens: decode, rows, refused, llama },
    option("out"),
  );
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await runGpuStreamingBench();
}
