import { describe, expect, it } from "vitest";
import type { StatsEvent } from "../engine/index.ts";
import { LiveSampleSchema } from "./api.ts";
import { idleTracker, type GenerationTracker } from "./chat.ts";
import { LiveSampler } from "./live.ts";

/** A sampler over a tracker and service stats that the test changes between ticks. */
function rig() {
  const tracker: GenerationTracker = idleTracker();
  const service: StatsEvent = {
    type: "stats",
    id: "s",
    model: "/m/demo",
    generating: false,
    generations: 0,
    prompt_tokens: 0,
    cached_tokens: 0,
    prefill_tokens: 0,
    generated_tokens: 0,
    prefill_tokens_per_second: 0,
    decode_tokens_per_second: 0,
    ttft_seconds: 0,
    memory: { rss_bytes: 5e8, peak_rss_bytes: 6e8, kv_bytes: 1e6 },
    expert_cache: {
      slots: 16,
      hit_rate: 0.9,
      read_bytes_per_token: 2048,
      io_wait_ms_per_token: 1.25,
    },
  };
  let engineUp = true;
  let queueBusy = false;
  const sampler = new LiveSampler(
    {
      stats: async () => (engineUp ? structuredClone(service) : null),
      tracker,
      generating: () => queueBusy || tracker.generating,
      budget: () => 8e8,
      expertCache: () => true,
      power: null,
      freeMemory: async () => 4e9,
    },
    () => undefined,
  );
  const tick = async () => {
    const s = (await sampler.tick())!;
    expect(LiveSampleSchema.parse(s)).toEqual(s);
    return s;
  };
  /** The service finishes a generation with these figures. */
  const serviceFinishes = (tps: number, ttftMs: number, tokens: number) => {
    Object.assign(service, {
      generations: service.generations + 1,
      decode_tokens_per_second: tps,
      ttft_seconds: ttftMs / 1000,
      generated_tokens: tokens,
    });
  };
  /** The chat has its reply's figures (after the service counted the generation). */
  const chatFinishes = (tps: number, ttftMs: number, tokens: number) => {
    tracker.last = { decodeTokensPerSecond: tps, ttftMs, tokens };
    tracker.generating = false;
  };
  return {
    tracker,
    service,
    tick,
    serviceFinishes,
    chatFinishes,
    setEngineUp: (up: boolean) => (engineUp = up),
    setQueueBusy: (busy: boolean) => (queueBusy = busy),
  };
}

