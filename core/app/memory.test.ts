import { describe, expect, it } from "vitest";
import { planEvent as plan } from "../../testkit/plan-event.ts";
import { HitRateBook, memoryPlan } from "./memory.ts";

const MIB = 1024 ** 2;
const GIB = 1024 ** 3;

describe("memoryPlan", () => {
  it("keeps the free-memory answer apart from the budget's: a small plan over a tiny budget fits the free memory", () => {
    const p = memoryPlan(
      "demo",
      plan({ memory_budget: MIB, over_budget: "memory budget of 1 MiB cannot hold the model" }),
      4,
      23.9 * GIB,
      new HitRateBook(),
      0,
      MIB,
    );
    expect(p.fits).toBe(true);
    expect(p.overBudget).toBe("memory budget of 1 MiB cannot hold the model");
    expect(p.budgetBytes).toBe(MIB);
    expect(p.totalBytes).toBe(p.weightsBytes + p.kvBytes + p.expertCacheBytes + p.workBytes);
  });

  it("does not fit when the total exceeds the free memory (plus what the loaded model holds)", () => {
    const big = plan({ total_bytes: 30 * GIB });
    expect(memoryPlan("demo", big, 4, 23.9 * GIB, new HitRateBook()).fits).toBe(false);
    expect(memoryPlan("demo", big, 4, 23.9 * GIB, new HitRateBook(), 7 * GIB).fits).toBe(true);
    expect(memoryPlan("demo", big, 4, 23.9 * GIB, new HitRateBook()).overBudget).toBeNull();
  });
});
