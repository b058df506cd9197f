import { describe, expect, it } from "vitest";
import type {
  Conversation,
  EngineSettings,
  EngineStatus,
  LiveSample,
  Message,
} from "../../../core/app/api.ts";
import { DEFAULT_SETTINGS } from "../../../core/app/api.ts";
import {
  deviceMemoryGauge,
  expertTierStats,
  formatIoWait,
  memoryGauge,
  replyPoints,
  runEnds,
  tokensPerSecondSeries,
} from "./live.ts";

const sample = (t: number, over: Partial<LiveSample> = {}): LiveSample => ({
  t,
  generating: false,
  rssBytes: 1,
  peakRssBytes: null,
  budgetBytes: null,
  freeMemoryBytes: 1,
  totalMemoryBytes: 2,
  decodeTokensPerSecond: 42,
  ttftMs: 10,
  generatedTokens: 5,
  expertCache: null,
  powerWatts: null,
  joulesPerToken: null,
  thermal: null,
  ...over,
});

describe("tokensPerSecondSeries", () => {
  it("plots generating samples and the one where a reply finished, gaps elsewhere", () => {
    const [xs, ys] = tokensPerSecondSeries([
      sample(1000),
      sample(1500, { generating: true, decodeTokensPerSecond: 20 }),
      sample(2000, { finished: true, decodeTokensPerSecond: 22 }),
      sample(2500, { decodeTokensPerSecond: 22 }),
      // A reply shorter than the interval: only its finishing sample.
      sample(3000, { finished: true, decodeTokensPerSecond: 190 }),
      sample(3500, { decodeTokensPerSecond: 190 }),
    ]);
    expect(xs).toEqual([1, 1.5, 2, 2.5, 3, 3.5]);
    expect(ys).toEqual([null, 20, 22, null, 190, null]);
  });
});

describe("runEnds", () => {
  it("marks the last value of each run, single-sample runs included", () => {
    expect(runEnds([null, 1, 2, null, 3, null, null, 4, 5])).toEqual([2, 4, 8]);
    expect(runEnds([7])).toEqual([0]);
    expect(runEnds([null, undefined])).toEqual([]);
    expect(runEnds([])).toEqual([]);
  });
});

describe("replyPoints", () => {
  const msg = (id: string, role: Message["role"], tps?: number): Message => ({
    id,
    role,
    content: id,
    createdAt: "2025-01-01T00:00:00.000Z",
    ...(tps === undefined
      ? {}
      : {
          stats: {
            line: "",
            decodeTokensPerSecond: tps,
            ttftMs: tps / 10,
            prefillTokensPerSecond: 100,
            promptTokens: 7,
            generatedTokens: Math.round(tps),
            peakRssBytes: null,
            hitRate: tps > 100 ? 0.5 : null,
          },
        }),
  });
  const conversation = (messages: Message[]): Conversation => ({
    id: "c",
    title: "t",
    systemPrompt: "",
    createdAt: "2025-01-01T00:00:00.000Z",
    updatedAt: "2025-01-01T00:00:00.000Z",
    messages,
  });

  it("numbers assistant replies in order and skips those without statistics", () => {
    const points = replyPoints(
      conversation([
        msg("u1", "user"),
        msg("a1", "assistant", 191),
        msg("u2", "user"),
        msg("a2", "assistant"), // failed: no stats
        msg("u3", "user"),
        msg("a3", "assistant", 55.5),
      ]),
    );
    expect(points).toEqual([
      {
        n: 1,
        messageId: "a1",
        tokensPerSecond: 191,
        ttftMs: 19.1,
        tokens: 191,
        promptTokens: 7,
        hitRate: 0.5,
      },
      {
        n: 3,
        messageId: "a3",
        tokensPerSecond: 55.5,
        ttftMs: 5.55,
        tokens: 56,
        promptTokens: 7,
        hitRate: null,
      },
    ]);
  });

  it("draws no bar for a reply stopped before its first token (stored by older versions)", () => {
    const points = replyPoints(
      conversation([msg("u1", "user"), msg("a1", "assistant", 0), msg("u2", "user")]),
    );
    expect(points).toEqual([]);
  });

  it("is empty without a conversation or replies", () => {
    expect(replyPoints(null)).toEqual([]);
    expect(replyPoints(conversation([msg("u1", "user")]))).toEqual([]);
  });
});

describe("formatIoWait", () => {
  it("prints milliseconds per token, a dash when unknown", () => {
    expect(formatIoWait(1.234)).toBe("1.23 ms");
    expect(formatIoWait(12.34)).toBe("12.3 ms");
    expect(formatIoWait(0)).toBe("0.00 ms");
    expect(formatIoWait(null)).toBe("—");
    expect(formatIoWait(undefined)).toBe("—");
  });
});

describe("memoryGauge", () => {
  const MiB = 1024 ** 2;
  const engine = (budget: number | null): EngineStatus => ({
    state: "ready",
    model: "demo",
    pid: 1,
    loadFraction: null,
    loadedWith: { ...DEFAULT_SETTINGS.engine, memoryBudgetBytes: budget },
    expertCacheSlots: 16,
    reloadNeeded: false,
    memory: null,
    error: null,
  });
  it("calls the plan's total planned memory, not a budget, when the model has no budget", () => {
    const s = sample(0, { rssBytes: 67.2 * MiB, budgetBytes: 78.4 * MiB });
    const planned = memoryGauge(s, engine(null), null);
    expect(planned.maxKind).toBe("plan");
    expect(planned.text).toBe("67.2 MiB of 78.4 MiB planned");
    expect(planned.text).not.toMatch(/budget/);
    const budgeted = memoryGauge(s, engine(78.4 * MiB), null);
    expect(budgeted.text).toBe("67.2 MiB of 78.4 MiB budget");
    expect(
      memoryGauge(sample(0, { rssBytes: MiB, totalMemoryBytes: 8 * MiB }), null, null).text,
    ).toBe("1.0 MiB of 8.0 MiB total memory");
  });
});

