/**
 * Every default the CLI, the OpenAI-compatible server and the app start from, in one place.
 * `cli/commands/*` shows them in their help and uses them as option defaults, the server fills
 * missing request fields from them, the app's settings start from them (core/app/api.ts), and
 * the README and docs state them: `core/defaults.test.ts` fails when a document drifts.
 *
 * The native engine has defaults of its own for protocol fields a client leaves out
 * (docs/protocol.md); the clients here always send the ones below, so these are what users get.
 *
 * This module imports nothing: the renderer reads it through core/app/api.ts.
 */

/** Sampling for chat and completion in the CLI and the app (Gemma's recommended settings). */
export const SAMPLING_DEFAULTS = {
  /** 0 picks the most likely token. */
  temperature: 0.2,
  /** 0: no top-k. */
  topK: 64,
  topP: 0.95,
  /** 1: no penalty. */
  repetitionPenalty: 1.0,
  /** Most tokens one reply may generate (the context may lower it). */
  maxNewTokens: 1024,
} as const;

/**
 * Sampling for a request to the OpenAI-compatible server that leaves a field out: OpenAI's own
 * documented defaults (temperature 1, top_p 1), and no top-k or repetition penalty, which
 * OpenAI's API does not have. Clients written for OpenAI get what they expect.
 */
export const OPENAI_SAMPLING_DEFAULTS = {
  temperature: 1,
  topK: 0,
  topP: 1,
  repetitionPenalty: 1,
} as const;

/**
 * Where a GPU's expert misses may run under the RAM tier (ENGINE_DEFAULTS.gpuMisses): the
 * engine's choices, which the protocol's and the app's schemas and the CLI's flag all take.
 */
export const GPU_MISSES = ["copy", "cpu", "split"] as const;
export type GpuMisses = (typeof GPU_MISSES)[number];

/** How the engine loads a model. */
export const ENGINE_DEFAULTS = {
  /** KV cache positions: prompt plus output. */
  context: 4096,
  /**
   * Experts kept in memory per MoE layer when they stream from the SSD; used unless a memory
   * budget is given (the engine then picks the count that fits). 0 keeps every expert resident.
   */
  expertCacheSlots: 16,
  /** CPU threads; 0: REDWING_THREADS or one per core. */
  threads: 0,
  backend: "cpu",
  /** KV cache precision. */
  kvDtype: "f16",
  /**
   * Input precision of the quantized products, an activation plan (docs/protocol.md): "exact"
   * float32, "int8" (approximate, faster on the CPU), or the kinds of product on int8. "head":
   * only the output head, where 8-bit inputs measured harmless on the demo model (perplexity
   * -0.07%).
   */
  activations: "head",
  /**
   * Under the RAM tier on a GPU (docs/gpu.md, "Hybrid experts"): where the experts the GPU's
   * slots miss are computed, "copy" (copied into a GPU slot, computed there), "cpu" (on the CPU
   * from RAM) or "split" (gpuExpertCopies of a layer's misses per step copied and computed on the
   * GPU, the rest on the CPU at the same time). The engine's default (native defaults.h): on an
   * H200, split with 2 copies decoded 1.1-1.4x faster than "cpu" at 2 GB of GPU memory, 0.96-1.12x
   * at 4 GB and 1.0-1.3x at 8 GB.
   */
  gpuMisses: "split" satisfies GpuMisses,
  /**
   * Experts copied into GPU slots per MoE layer and step: with gpuMisses "split" the misses the
   * GPU computes (2 balanced the PCIe link against the CPU on the H200), with "cpu" at most this
   * many extra copies so the slots learn the hot experts. The engine's default.
   */
  gpuExpertCopies: 2,
  /** Prefill chunk: prompt tokens per batched forward call. */
  prefillChunk: 512,
  /** The prefill chunk under a memory or GPU memory budget (its memory goes to expert slots). */
  budgetPrefillChunk: 128,
} as const;

/** The app's chat. */
export const CHAT_DEFAULTS = {
  /**
   * When the conversation is longer than the context (per model; core/app/context-fit.ts): the
   * oldest exchanges are left out, the system prompt kept. It never dead-ends: every turn gets an
   * answer while the newest message fits, and a reply is built on the recent turns it follows.
   * ("stop" refuses the turn; "truncate_middle" keeps the first exchange, which may itself be
   * what no longer fits.)
   */
  contextOverflow: "rolling_window",
} as const;

/** `redwing perplexity`: the window (tokens a prediction may look back on). */
export const PERPLEXITY_DEFAULTS = { window: 512 } as const;

/** The OpenAI-compatible server (`redwing serve`, and the app's server switch). */
export const SERVER_DEFAULTS = {
  host: "127.0.0.1",
  port: 8080,
  /** Requests that may wait behind the running one; more get 429. */
  queueLimit: 4,
  /** Largest request body in bytes (4 MiB). */
  bodyLimitBytes: 4 * 1024 * 1024,
} as const;

/**
 * The expert-cache slot count to load with: the one asked for, else the default unless a memory
 * budget is given (then none, and the engine picks the count that fits the budget).
 */
export function expertCacheSlotsFor(
  slots: number | undefined,
  memoryBudget: number | null | undefined,
): number | undefined {
  if (slots !== undefined) return slots;
  return memoryBudget === undefined || memoryBudget === null
    ? ENGINE_DEFAULTS.expertCacheSlots
    : undefined;
}
