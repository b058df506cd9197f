/**
 * What a model costs in memory at given engine settings, computed the way the engine plans it
 * (native/src/runtime/memory_plan.cpp, kv_cache.cpp), so the Tuning view shows what a load will
 * take before it happens:
 *
 * - weights: weights.bin, mapped and touched every token (the "core");
 * - KV cache: per layer 2 (K and V) x rows x KV heads x head_dim x element size, where a sliding
 *   layer keeps min(context, window + prefill chunk) rows and a full layer `context` rows;
 * - expert cache: slots x the layer's expert stride in every MoE layer;
 * - working memory: one prefill chunk of float32 activations, the logits, and 64 MiB for the
 *   executable, libraries and thread stacks.
 *
 * With a memory budget, slots are picked like the engine's slots_for_budget: what is left of the
 * budget after everything at one slot per layer, divided by one slot in every layer, clamped to
 * 1..min(128, experts).
 */
import type { Manifest } from "../format/manifest.ts";
import type { EngineSettings, MemoryPlan } from "./api.ts";

/** The engine's prefill chunk (EngineOptions::chunk, the service's default). */
export const PREFILL_CHUNK = 128;
const MIB = 1024 * 1024;

export interface PlanParts {
  weightsBytes: number;
  kvBytes: number;
  expertCacheBytes: number;
  workBytes: number;
  /** Slots per MoE layer; null for dense models. */
  slots: number | null;
  /** Set when even one slot per layer does not fit the budget. */
  overBudget: boolean;
}

function weightsOf(manifest: Manifest): number {
  return manifest.files.find((f) => f.path === "weights.bin")?.size ?? 0;
}

export function kvBytes(manifest: Manifest, context: number, kvDtype: "f16" | "f32"): number {
  const elem = kvDtype === "f16" ? 2 : 4;
  let total = 0;
  for (const l of manifest.architecture.layers) {
    const rows =
      l.sliding_window === null
        ? context
        : Math.min(context, l.sliding_window + PREFILL_CHUNK /* + ring slack 0 */);
    total += 2 * rows * l.num_kv_heads * l.head_dim * elem;
  }
  return total;
}

function workBytes(manifest: Manifest): number {
  const a = manifest.architecture;
  let maxQ = 0;
  let maxKv = 0;
  for (const l of a.layers) {
    maxQ = Math.max(maxQ, a.num_attention_heads * l.head_dim);
    maxKv = Math.max(maxKv, l.num_kv_heads * l.head_dim);
  }
  const topK = a.moe?.top_k ?? 0;
  const moeInter = a.moe?.intermediate_size ?? 0;
  const experts = a.moe?.num_experts ?? 0;
  const perRow =
    a.hidden_size * (8 + 2 * topK) +
    2 * maxQ +
    2 * maxKv +
    2 * Math.max(a.intermediate_size, moeInter) +
    experts;
  return PREFILL_CHUNK * perRow * 4 + a.vocab_size * 4 * 2 + 64 * MIB;
}

function expertLayers(manifest: Manifest): { stride: number }[] {
  return Object.values(manifest.experts?.layers ?? {}).map((l) => ({ stride: l.stride }));
}

function expertBytes(manifest: Manifest, slots: number): number {
  // The expert store allocates every slot asked for, even beyond the layer's expert count.
  return expertLayers(manifest).reduce((s, l) => s + slots * l.stride, 0);
}

/** The engine's memory plan for `manifest` at `engine` settings. */
export function planParts(manifest: Manifest, engine: EngineSettings): PlanParts {
  const weights = weightsOf(manifest);
  const kv = kvBytes(manifest, engine.context, engine.kvDtype);
  const work = workBytes(manifest);
  const layers = expertLayers(manifest);
  if (layers.length === 0) {
    return {
      weightsBytes: weights,
      kvBytes: kv,
      expertCacheBytes: 0,
      workBytes: work,
      slots: null,
      overBudget:
        engine.memoryBudgetBytes !== null && weights + kv + work > engine.memoryBudgetBytes,
    };
  }
  let slots = engine.expertCacheSlots;
  let overBudget = false;
  if (engine.memoryBudgetBytes !== null) {
    const perSlot = layers.reduce((s, l) => s + l.stride, 0);
    const base = weights + kv + work + perSlot;
    const maxSlots = Math.min(128, manifest.architecture.moe?.num_experts ?? 128);
    if (base > engine.memoryBudgetBytes) {
      slots = 1;
      overBudget = true;
    } else {
      const spare = engine.memoryBudgetBytes - (base - perSlot);
      slots = Math.min(maxSlots, Math.max(1, Math.floor(spare / perSlot)));
    }
  }
  return {
    weightsBytes: weights,
    kvBytes: kv,
    expertCacheBytes: expertBytes(manifest, slots),
    workBytes: work,
    slots,
    overBudget,
  };
}

export function planTotal(p: PlanParts): number {
  return p.weightsBytes + p.kvBytes + p.expertCacheBytes + p.workBytes;
}

/**
 * The hit rate an expert cache of `slots` per layer is expected to reach, when nothing was
 * measured: an ESTIMATE. Assumes each token routes top_k of `experts` uniformly at random and
 * the cache holds `slots` of them, so a requested expert is cached with probability
 * slots / experts (1 when every expert fits). Real routing is skewed towards favourite experts,
 * so measured hit rates are usually higher: this is a floor more than a forecast.
 */
export function estimateHitRate(slots: number, experts: number): number {
  if (experts <= 0) return 1;
  return Math.min(1, slots / experts);
}

/** Hit rates seen this session, per model and slot count. */
export class HitRateBook {
  private readonly seen = new Map<string, number>();
  record(model: string, slots: number, hitRate: number): void {
    this.seen.set(`${model}\0${slots}`, hitRate);
  }
  get(model: string, slots: number): number | undefined {
    return this.seen.get(`${model}\0${slots}`);
  }
}

/** The MemoryPlan the API answers. */
export function memoryPlan(
  model: string | null,
  manifest: Manifest,
  engine: EngineSettings,
  freeMemoryBytes: number,
  book: HitRateBook,
  /** Memory the plan may reuse (the engine's own when this model is loaded now). */
  reusableBytes = 0,
): MemoryPlan {
  const p = planParts(manifest, engine);
  const total = planTotal(p);
  let expectedHitRate: number | null = null;
  let hitRateSource: MemoryPlan["hitRateSource"] = null;
  if (p.slots !== null) {
    const measured = model === null ? undefined : book.get(model, p.slots);
    if (measured !== undefined) {
      expectedHitRate = measured;
      hitRateSource = "measured";
    } else {
      expectedHitRate = estimateHitRate(p.slots, manifest.architecture.moe?.num_experts ?? 0);
      hitRateSource = "estimate";
    }
  }
  return {
    model,
    weightsBytes: p.weightsBytes,
    kvBytes: p.kvBytes,
    expertCacheBytes: p.expertCacheBytes,
    totalBytes: total,
    expertCacheSlots: p.slots,
    expectedHitRate,
    hitRateSource,
    freeMemoryBytes,
    fits: !p.overBudget && total <= freeMemoryBytes + reusableBytes,
  };
}
