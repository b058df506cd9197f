/**
 * The JSON report `redwing-engine generate` prints (native/tools/redwing-engine.cpp, `cmd_generate`
 * and `expert_stats_json`), read by every benchmark that runs it and checked against the engine's
 * real output in tests/engine-accuracy.test.ts (CPU and Vulkan).
 */
import { z } from "zod";

/** One forward pass (token_stats[0] is the prefill, then one entry per decode step). */
export const TokenStat = z.object({
  hits: z.number(),
  /** Of the hits, those already in a GPU slot (the rest are RAM hits: docs/gpu.md). */
  gpu_hits: z.number(),
  misses: z.number(),
  bytes_read: z.number(),
  /** Bytes copied from host to GPU expert slots (0 on the CPU). */
  gpu_copy_bytes: z.number(),
  /** Hybrid experts (`--gpu-misses cpu`): expert uses computed on the CPU, and their time. */
  cpu_experts: z.number(),
  cpu_expert_ms: z.number(),
  io_wait_ms: z.number(),
  compute_ms: z.number(),
});
export type TokenStat = z.infer<typeof TokenStat>;

export const GenerateReport = z.object({
  tokens: z.array(z.number()),
  stop_reason: z.string(),
  prompt_tokens: z.number(),
  prefill_seconds: z.number(),
  decode_seconds: z.number(),
  /** Slots per MoE layer (0: every expert resident, or a dense model). */
  expert_cache_slots: z.number(),
  /** GPU expert slots per MoE layer (fewer than expert_cache_slots: the RAM tier). */
  gpu_expert_slots: z.number(),
  direct_io: z.boolean(),
  peak_rss_bytes: z.number(),
  /** GPU memory the backend holds; 0 on the CPU. */
  device_memory_bytes: z.number(),
  /** Experts not read from the SSD, split into GPU and RAM hits on a GPU (docs/gpu.md). */
  decode_hit_rate: z.number(),
  decode_gpu_hit_rate: z.number(),
  decode_ram_hit_rate: z.number(),
  decode_bytes_read_per_token: z.number(),
  decode_gpu_copy_bytes_per_token: z.number(),
  decode_io_wait_ms_per_token: z.number(),
  /** How a GPU's misses run under the RAM tier: copied to the GPU, on the CPU, or split. */
  gpu_misses: z.enum(["copy", "cpu", "split"]),
  /** With `cpu`: copies into GPU slots per layer and step at most; with `split`: the misses per
   * layer and step the GPU takes; -1 otherwise. */
  gpu_expert_copies: z.number(),
  decode_cpu_experts_per_token: z.number(),
  decode_cpu_expert_ms_per_token: z.number(),
  /** Where a decode step's time goes, by part of the forward pass. */
  decode_parts_ms_per_token: z.record(z.string(), z.number()),
  token_stats: z.array(TokenStat),
  backend: z.string(),
  device: z.string(),
  prefill_submissions: z.number(),
  prefill_dispatches: z.number(),
  decode_submissions_per_token: z.number(),
  decode_dispatches_per_token: z.number(),
  decode_barriers_per_token: z.number(),
  /** Device time per kernel; empty unless REDWING_GPU_PROFILE=1 on a GPU backend. */
  kernel_times: z.array(z.object({ kernel: z.string(), dispatches: z.number(), ms: z.number() })),
});
export type GenerateReport = z.infer<typeof GenerateReport>;

/** Parses what `redwing-engine generate` printed. */
export function parseGenerateReport(stdout: string): GenerateReport {
  return GenerateReport.parse(JSON.parse(stdout));
}

/**
 * `redwing-engine generate`'s arguments (after the binary) for a greedy run: `maxNew` tokens after
 * the prompt `tokens`, on the model in `model`. Greedy so that repeated runs decode the same tokens
 * and their times compare; callers add their own flags after these.
 */
export function greedyGenerateArgs(
  model: string,
  tokens: readonly number[],
  maxNew: number,
): string[] {
  return [
    "generate",
    "--model",
    model,
    "--tokens",
    tokens.join(","),
    "--max-new",
    String(maxNew),
    "--temperature",
    "0",
  ];
}
