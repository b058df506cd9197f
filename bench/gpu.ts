/**
 * The GPU backend on any Vulkan device: decode and prefill rates, work per decode token and
 * where the device time goes.
 *
 *   npm run bench -- gpu [--model DIR | --synth-layers N] [--decode 64] [--prefill 512,4096]
 *                        [--kv-dtype f16] [--runs 1] [--peak-gbs 4800] [--engine PATH]
 *                        [--out DIR]
 *
 * The model is --model, or with --synth-layers N the synthetic Gemma 4 26B-A4B cut to N of its
 * 30 layers (`redwing synth`, every expert resident), or by default the gemma4-moe fixture
 * (tiny: seconds through lavapipe). `--backend vulkan` takes the first discrete GPU, else
 * lavapipe. Each run of `redwing-engine generate` reports the work its backend recorded; the
 * table shows:
 *   - decode tok/s at batch 1 after a short prompt and after a --prefill[0]-token prompt;
 *   - prefill tok/s for each --prefill length (the engine's default chunk: 512);
 *   - submissions (host waits) and kernel dispatches per decode token;
 *   - the share of device time per kernel, from a profiled decode run (REDWING_GPU_PROFILE=1:
 *     timestamps around every dispatch, so that run is slower and not used for rates);
 *   - the share of the memory bandwidth a decode token reaches: the weight bytes one token reads
 *     (weights.bin once, the experts' files times top_k / num_experts) times the rate, over
 *     --peak-gbs (the device's stated or measured peak; none: not shown).
 * Results go to bench/results/gpu.json (or --out).
 */
