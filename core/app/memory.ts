/**
 * The Tuning view's memory plan. The figures are the engine's own: the decode service answers a
 * plan request (docs/protocol.md, native/src/runtime/memory_plan.h) for the model at the given
 * settings without loading it, so the app, `redwing models` and `redwing-engine memory` print
 * the same numbers. Only the expected hit rate is the app's.
 */
import type { PlanEvent } from "../engine/index.ts";
import type { MemoryPlan } from "./api.ts";

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

/** The MemoryPlan the API answers, from the engine's plan. */
export function memoryPlan(
  model: string | null,
  plan: PlanEvent,
  /** Experts per MoE layer (the hit-rate estimate's denominator); 0 for dense models. */
  experts: number,
  freeMemoryBytes: number,
  book: HitRateBook,
  /** Memory the plan may reuse (the engine's own when this model is loaded now). */
  reusableBytes = 0,
  /** The memory budget the plan was asked for (null: none). */
  budgetBytes: number | null = null,
  /** The GPU memory budget the plan was asked for (null: none, or the CPU backend). */
  vramBudgetBytes: number | null = null,
): MemoryPlan {
  const slots = plan.moe_layers > 0 ? plan.slots : null;
  let expectedHitRate: number | null = null;
  let hitRateSource: MemoryPlan["hitRateSource"] = null;
  if (slots !== null) {
    const measured = model === null ? undefined : book.get(model, slots);
    if (measured !== undefined) {
      expectedHitRate = measured;
      hitRateSource = "measured";
    } else {
      expectedHitRate = estimateHitRate(slots, experts);
      hitRateSource = "estimate";
    }
  }
  return {
    model,
    weightsBytes: plan.core_bytes,
    kvBytes: plan.kv_bytes,
    expertCacheBytes: plan.expert_bytes,
    workBytes: plan.work_bytes,
    totalBytes: plan.total_bytes,
    deviceBytes: plan.device_bytes,
    expertCacheSlots: slots,
    expectedHitRate,
    hitRateSource,
    freeMemoryBytes,
    // Free memory and the budget are separate questions: a small plan over a tiny budget still
    // fits in the free memory, and the view says which limit it exceeds.
    fits: plan.total_bytes <= freeMemoryBytes + reusableBytes,
    budgetBytes,
    vramBudgetBytes,
    overBudget: plan.over_budget,
  };
}
