import { describe, expect, it } from "vitest";
import type { PlanEvent } from "../engine/index.ts";
import { planEvent } from "../../testkit/plan-event.ts";
import { LoadParamsSchema } from "../engine/protocol.ts";
import { DEFAULT_SETTINGS } from "./api.ts";
import { budgetTooSmall, loadParams } from "./engine.ts";

const MIB = 1024 ** 2;

/** A plan over a 1 MiB budget: 106 MiB and 5 bytes in all. */
function plan(over: Partial<PlanEvent>): PlanEvent {
  return planEvent({
    kv_bytes: 2 * MIB,
    total_bytes: 106 * MIB + 5,
    memory_budget: MIB,
    over_budget: "memory budget of 1 MiB cannot hold the model",
    ...over,
  });
}

describe("budgetTooSmall", () => {
  it("names the cause part by part in one unit family and offers the budget that holds the plan", () => {
    const failure = budgetTooSmall("demo", MIB, plan({}), ' "other" stays loaded.');
    const e = failure.error;
    expect(e.code).toBe("budget_too_small");
    expect(e.action).toBe("apply_fix");
    expect(e.message).toBe(
      'The memory budget of 1.0 MiB is too small for "demo": it needs at least 107.0 MiB ' +
        '(weights 30.0 MiB, KV cache 2.0 MiB, expert cache 4.0 MiB, working memory 70.0 MiB). "other" stays loaded.',
    );
    // Rounded up to whole MiB, never below the plan's total.
    expect(e.fix).toEqual({
      label: "Load with a 107.0 MiB budget",
      model: "demo",
      engine: { memoryBudgetBytes: 107 * MIB },
    });
    expect(e.fix!.engine.memoryBudgetBytes!).toBeGreaterThanOrEqual(106 * MIB + 5);
  });

  it("leaves the expert cache out of a dense model's parts", () => {
    const e = budgetTooSmall("dense", 2 * 1024 ** 3, plan({ expert_bytes: 0 })).error;
    expect(e.message).toContain("The memory budget of 2.00 GiB");
    expect(e.message).not.toContain("expert cache");
  });
});

describe("budgetTooSmall for the GPU memory budget", () => {
  it("names GPU memory and offers the GPU budget that holds the device plan", () => {
    const e = budgetTooSmall(
      "moe",
      0,
      plan({
        memory_budget: 0,
        vram_budget: MIB,
        device_bytes: 40 * MIB + 1,
        over_budget: "GPU memory budget of 1 MiB cannot hold the model",
      }),
    ).error;
    expect(e.code).toBe("budget_too_small");
    expect(e.message).toBe(
      'The GPU memory budget of 1.0 MiB is too small for "moe": it needs at least 41.0 MiB of GPU memory.',
    );
    expect(e.fix).toEqual({
      label: "Load with 41.0 MiB of GPU memory",
      model: "moe",
      engine: { vramBudgetBytes: 41 * MIB },
    });
  });
});

describe("loadParams", () => {
  const base = DEFAULT_SETTINGS.engine;
  it("sends the GPU memory budget on a GPU backend, and lets it pick the slots", () => {
    const out = loadParams("/m", {
      ...base,
      backend: "vulkan",
      vramBudgetBytes: 4 * 1024 ** 3 + 0.5,
    });
    expect(out.vram_budget).toBe(4 * 1024 ** 3);
    expect(out.expert_cache_slots).toBeUndefined();
    expect(out.memory_budget).toBeUndefined();
    expect(LoadParamsSchema.strict().parse(out)).toEqual(out);
    const both = loadParams("/m", {
      ...base,
      backend: "auto",
      memoryBudgetBytes: 8 * 1024 ** 3,
      vramBudgetBytes: 2 * 1024 ** 3,
    });
    expect(both).toMatchObject({ memory_budget: 8 * 1024 ** 3, vram_budget: 2 * 1024 ** 3 });
  });
  it("sends where the GPU's misses run under a GPU memory budget, the copies only where the CPU computes some", () => {
    const streamed = { ...base, backend: "vulkan" as const, vramBudgetBytes: 2 * 1024 ** 3 };
    // The defaults: the misses split, two a layer and step on the GPU.
    const byDefault = loadParams("/m", streamed);
    expect(byDefault).toMatchObject({ gpu_misses: "split", gpu_expert_copies: 2 });
    expect(LoadParamsSchema.strict().parse(byDefault)).toEqual(byDefault);
    const split = loadParams("/m", { ...streamed, gpuMisses: "split", gpuExpertCopies: 5 });
    expect(split).toMatchObject({ gpu_misses: "split", gpu_expert_copies: 5 });
    expect(LoadParamsSchema.strict().parse(split)).toEqual(split);
    // Split with none for the GPU: every miss on the CPU, still sent as asked.
    const splitNone = loadParams("/m", { ...streamed, gpuMisses: "split", gpuExpertCopies: 0 });
    expect(splitNone).toMatchObject({ gpu_misses: "split", gpu_expert_copies: 0 });
    const hybrid = loadParams("/m", { ...streamed, gpuMisses: "cpu", gpuExpertCopies: 3 });
    expect(hybrid).toMatchObject({ gpu_misses: "cpu", gpu_expert_copies: 3 });
    expect(LoadParamsSchema.strict().parse(hybrid)).toEqual(hybrid);
    const none = loadParams("/m", { ...streamed, gpuMisses: "cpu", gpuExpertCopies: 0 });
    expect(none.gpu_expert_copies).toBe(0);
    const copy = loadParams("/m", { ...streamed, gpuMisses: "copy", gpuExpertCopies: 3 });
    expect(copy.gpu_misses).toBe("copy");
    expect(copy.gpu_expert_copies).toBeUndefined();
    expect(LoadParamsSchema.strict().parse(copy)).toEqual(copy);
  });
  it("never sends them on the CPU, nor on a GPU without a GPU memory budget", () => {
    for (const s of [
      { ...base, backend: "cpu" as const, vramBudgetBytes: 2 * 1024 ** 3 },
      { ...base, backend: "cpu" as const },
      { ...base, backend: "vulkan" as const },
      { ...base, backend: "auto" as const, memoryBudgetBytes: 8 * 1024 ** 3 },
    ]) {
      for (const gpuMisses of ["cpu", "split"] as const) {
        const out = loadParams("/m", { ...s, gpuMisses, gpuExpertCopies: 3 });
        expect(out.gpu_misses, s.backend).toBeUndefined();
        expect(out.gpu_expert_copies, s.backend).toBeUndefined();
        expect(JSON.stringify(out)).not.toMatch(/gpu_/);
        expect(LoadParamsSchema.strict().parse(out)).toEqual(out);
      }
    }
  });
  it("leaves it out on the CPU, which keeps the saved slot count", () => {
    const out = loadParams("/m", {
      ...base,
      backend: "cpu",
      expertCacheSlots: 12,
      vramBudgetBytes: 4 * 1024 ** 3,
    });
    expect(out.vram_budget).toBeUndefined();
    expect(out.expert_cache_slots).toBe(12);
    expect(loadParams("/m", { ...base, backend: "vulkan", expertCacheSlots: 12 })).toMatchObject({
      expert_cache_slots: 12,
      vram_budget: undefined,
    });
  });
});