import { mkdir, mkdtemp, readFile, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { captureOutput, nativeBinary } from "../core/native.ts";
import { greedyGenerateArgs, parseGenerateReport, type GenerateReport } from "./generate-report.ts";
import { flag, median, writeResult } from "./stats.ts";

const root = fileURLToPath(new URL("..", import.meta.url));

const Manifest = z.object({
  architecture: z.object({
    vocab_size: z.number(),
    moe: z.object({ num_experts: z.number(), top_k: z.number() }).nullable().optional(),
  }),
  files: z.array(z.object({ path: z.string(), size: z.number() })),
});

function option(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

/** Spread-out token ids away from the control range (as bench/engine.ts), inside the vocabulary. */
function prompt(length: number, vocab: number): number[] {
  return Array.from({ length }, (_, i) => (1000 + ((i * 7919) % 200000)) % vocab);
}

async function readManifest(model: string): Promise<z.infer<typeof Manifest>> {
  return Manifest.parse(JSON.parse(await readFile(join(model, "manifest.json"), "utf8")));
}

/** Weight bytes one decode token reads: weights.bin once, the routed share of the experts. */
export async function decodeWeightBytes(model: string): Promise<number> {
  const manifest = await readManifest(model);
  const moe = manifest.architecture.moe;
  let bytes = 0;
  for (const f of manifest.files) {
    if (f.path.startsWith("experts/")) bytes += moe ? (f.size * moe.top_k) / moe.num_experts : 0;
    else bytes += f.size;
  }
  return bytes;
}

async function fixtureModel(): Promise<string> {
  const { importCheckpoint } = await import("../core/import/index.ts");
  const model = join(await mkdtemp(join(tmpdir(), "redwing-gpu-bench-")), "gemma4-moe");
  await importCheckpoint(join(root, "fixtures", "gemma4-moe", "mlx"), model, { durable: false });
  return model;
}

async function synthModel(layers: number): Promise<string> {
  const { synthesizeModel } = await import("../core/synth/synth.ts");
  const cache = process.env.REDWING_BENCH_DIR ?? join(tmpdir(), "redwing-bench");
  const dir = join(cache, `gemma-4-26b-a4b-${layers}l`);
  try {
    await stat(join(dir, "manifest.json"));
  } catch {
    console.error(`gpu: writing the synthetic model ${dir}`);
    await mkdir(cache, { recursive: true });
    await synthesizeModel({ preset: "gemma-4-26b-a4b", out: dir, layers, force: true });
  }
  return dir;
}

export async function runGpuBench(): Promise<void> {
  const decode = flag("decode", 64);
  const runs = flag("runs", 1);
  const prefills = (option("prefill") ?? "512,4096").split(",").map(Number);
  if (prefills.some((n) => !Number.isInteger(n) || n < 1))
    throw new Error("--prefill takes positive token counts, e.g. 512,4096");
  const kvDtype = option("kv-dtype") ?? "f16";
  const peak = option("peak-gbs") ? Number(option("peak-gbs")) : null;
  const engine = option("engine") ?? nativeBinary("redwing-engine");
  const model =
    option("model") ??
    (option("synth-layers") ? await synthModel(flag("synth-layers", 30)) : await fixtureModel());

  const vocab = (await readManifest(model)).architecture.vocab_size;
  const generate = async (
    promptTokens: number,
    maxNew: number,
    profile = false,
  ): Promise<GenerateReport> => {
    const argv = [
      engine,
      ...greedyGenerateArgs(model, prompt(promptTokens, vocab), maxNew),
      "--backend",
      "vulkan",
      "--expert-cache-slots",
      "0",
      "--kv-dtype",
      kvDtype,
    ];
    const previous = process.env.REDWING_GPU_PROFILE;
    process.env.REDWING_GPU_PROFILE = profile ? "1" : "0";
    try {
      return parseGenerateReport(await captureOutput(argv));
    } finally {
      if (previous === undefined) delete process.env.REDWING_GPU_PROFILE;
      else process.env.REDWING_GPU_PROFILE = previous;
    }
  };
  const decodeRate = (r: GenerateReport): number | null =>
    r.tokens.length > 1 ? (r.tokens.length - 1) / r.decode_seconds : null;

  // A short prompt (8 tokens) then `decode` tokens; a prefill[0]-token prompt then `decode`;
  // every other prefill length with one token.
  const short: GenerateReport[] = [];
  const long: GenerateReport[] = [];
  const prefill = new Map<number, number[]>();
  for (let i = 0; i < runs; i++) {
    short.push(await generate(8, decode + 1));
    for (const [j, n] of prefills.entries()) {
      const r = await generate(n, j === 0 ? decode + 1 : 1);
      if (j === 0) long.push(r);
      prefill.set(n, [...(prefill.get(n) ?? []), r.prompt_tokens / r.prefill_seconds]);
    }
  }
  const profiled = await generate(8, decode + 1, true);
  const kernelMs = profiled.kernel_times.reduce((s, k) => s + k.ms, 0);

  const rate = (rs: GenerateReport[]) => {
    const rates = rs.map(decodeRate).filter((r): r is number => r !== null);
    return rates.length ? median(rates) : null;
  };
  const weightBytes = await decodeWeightBytes(model);
  const decodeShort = rate(short);
  const gbps = decodeShort ? (weightBytes * decodeShort) / 1e9 : null;
  const first = short[0]!;
  const result = {
    model,
    device: first.device,
    kv_dtype: kvDtype,
    runs,
    decode_tokens: decode,
    device_memory_bytes: first.device_memory_bytes,
    decode_tokens_per_s_short_prompt: decodeShort,
    [`decode_tokens_per_s_after_${prefills[0]}`]: rate(long),
    prefill_tokens_per_s: Object.fromEntries([...prefill].map(([n, v]) => [n, median(v)])),
    decode_submissions_per_token: first.decode_submissions_per_token,
    decode_dispatches_per_token: first.decode_dispatches_per_token,
    decode_barriers_per_token: first.decode_barriers_per_token,
    weight_bytes_per_decode_token: weightBytes,
    decode_weight_gbps: gbps,
    peak_gbps: peak,
    bandwidth_share: gbps !== null && peak ? gbps / peak : null,
    profiled_run: {
      prompt_tokens: 8,
      decode_tokens: profiled.tokens.length - 1,
      kernel_ms: kernelMs,
      kernels: profiled.kernel_times
        .map((k) => ({ ...k, share: kernelMs > 0 ? k.ms / kernelMs : 0 }))
        .sort((a, b) => b.ms - a.ms),
    },
  };

  console.log(`${result.device}; ${model}; KV ${kvDtype}; medians of ${runs} run(s)`);
  const fmt = (v: number | null, digits = 1) => (v === null ? "-" : v.toFixed(digits));
  console.log(`decode, batch 1, after 8 tokens        ${fmt(decodeShort)} tok/s`);
  console.log(`decode, batch 1, after ${prefills[0]} tokens      ${fmt(rate(long))} tok/s`);
  for (const [n, v] of prefill)
    console.log(`prefill ${n} tokens            ${fmt(median(v))} tok/s`);
  console.log(
    `per decode token: ${first.decode_submissions_per_token.toFixed(1)} submissions, ` +
      `${first.decode_dispatches_per_token.toFixed(0)} dispatches ` +
      `(${first.decode_barriers_per_token.toFixed(0)} barriers), ` +
      `${(weightBytes / 1e9).toFixed(3)} GB of weights` +
      (gbps !== null ? ` (${gbps.toFixed(1)} GB/s` : "") +
      (result.bandwidth_share !== null
        ? `, ${(100 * result.bandwidth_share).toFixed(1)}% of ${peak} GB/s)`
        : gbps !== null
          ? ")"
          : ""),
  );
  console.log(`device time per kernel (profiled run, ${kernelMs.toFixed(1)} ms in kernels):`);
  for (const k of result.profiled_run.kernels)
    console.log(
      `  ${k.kernel.padEnd(18)} ${String(k.dispatches).padStart(8)} dispatches ${k.ms.toFixed(2).padStart(10)} ms ${(100 * k.share).toFixed(1).padStart(5)}%`,
    );
  await writeResult("gpu", result, option("out"));
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await runGpuBench();
}
