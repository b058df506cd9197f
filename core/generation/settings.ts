/**
 * Generation settings in one shape each, and the one conversion of each to the decode protocol's
 * fields (snake_case, docs/protocol.md): sampling for the CLI options, the app's settings and the
 * server's request fields; the engine options of `redwing chat`, `complete` and `serve`.
 */
import { expertCacheSlotsFor } from "../defaults.ts";
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
   * GPU's slots miss are computed, "copy" (copied into a GPU slot; the default) or "cpu" (on the
   * CPU from host memory, as llama.cpp's --n-cpu-moe), docs/gpu.md "Hybrid experts".
   */
  gpuMisses?: "copy" | "cpu";
  /** With gpuMisses "cpu": experts copied into GPU slots per MoE layer and step at most. */
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
