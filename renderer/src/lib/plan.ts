/**
 * What the Tuning view's memory-plan badge says. The free memory and the memory budget are two
 * different limits: a 114 MiB plan over a 1 MiB budget is over the budget, not "more than the
 * free memory" with 23.9 GiB free, so each is named on its own.
 */
import type { EngineSettings, MemoryPlan } from "../../../core/app/api.ts";
import { formatBytes } from "./format.ts";

export interface PlanVerdict {
  tone: "ok" | "danger";
  /** The badge. */
  label: string;
  /** A sentence saying which limit the plan exceeds and by how much; null when it fits. */
  detail: string | null;
}

export function planVerdict(
  plan: Pick<
    MemoryPlan,
    "totalBytes" | "freeMemoryBytes" | "fits" | "budgetBytes" | "overBudget" | "deviceBytes"
  > &
    Partial<Pick<MemoryPlan, "vramBudgetBytes">>,
): PlanVerdict {
  // The engine's reason names the GPU memory budget when that is the one exceeded.
  if (plan.overBudget?.startsWith("GPU memory budget")) {
    const budget =
      plan.vramBudgetBytes == null ? "the GPU memory budget" : formatBytes(plan.vramBudgetBytes);
    return {
      tone: "danger",
      label: "more than the GPU memory budget",
      detail: `The GPU memory budget (${budget}) cannot hold this plan; it needs more than ${formatBytes(plan.deviceBytes)} of GPU memory. Raise it or leave it empty.`,
    };
  }
  if (plan.overBudget != null) {
    const budget = plan.budgetBytes === null ? "the memory budget" : formatBytes(plan.budgetBytes);
    return {
      tone: "danger",
      label: "more than the memory budget",
      detail: `The memory budget (${budget}) cannot hold this plan; it needs at least ${formatBytes(plan.totalBytes)}. Raise the budget or leave it empty.`,
    };
  }
  if (!plan.fits) {
    return {
      tone: "danger",
      label: "more than the free memory",
      detail: `It needs ${formatBytes(plan.totalBytes)} and ${formatBytes(plan.freeMemoryBytes)} is free now.`,
    };
  }
  return {
    tone: "ok",
    label: plan.budgetBytes === null ? "fits in free memory" : "fits the budget and free memory",
    detail: null,
  };
}

/**
 * The plan's GPU memory next to its host memory: null on the CPU (no device memory planned),
 * else the estimate and, with a GPU memory budget, the budget it is planned into.
 */
export function deviceMemoryText(
  plan: Pick<MemoryPlan, "deviceBytes"> & Partial<Pick<MemoryPlan, "vramBudgetBytes">>,
): string | null {
  if (!(plan.deviceBytes > 0)) return null;
  return plan.vramBudgetBytes == null
    ? `${formatBytes(plan.deviceBytes)} (estimate)`
    : `${formatBytes(plan.deviceBytes)} of ${formatBytes(plan.vramBudgetBytes)} budget`;
}

/** Why the GPU memory field is off for a backend (the CPU uses host memory only); null: on. */
export function gpuMemoryDisabledReason(backend: string): string | null {
  return backend === "cpu"
    ? "The CPU backend uses host memory only: choose a GPU backend to set GPU memory."
    : null;
}

/**
 * Why the choice of where the GPU's expert misses run is off; null: on. It exists only under the
 * RAM tier (the GPU holding fewer experts than host memory), which the app's settings reach only
 * with a GPU memory budget on a GPU backend (effectiveGpuMisses); elsewhere the engine ignores it.
 */
export function gpuMissesDisabledReason(
  e: Pick<EngineSettings, "backend" | "vramBudgetBytes">,
): string | null {
  if (e.backend === "cpu") {
    return "The CPU backend computes every expert on the CPU: choose a GPU backend and set GPU memory to choose where the GPU's misses run.";
  }
  if (e.vramBudgetBytes == null) {
    return "Set GPU memory first: this applies when the GPU holds fewer experts than system RAM, which a GPU memory budget sets up.";
  }
  return null;
}

/**
 * Why the number of expert copies is off; null: on. It counts only where the CPU computes misses:
 * with "split" (the misses the GPU takes) and "cpu" (the extra copies), never with "copy".
 */
export function gpuExpertCopiesDisabledReason(
  e: Pick<EngineSettings, "backend" | "vramBudgetBytes" | "gpuMisses">,
): string | null {
  return gpuMissesDisabledReason(e) === null && e.gpuMisses !== "copy"
    ? null
    : "Only with Split between GPU and CPU or Compute on CPU (hybrid), under GPU memory on a GPU backend.";
}