describe("deviceMemoryGauge", () => {
  const GiB = 1024 ** 3;
  const loaded = (
    backend: EngineSettings["backend"],
    deviceBytes: number | undefined,
    vramBudgetBytes: number | null,
  ): EngineStatus => ({
    state: "ready",
    model: "moe",
    pid: 1,
    loadFraction: null,
    loadedWith: { ...DEFAULT_SETTINGS.engine, backend, vramBudgetBytes },
    expertCacheSlots: 8,
    reloadNeeded: false,
    memory: {
      modelBytes: 14 * GiB,
      weightsBytes: GiB,
      kvBytes: GiB / 4,
      expertCacheBytes: GiB,
      workBytes: GiB / 8,
      estimateBytes: 2.375 * GiB,
      rssBytes: GiB,
      deviceBytes,
    },
    error: null,
  });
  it("shows the GPU memory planned, with the budget it was loaded with, on a GPU backend only", () => {
    expect(deviceMemoryGauge(loaded("vulkan", 3 * GiB, 4 * GiB))).toBe(
      "3.00 GiB of 4.00 GiB budget",
    );
    expect(deviceMemoryGauge(loaded("auto", 3 * GiB, null))).toBe("3.00 GiB (estimate)");
    expect(deviceMemoryGauge(loaded("cpu", 0, 4 * GiB))).toBeNull();
    // A status from before the field, and no engine at all.
    expect(deviceMemoryGauge(loaded("vulkan", undefined, null))).toBeNull();
    expect(deviceMemoryGauge(null)).toBeNull();
  });
});

describe("expertTierStats (the Live view's expert tiers)", () => {
  type Cache = NonNullable<LiveSample["expertCache"]>;
  // docs/gpu.md's lavapipe run on the demo model: 4 GPU slots under 32 in RAM, hybrid, 1 copy.
  const hybrid: Cache = {
    slots: 32,
    hitRate: 0.993,
    readBytesPerToken: 2048,
    ioWaitMsPerToken: 0.1,
    gpuSlots: 4,
    gpuHitRate: 0.298,
    ramHitRate: 0.695,
    gpuCopyBytesPerToken: 184 * 1024,
    cpuExpertsPerToken: 16.8,
    cpuExpertMsPerToken: 0.9,
  };
  const shown = (cache: Cache, gpuMisses: EngineStatus["gpuMisses"]) =>
    Object.fromEntries(expertTierStats(cache, gpuMisses).map((s) => [s.label, s.value]));

  it("shows each tier, the bytes copied to the GPU and the CPU's experts under hybrid experts", () => {
    expect(shown(hybrid, "cpu")).toEqual({
      "GPU hit rate": "29.8%",
      "RAM hit rate": "69.5%",
      "SSD misses": "0.7%",
      "Copied to GPU": "184.0 KiB/token",
      "Experts on the CPU": "16.8/token (0.90 ms)",
    });
    expect(expertTierStats(hybrid, "cpu")[0]?.hint).toBe(
      "4 expert slots per layer on the GPU, fed from 32 in system RAM",
    );
  });

  it("shows the CPU's experts when the misses are split between the GPU and the CPU", () => {
    // Split: the CPU computes the misses beyond the GPU's share, so its experts count, even in a
    // step where it took none (every miss went to the GPU).
    expect(shown(hybrid, "split")["Experts on the CPU"]).toBe("16.8/token (0.90 ms)");
    const none = { ...hybrid, cpuExpertsPerToken: 0, cpuExpertMsPerToken: 0 };
    expect(shown(none, "split")["Experts on the CPU"]).toBe("0.0/token (0.00 ms)");
    expect(shown(none, "copy")["Experts on the CPU"]).toBeUndefined();
  });

  it("leaves out the CPU's experts in copy mode, and the tiers where the GPU mirrors RAM", () => {
    const copy = { ...hybrid, cpuExpertsPerToken: 0, cpuExpertMsPerToken: 0 };
    expect(Object.keys(shown(copy, "copy"))).toEqual([
      "GPU hit rate",
      "RAM hit rate",
      "SSD misses",
      "Copied to GPU",
    ]);
    // A service that reports CPU experts without saying hybrid (older status): shown.
    expect(shown(hybrid, undefined)["Experts on the CPU"]).toBe("16.8/token (0.90 ms)");
    // Mirrored slots (as many on the GPU as in RAM): every hit is a GPU hit, no tiers to split.
    expect(shown({ ...copy, gpuSlots: 32 }, "copy")).toEqual({
      "Copied to GPU": "184.0 KiB/token",
    });
  });

  it("shows nothing on the CPU, nor what an older service leaves out", () => {
    const cpu: Cache = {
      slots: 16,
      hitRate: 0.9,
      readBytesPerToken: 2048,
      ioWaitMsPerToken: 1,
      gpuSlots: 0,
      gpuHitRate: 0,
      ramHitRate: 0.9,
      gpuCopyBytesPerToken: 0,
      cpuExpertsPerToken: 0,
      cpuExpertMsPerToken: 0,
    };
    expect(expertTierStats(cpu, "copy")).toEqual([]);
    expect(expertTierStats({ slots: 16, hitRate: 0.9, readBytesPerToken: 2048 }, null)).toEqual([]);
    expect(
      shown({ slots: 32, hitRate: 0.5, readBytesPerToken: 1, gpuSlots: 4, gpuHitRate: 0.2 }, null),
    ).toEqual({ "GPU hit rate": "20.0%", "RAM hit rate": "—", "SSD misses": "50.0%" });
  });
});
