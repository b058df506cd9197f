import { describe, expect, it } from "vitest";
import { ENGINE_DEFAULTS } from "../defaults.ts";
import { LoadParamsSchema, ReadyEventSchema, SamplingSchema } from "../engine/protocol.ts";
import { toProtocolLoad, toProtocolSampling } from "./settings.ts";

describe("toProtocolSampling", () => {
  it("names every field as the protocol does, and the protocol's schema accepts it", () => {
    const out = toProtocolSampling({
      temperature: 0.7,
      topK: 40,
      topP: 0.9,
      repetitionPenalty: 1.15,
      seed: 7,
    });
    expect(out).toEqual({
      temperature: 0.7,
      top_k: 40,
      top_p: 0.9,
      repetition_penalty: 1.15,
      seed: 7,
    });
    expect(SamplingSchema.strict().parse(out)).toEqual(out);
  });

  it("leaves the seed out when it is random (null or absent), and keeps seed 0", () => {
    const base = { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1 };
    expect(toProtocolSampling({ ...base, seed: null })).not.toHaveProperty("seed");
    expect(toProtocolSampling(base)).not.toHaveProperty("seed");
    expect(toProtocolSampling({ ...base, seed: 0 })).toHaveProperty("seed", 0);
  });
});

describe("toProtocolLoad", () => {
  it("names every field as the protocol does, and the protocol's schema accepts it", () => {
    const out = toProtocolLoad("/models/m", {
      context: 8192,
      threads: 4,
      backend: "vulkan",
      kvDtype: "f32",
      expertCacheSlots: 8,
      memoryBudget: 2 ** 33,
    });
    expect(out).toEqual({
      model: "/models/m",
      context: 8192,
      threads: 4,
      backend: "vulkan",
      kv_dtype: "f32",
      expert_cache_slots: 8,
      memory_budget: 2 ** 33,
    });
    expect(LoadParamsSchema.strict().parse(out)).toEqual(out);
  });

  it("passes where the RAM tier's misses run, in the protocol's names", () => {
    const out = toProtocolLoad("m", {
      context: 4096,
      backend: "vulkan",
      vramBudget: 2 ** 31,
      gpuMisses: "cpu",
      gpuExpertCopies: 0,
    });
    expect(out).toMatchObject({ vram_budget: 2 ** 31, gpu_misses: "cpu", gpu_expert_copies: 0 });
    expect(LoadParamsSchema.strict().parse(out)).toEqual(out);
    const split = toProtocolLoad("m", {
      context: 4096,
      backend: "vulkan",
      vramBudget: 2 ** 31,
      gpuMisses: "split",
      gpuExpertCopies: 2,
    });
    expect(split).toMatchObject({ gpu_misses: "split", gpu_expert_copies: 2 });
    expect(LoadParamsSchema.strict().parse(split)).toEqual(split);
    // Left out, the engine's own default applies (split with 2, native defaults.h).
    const plain = toProtocolLoad("m", { context: 4096 });
    expect(plain.gpu_misses).toBeUndefined();
    expect(plain.gpu_expert_copies).toBeUndefined();
  });

  it("is checked against the protocol's choices of where the misses run", () => {
    for (const gpu_misses of ["copy", "cpu", "split"]) {
      expect(LoadParamsSchema.safeParse({ model: "m", gpu_misses }).success, gpu_misses).toBe(true);
    }
    for (const gpu_misses of ["gpu", "SPLIT", "", 1]) {
      const r = LoadParamsSchema.safeParse({ model: "m", gpu_misses });
      expect(r.success, String(gpu_misses)).toBe(false);
    }
    expect(LoadParamsSchema.safeParse({ model: "m", gpu_expert_copies: -1 }).success).toBe(false);
    expect(LoadParamsSchema.safeParse({ model: "m", gpu_expert_copies: 1.5 }).success).toBe(false);
    // The ready event reports the mode in effect, "split" included.
    const ready = ReadyEventSchema.shape.gpu_misses;
    for (const mode of ["copy", "cpu", "split"]) expect(ready.parse(mode)).toBe(mode);
    expect(ready.safeParse("gpu").success).toBe(false);
  });

  it("loads the default slot count, or none when a memory budget picks it", () => {
    expect(toProtocolLoad("m", { context: 4096 }).expert_cache_slots).toBe(
      ENGINE_DEFAULTS.expertCacheSlots,
    );
    const budgeted = toProtocolLoad("m", { context: 4096, memoryBudget: 1e9 });
    expect(budgeted.expert_cache_slots).toBeUndefined();
    expect(budgeted.memory_budget).toBe(1e9);
    // A GPU memory budget picks the count (or every expert resident) the same way.
    const gpu = toProtocolLoad("m", { context: 4096, backend: "vulkan", vramBudget: 4e9 });
    expect(gpu.expert_cache_slots).toBeUndefined();
    expect(gpu.vram_budget).toBe(4e9);
    expect(LoadParamsSchema.strict().parse(gpu)).toEqual(gpu);
  });
});
