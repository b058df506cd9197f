/**
 * The expert-cache simulation behind `npm run bench -- cache-policy`, on traces small enough to
 * count by hand.
 */
import { describe, expect, it } from "vitest";
import { hitRate, parseTrace, simulateLayer, uniformTrace } from "../bench/cache-policy-sim.ts";

describe("cache policy simulation", () => {
  // One expert per request, 2 slots (the expert store test's scenario).
  const rows = [[0], [0], [0], [1], [2], [0]];

  it("LFU keeps the most used expert, LRU the most recent, LRFU spans both", () => {
    expect(simulateLayer(rows, 2, { kind: "lfu" })).toEqual({ hits: 3, accesses: 6 });
    expect(simulateLayer(rows, 2, { kind: "lru" })).toEqual({ hits: 2, accesses: 6 });
    expect(simulateLayer(rows, 2, { kind: "lrfu", halfLife: 100 }).hits).toBe(3);
    expect(simulateLayer(rows, 2, { kind: "lrfu", halfLife: 1 }).hits).toBe(2);
  });

  it("Belady is the optimum: never below any other policy", () => {
    // 0 1 2 0 1 3 0 1 with 2 slots: Belady evicts the expert used farthest ahead.
    const t = [[0], [1], [2], [0], [1], [3], [0], [1]];
    const best = simulateLayer(t, 2, { kind: "belady" }).hits;
    // 0, 1 miss; 2 evicts 1 (next used after 0); 0 hits; 1 evicts 2 (never used again); 3 evicts
    // 1 (used after 0); 0 hits; 1 misses: 2 hits. LRU always evicts the next one needed: 0.
    expect(best).toBe(2);
    expect(simulateLayer(t, 2, { kind: "lru" }).hits).toBe(0);
    for (const p of [{ kind: "lfu" }, { kind: "lru" }, { kind: "lrfu", halfLife: 4 }] as const) {
      expect(simulateLayer(t, 2, p).hits).toBeLessThanOrEqual(best);
    }
  });

  it("never evicts an expert of the current request, and needs slots >= k", () => {
    const t = [
      [0, 1],
      [2, 3],
      [0, 1],
    ];
    expect(simulateLayer(t, 2, { kind: "lfu" })).toEqual({ hits: 0, accesses: 6 });
    expect(simulateLayer(t, 4, { kind: "lru" })).toEqual({ hits: 2, accesses: 6 });
    expect(() => simulateLayer([[0, 1, 2]], 2, { kind: "lru" })).toThrow(/slots/);
  });

  it("parses recorded routing and makes a uniform trace of the same shape", () => {
    const trace = parseTrace("0 1 2\n1 3 4\n0 1 5\n\n");
    expect(trace.get(0)).toEqual([
      [1, 2],
      [1, 5],
    ]);
    expect(() => parseTrace("0 x\n")).toThrow(/bad routing trace line/);
    const u = uniformTrace(trace, 8, 3);
    expect(u.get(0)!.map((r) => new Set(r).size)).toEqual([2, 2]);
    expect(u.get(1)).toHaveLength(1);
    // Uniform routing over 32 experts through 16 slots: about half the accesses hit.
    const big = uniformTrace(new Map([[0, Array.from({ length: 4000 }, () => [0, 1, 2, 3])]]), 32);
    expect(hitRate(big, 16, { kind: "lru" })).toBeGreaterThan(0.45);
    expect(hitRate(big, 16, { kind: "lru" })).toBeLessThan(0.55);
  });
});
