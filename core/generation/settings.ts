/**
 * Generation settings in one shape each, and the one conversion of each to the decode protocol's
 * fields (snake_case, docs/protocol.md): sampling for the CLI options, the app's settings and the
 * server's request fields; the engine options of `redwing chat`, `complete` and `serve`.
 */
import { expertCacheSlotsFor, type GpuMisses } from "../defaults.ts";
import type { LoadParams, Sampling } from "../engine/protocol.ts";

export interface SamplingSettings {
  /** 0: the most likely token. */
  temperature: number;
  /** 0: no top-k. */
  topK: number;
  topP: number;
  /** 1: none. */
  repetitionPenalty: number;
  /** Omitted or null: a random seed. */
  seed?: number | null;
}

/** The protocol's sampling fields for `s`; no seed field when the seed is random. */
export function toProtocolSampling(s: SamplingSettings): Sampling {
  return {
    temperature: s.temperature,
    top_k: s.topK,
    top_p: s.topP,
    repetition_penalty: s.repetitionPenalty,
    ...(s.seed !== undefined && s.seed !== null ? { seed: s.seed } : {}),
  };
}

/** How to load a model: the CLI's engine options (`--max-context`, ...), the app's engine settings. */
export interface EngineOptions {
  /** KV cache positions. */
  context: number;
  /** Omitted: REDWING_THREADS or one per core. */
  threads?: number;
  /** Where the model runs (docs/gpu.md); omitted: the CPU. */
  backend?: "cpu" | "metal" | "vulkan" | "auto";
  /** KV cache precision; omitted: the engine's default. */
  kvDtype?: "f16" | "f32";
  /** The quantized products' input precision (an activation plan); omitted: the default. */
  activations?: string;
  /** Omitted: the default, unless a memory budget picks the count. */
  expertCacheSlots?: number;
  /** Bytes. */
  memoryBudget?: number;
  /**
   * GPU memory in bytes (GPU backends, docs/gpu.md "Expert streaming on the GPU"): every expert
   * resident when they fit, else streamed through the slots that fit.
   */
  vramBudget?: number;
  /**
   * Under the RAM tier (GPU memory for fewer experts than host memory): where the experts the
   * GPU's slots miss are computed, "copy" (copied into a GPU slot), "cpu" (on the CPU from host
   * memory, as llama.cpp's --n-cpu-moe) or "split" (the engine's default: gpuExpertCopies of a
   * layer's misses per step on the GPU, the rest on the CPU at once), docs/gpu.md "Hybrid
   * experts". Omitted: the engine's default.
   */
  gpuMisses?: GpuMisses;
  /**
   * Per MoE layer and step: with gpuMisses "split" the misses the GPU copies and computes, with
   * "cpu" the CPU-computed experts also copied into GPU slots at most. Omitted: the default.
   */
  gpuExpertCopies?: number;
}

/**
 * The engine options that `redwing chat`, `complete` and `serve` take as flags (cli's
 * `addEngineOptions`) and the server passes on: all but the KV cache's size and precision.
 */
export type EngineFlags = Omit<EngineOptions, "context" | "kvDtype">;

/** The protocol's load request for `model` (a directory) with these options. */
export function toProtocolLoad(model: string, o: EngineOptions): LoadParams {
  return {
    model,
    context: o.context,
    threads: o.threads,
    backend: o.backend,
    kv_dtype: o.kvDtype,
    activations: o.activations,
    // With a memory or GPU memory budget and no slot count, the engine picks the count that fits.
    expert_cache_slots: expertCacheSlotsFor(o.expertCacheSlots, o.memoryBudget ?? o.vramBudget),
    memory_budget: o.memoryBudget,
    vram_budget: o.vramBudget,
    gpu_misses: o.gpuMisses,
    gpu_expert_copies: o.gpuExpertCopies,
  };
}