describe("LiveSampler: finished generations", () => {
  it("flags the sample after a chat reply shorter than the interval, once", async () => {
    const r = rig();
    expect((await r.tick()).finished).toBeUndefined();
    // The whole reply happens between two samples.
    r.serviceFinishes(180, 17, 40);
    r.chatFinishes(191, 17.2, 40);
    const done = await r.tick();
    expect(done).toMatchObject({
      finished: true,
      generating: false,
      decodeTokensPerSecond: 191,
      ttftMs: 17.2,
      generatedTokens: 40,
    });
    const after = await r.tick();
    expect(after.finished).toBeUndefined();
    expect(after.decodeTokensPerSecond).toBe(191);
  });

  it("does not count a chat reply twice when the service's count arrives a sample late", async () => {
    const r = rig();
    await r.tick();
    // The chat has its figures, but this sample's stats were read before the service counted.
    r.chatFinishes(50, 200, 12);
    expect((await r.tick()).finished).toBe(true);
    r.serviceFinishes(49, 200, 12);
    expect((await r.tick()).finished).toBeUndefined();
    expect((await r.tick()).finished).toBeUndefined();
  });

  it("waits for the chat while the service has counted a reply the chat is still finishing", async () => {
    const r = rig();
    await r.tick();
    r.tracker.generating = true;
    r.serviceFinishes(70, 90, 30);
    const tail = await r.tick();
    expect(tail.finished).toBeUndefined();
    expect(tail.generating).toBe(true);
    r.chatFinishes(71, 90, 30);
    const done = await r.tick();
    expect(done).toMatchObject({ finished: true, decodeTokensPerSecond: 71 });
    expect((await r.tick()).finished).toBeUndefined();
  });

  it("flags a server request with the service's figures and keeps them while idle", async () => {
    const r = rig();
    r.chatFinishes(30, 100, 10);
    r.serviceFinishes(30, 100, 10);
    await r.tick(); // the first sample only takes stock
    r.serviceFinishes(120, 45, 64);
    const done = await r.tick();
    expect(done).toMatchObject({
      finished: true,
      decodeTokensPerSecond: 120,
      ttftMs: 45,
      generatedTokens: 64,
    });
    // Idle afterwards: still the server request's figures, not the older chat reply's.
    const idle = await r.tick();
    expect(idle.finished).toBeUndefined();
    expect(idle.decodeTokensPerSecond).toBe(120);
    // The next chat reply takes over again.
    r.serviceFinishes(33, 80, 9);
    r.chatFinishes(33.5, 80, 9);
    expect(await r.tick()).toMatchObject({ finished: true, decodeTokensPerSecond: 33.5 });
  });

  it("counts two server requests between samples as one finished sample", async () => {
    const r = rig();
    await r.tick();
    r.serviceFinishes(100, 10, 5);
    r.serviceFinishes(110, 12, 6);
    expect(await r.tick()).toMatchObject({ finished: true, decodeTokensPerSecond: 110 });
  });

  it("does not flag the first sample or a restarted engine counting from zero", async () => {
    const r = rig();
    r.serviceFinishes(30, 100, 10);
    r.serviceFinishes(30, 100, 10);
    r.chatFinishes(30, 100, 10);
    expect((await r.tick()).finished).toBeUndefined();
    r.setEngineUp(false);
    expect(await r.tick()).toMatchObject({ rssBytes: null, expertCache: null });
    r.service.generations = 0;
    r.setEngineUp(true);
    expect((await r.tick()).finished).toBeUndefined();
    r.serviceFinishes(60, 50, 20);
    expect(await r.tick()).toMatchObject({ finished: true, decodeTokensPerSecond: 60 });
  });
});

describe("LiveSampler: expert cache I/O wait", () => {
  it("passes the service's I/O wait per token through, null when an older service omits it", async () => {
    const r = rig();
    expect((await r.tick()).expertCache).toEqual({
      slots: 16,
      hitRate: 0.9,
      readBytesPerToken: 2048,
      ioWaitMsPerToken: 1.25,
      gpuSlots: null,
      gpuHitRate: null,
      ramHitRate: null,
      gpuCopyBytesPerToken: null,
      cpuExpertsPerToken: null,
      cpuExpertMsPerToken: null,
    });
    r.service.expert_cache.io_wait_ms_per_token = null;
    expect((await r.tick()).expertCache?.ioWaitMsPerToken).toBeNull();
    delete r.service.expert_cache.io_wait_ms_per_token;
    expect((await r.tick()).expertCache?.ioWaitMsPerToken).toBeNull();
  });

  it("passes a GPU backend's tiers through: GPU slots, GPU and RAM hit rates", async () => {
    const r = rig();
    Object.assign(r.service.expert_cache, { gpu_slots: 2, gpu_hit_rate: 0.25, ram_hit_rate: 0.6 });
    expect((await r.tick()).expertCache).toMatchObject({
      slots: 16,
      hitRate: 0.9,
      gpuSlots: 2,
      gpuHitRate: 0.25,
      ramHitRate: 0.6,
    });
  });

  it("passes hybrid experts' figures through: bytes copied to the GPU, experts on the CPU and its time", async () => {
    const r = rig();
    Object.assign(r.service.expert_cache, {
      gpu_slots: 4,
      gpu_hit_rate: 0.298,
      ram_hit_rate: 0.695,
      gpu_copy_bytes_per_token: 188416,
      cpu_experts_per_token: 16.8,
      cpu_expert_ms_per_token: 0.9,
    });
    expect((await r.tick()).expertCache).toMatchObject({
      gpuSlots: 4,
      gpuCopyBytesPerToken: 188416,
      cpuExpertsPerToken: 16.8,
      cpuExpertMsPerToken: 0.9,
    });
  });
});
