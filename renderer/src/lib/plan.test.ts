import { describe, expect, it } from "vitest";
import {
  deviceMemoryText,
  gpuExpertCopiesDisabledReason,
  gpuMemoryDisabledReason,
  gpuMissesDisabledReason,
  planVerdict,
} from "./plan.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

describe("planVerdict (the Tuning view's memory-plan badge)", () => {
  it("names the budget, not the free memory, for a small plan over a tiny budget", () => {
    // The case: 114 MiB planned, 23.9 GiB free, a 1 MiB budget.
    const v = planVerdict({
      totalBytes: 114 * MiB,
      freeMemoryBytes: 23.9 * GiB,
      fits: true,
      budgetBytes: 1 * MiB,
      overBudget: "memory budget of 1 MiB cannot hold the model",
      deviceBytes: 0,
    });
    expect(v.tone).toBe("danger");
    expect(v.label).toBe("more than the memory budget");
    expect(v.label).not.toMatch(/free memory/);
    expect(v.detail).toBe(
      "The memory budget (1.0 MiB) cannot hold this plan; it needs at least 114.0 MiB. Raise the budget or leave it empty.",
    );
  });

  it("says more than the free memory only when the total exceeds it", () => {
    const v = planVerdict({
      totalBytes: 30 * GiB,
      freeMemoryBytes: 23.9 * GiB,
      fits: false,
      budgetBytes: null,
      overBudget: null,
      deviceBytes: 0,
    });
    expect(v).toEqual({
      tone: "danger",
      label: "more than the free memory",
      detail: "It needs 30.00 GiB and 23.90 GiB is free now.",
    });
  });

  it("fits", () => {
    const base = { totalBytes: 114 * MiB, freeMemoryBytes: 23.9 * GiB, fits: true, deviceBytes: 0 };
    expect(planVerdict({ ...base, budgetBytes: null, overBudget: null })).toEqual({
      tone: "ok",
      label: "fits in free memory",
      detail: null,
    });
    expect(planVerdict({ ...base, budgetBytes: 8 * GiB, overBudget: null }).label).toBe(
      "fits the budget and free memory",
    );
  });
});

describe("GPU memory in the plan", () => {
  it("names the GPU memory budget when the engine's reason is about it", () => {
    const v = planVerdict({
      totalBytes: 114 * MiB,
      freeMemoryBytes: 23.9 * GiB,
      fits: true,
      budgetBytes: null,
      deviceBytes: 3 * GiB,
      vramBudgetBytes: 1 * GiB,
      overBudget: "GPU memory budget of 1024 MiB cannot hold the model",
    });
    expect(v.tone).toBe("danger");
    expect(v.label).toBe("more than the GPU memory budget");
    expect(v.detail).toBe(
      "The GPU memory budget (1.00 GiB) cannot hold this plan; it needs more than 3.00 GiB of GPU memory. Raise it or leave it empty.",
    );
  });

  it("shows device memory next to host memory only when the plan has some", () => {
    expect(deviceMemoryText({ deviceBytes: 0, vramBudgetBytes: null })).toBeNull();
    expect(deviceMemoryText({ deviceBytes: 1.5 * GiB, vramBudgetBytes: null })).toBe(
      "1.50 GiB (estimate)",
    );
    expect(deviceMemoryText({ deviceBytes: 1.5 * GiB, vramBudgetBytes: 4 * GiB })).toBe(
      "1.50 GiB of 4.00 GiB budget",
    );
  });

  it("turns the GPU memory field off on the CPU only, saying why", () => {
    expect(gpuMemoryDisabledReason("cpu")).toMatch(/host memory only/);
    for (const backend of ["vulkan", "metal", "auto"]) {
      expect(gpuMemoryDisabledReason(backend)).toBeNull();
    }
  });
});

describe("where the GPU's misses run, in Tuning", () => {
  it("is off on the CPU and without a GPU memory budget, saying why; on under one on a GPU", () => {
    expect(gpuMissesDisabledReason({ backend: "cpu", vramBudgetBytes: 4 * GiB })).toMatch(
      /^The CPU backend computes every expert on the CPU/,
    );
    expect(gpuMissesDisabledReason({ backend: "vulkan", vramBudgetBytes: null })).toMatch(
      /^Set GPU memory first/,
    );
    for (const backend of ["vulkan", "metal", "auto"] as const) {
      expect(gpuMissesDisabledReason({ backend, vramBudgetBytes: 4 * GiB })).toBeNull();
    }
  });

  it("takes the number of copies only when the CPU computes misses: split and cpu, not copy", () => {
    const gpu = { backend: "vulkan" as const, vramBudgetBytes: 4 * GiB };
    // Split: the misses the GPU takes; cpu: the extra copies.
    expect(gpuExpertCopiesDisabledReason({ ...gpu, gpuMisses: "split" })).toBeNull();
    expect(gpuExpertCopiesDisabledReason({ ...gpu, gpuMisses: "cpu" })).toBeNull();
    const off =
      "Only with Split between GPU and CPU or Compute on CPU (hybrid), under GPU memory on a GPU backend.";
    expect(gpuExpertCopiesDisabledReason({ ...gpu, gpuMisses: "copy" })).toBe(off);
    for (const gpuMisses of ["split", "cpu"] as const) {
      expect(gpuExpertCopiesDisabledReason({ ...gpu, backend: "cpu", gpuMisses })).toBe(off);
      expect(gpuExpertCopiesDisabledReason({ ...gpu, vramBudgetBytes: null, gpuMisses })).toBe(off);
    }
  });
});
