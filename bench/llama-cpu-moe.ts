/**
 * llama.cpp `--n-cpu-moe` beside `npm run bench -- gpu-streaming` (issue 13's yardstick): the same
 * model shapes in a GGUF (bench/gguf-gemma4.ts), the experts of the first N layers in host memory
 * and computed on the CPU, everything else on the GPU, N chosen so that llama.cpp's GPU buffers
 * fit the same GPU memory budget as Redwing's run.
 *
 * node-llama-cpp (bench/peers) has no option for it, so this runs a `llama-bench` the user built
 * (`--llama-bench PATH`, or LLAMA_CPP_DIR/build/bin/llama-bench): a CUDA or Vulkan build of
 * llama.cpp from its source. Nothing here builds it.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { captureOutput } from "../core/native.ts";
import { gemma4Gguf } from "./gguf-gemma4.ts";
import { tensorBytes } from "./gguf.ts";

const MIB = 1024 * 1024;

/**
 * llama-bench's GPU memory beyond the weights on this model: its KV cache and compute buffers
 * (55 and 275 MiB in its log on the H200 with -p 0 -n 32, 2026-12-02) and 64 MiB of slack.
 */
export const LLAMA_GPU_ALLOWANCE_BYTES = (55 + 275 + 64) * MIB;

/** The synthetic 26B-A4B GGUF's bytes: the weights llama.cpp keeps on the GPU, and a layer's experts. */
export function ggufGpuBytes(layers: number): { coreBytes: number; layerExpertBytes: number } {
  let core = 0;
  let experts = 0;
  for (const t of gemma4Gguf(layers).tensors) {
    const bytes = tensorBytes(t.dims, t.type);
    if (t.name.endsWith("_exps.weight")) experts += bytes;
    else core += bytes;
  }
  return { coreBytes: core, layerExpertBytes: experts / layers };
}

/**
 * `--n-cpu-moe` for a GPU memory budget: the fewest layers whose experts stay on the CPU so that
 * the rest of the model, the other layers' experts and the allowance fit the budget (every layer
 * when even the core does not leave room for one layer's experts).
 */
export function cpuMoeLayers(
  budgetBytes: number,
  layers: number,
  sizes = ggufGpuBytes(layers),
): number {
  const room = budgetBytes - sizes.coreBytes - LLAMA_GPU_ALLOWANCE_BYTES;
  const onGpu = Math.max(0, Math.floor(room / sizes.layerExpertBytes));
  return Math.max(0, layers - onGpu);
}

/** The llama-bench binary: `--llama-bench PATH`, else LLAMA_CPP_DIR's build; undefined: none. */
export function llamaBenchBinary(explicit: string | undefined): string | undefined {
  const path =
    explicit ??
    (process.env.LLAMA_CPP_DIR
      ? join(process.env.LLAMA_CPP_DIR, "build", "bin", "llama-bench")
      : undefined);
  if (path !== undefined && !existsSync(path)) throw new Error(`no llama-bench at ${path}`);
  return path;
}

const LlamaBenchRow = z.object({
  n_cpu_moe: z.number(),
  n_gen: z.number(),
  avg_ts: z.number(),
  stddev_ts: z.number(),
});
export type LlamaCpuMoeResult = z.infer<typeof LlamaBenchRow>;

/** Reads `llama-bench -o json`'s rows (its generation tests only). */
export function parseLlamaBenchJson(text: string): LlamaCpuMoeResult[] {
  const rows = z.array(z.object({}).passthrough()).parse(JSON.parse(text));
  return rows
    .map((r) => LlamaBenchRow.passthrough().parse(r))
    .filter((r) => r.n_gen > 0)
    .map(({ n_cpu_moe, n_gen, avg_ts, stddev_ts }) => ({ n_cpu_moe, n_gen, avg_ts, stddev_ts }));
}

/** Decode (tg) at each `--n-cpu-moe` in one llama-bench process: every layer offloaded (-ngl 99). */
export async function runLlamaCpuMoe(o: {
  llamaBench: string;
  gguf: string;
  ncmoe: number[];
  decode: number;
  runs: number;
  threads?: number;
}): Promise<LlamaCpuMoeResult[]> {
  const args = [
    "-m",
    o.gguf,
    "-ngl",
    "99",
    "-ncmoe",
    [...new Set(o.ncmoe)].join(","),
    "-p",
    "0",
    "-n",
    String(o.decode),
    "-r",
    String(o.runs),
    "-o",
    "json",
    ...(o.threads === undefined ? [] : ["-t", String(o.threads)]),
  ];
  const out = await captureOutput([o.llamaBench, ...args]);
  return parseLlamaBenchJson(out);
}
