/** Power readers against a fake powercap tree, and the live sampler's arithmetic. */
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  energyDelta,
  findOnPath,
  joulesPerToken,
  nvidiaSmiMeter,
  parseNvidiaSmiPower,
  raplMeter,
} from "./energy.ts";
import { LiveSampleSchema } from "./api.ts";
import { idleTracker, type GenerationTracker } from "./chat.ts";
import type { StatsEvent } from "../engine/index.ts";
import { freeMemoryBytes, LIVE_HISTORY, LiveSampler } from "./live.ts";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-rapl-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

async function domain(name: string, energy: number, max = 262143328850): Promise<void> {
  await mkdir(join(root, name), { recursive: true });
  await writeFile(join(root, name, "energy_uj"), `${energy}\n`);
  await writeFile(join(root, name, "max_energy_range_uj"), `${max}\n`);
  await writeFile(join(root, name, "name"), /:\d+:/.test(name) ? "core\n" : "package-0\n");
}

describe("RAPL", () => {
  it("turns energy counter deltas into watts, summing packages but not their subdomains", async () => {
    await domain("intel-rapl:0", 1_000_000);
    await domain("intel-rapl:1", 5_000_000);
    await domain("intel-rapl:0:0", 999_000_000); // cores of package 0: part of it, not added
    let t = 10_000;
    const meter = raplMeter(root, () => t)!;
    expect(meter.source).toBe("rapl");
    expect(await meter.read()).toBeNull(); // primes the counters
    await writeFile(join(root, "intel-rapl:0", "energy_uj"), `${1_000_000 + 12_000_000}\n`);
    await writeFile(join(root, "intel-rapl:1", "energy_uj"), `${5_000_000 + 8_000_000}\n`);
    await writeFile(join(root, "intel-rapl:0:0", "energy_uj"), "0\n");
    t += 2000; // 2 s: (12 J + 8 J) / 2 s
    expect(await meter.read()).toBeCloseTo(10, 9);
  });

  it("handles the counter wrapping at max_energy_range_uj", async () => {
    const max = 1_000_000_000;
    await domain("intel-rapl:0", max - 3_000_000, max);
    let t = 0;
    const meter = raplMeter(root, () => t)!;
    await meter.read();
    await writeFile(join(root, "intel-rapl:0", "energy_uj"), "2000000\n"); // wrapped past max
    t += 1000;
    expect(await meter.read()).toBeCloseTo(5, 9); // 3 J to the end + 2 J after: 5 W over 1 s
    expect(energyDelta(10, 4, 20)).toBe(14);
    expect(energyDelta(4, 10, 20)).toBe(6);
  });

  it("is unavailable without readable counters", async () => {
    expect(raplMeter(join(root, "absent"))).toBeNull();
    await mkdir(join(root, "intel-rapl:0"));
    expect(raplMeter(root)).toBeNull(); // no energy_uj
    if (process.getuid?.() !== 0) {
      await domain("intel-rapl:0", 1);
      await chmod(join(root, "intel-rapl:0", "energy_uj"), 0o000); // root-only, as since 5.10
      expect(raplMeter(root)).toBeNull();
    }
  });
});

describe("nvidia-smi", () => {
  it("sums the GPUs' power draw and is absent when the tool is", async () => {
    expect(parseNvidiaSmiPower("71.25\n 30.5 \n")).toBeCloseTo(101.75, 9);
    expect(parseNvidiaSmiPower("[N/A]\n")).toBeNull();
    expect(nvidiaSmiMeter({ PATH: root })).toBeNull();
    const fake = join(root, "nvidia-smi");
    await writeFile(fake, "#!/bin/sh\necho 42.5\necho 7.5\n");
    await chmod(fake, 0o755);
    expect(findOnPath("nvidia-smi", { PATH: `/nonexistent:${root}` })).toBe(fake);
    const meter = nvidiaSmiMeter({ PATH: root })!;
    expect(await meter.read()).toBe(50);
  });
});

describe("live arithmetic", () => {
  it("energy per token is power over the decode rate", () => {
    expect(joulesPerToken(30, 15)).toBe(2);
    expect(joulesPerToken(null, 15)).toBeNull();
    expect(joulesPerToken(30, 0)).toBeNull();
  });

  it("reads MemAvailable from meminfo", async () => {
    const file = join(root, "meminfo");
    await writeFile(file, "MemTotal:       24683652 kB\nMemAvailable:    1000 kB\n");
    if (process.platform === "linux") expect(await freeMemoryBytes(file)).toBe(1000 * 1024);
    expect(await freeMemoryBytes(join(root, "missing"))).toBeGreaterThan(0);
  });
});

describe("LiveSampler", () => {
  const stats = (over: Partial<StatsEvent> = {}): StatsEvent => ({
    type: "stats",
    id: "r1",
    model: "/m/demo",
    generating: false,
    generations: 1,
    prompt_tokens: 10,
    cached_tokens: 0,
    prefill_tokens: 10,
    generated_tokens: 20,
    prefill_tokens_per_second: 100,
    decode_tokens_per_second: 40,
    ttft_seconds: 0.25,
    memory: { rss_bytes: 5e8, peak_rss_bytes: 6e8, kv_bytes: 1e6 },
    expert_cache: { slots: 16, hit_rate: 0.9, read_bytes_per_token: 2048 },
    ...over,
  });

  it("samples the engine, the running generation and power; keeps the last 240", async () => {
    const tracker: GenerationTracker = {
      generating: true,
      startedAt: Date.now() - 1500,
      firstTokenAt: Date.now() - 1000,
      tokens: 21,
      last: null,
      stats: null,
    };
    let watts = 30;
    const samples: unknown[] = [];
    const sampler = new LiveSampler(
      {
        stats: async () => stats({ generating: true }),
        tracker,
        generating: () => tracker.generating,
        budget: () => 8e8,
        expertCache: () => true,
        power: { source: "test", read: async () => watts },
        thermal: () => "nominal",
        freeMemory: async () => 4e9,
      },
      (s) => samples.push(s),
    );
    const s = (await sampler.tick())!;
    expect(LiveSampleSchema.parse(s)).toEqual(s);
    expect(s).toMatchObject({
      generating: true,
      rssBytes: 5e8,
      peakRssBytes: 6e8,
      budgetBytes: 8e8,
      freeMemoryBytes: 4e9,
      generatedTokens: 21,
      expertCache: { slots: 16, hitRate: 0.9, readBytesPerToken: 2048 },
      powerWatts: 30,
      thermal: "nominal",
    });
    expect(s.ttftMs).toBeGreaterThanOrEqual(450);
    // 20 tokens after the first in about a second.
    expect(s.decodeTokensPerSecond).toBeGreaterThan(15);
    expect(s.decodeTokensPerSecond).toBeLessThanOrEqual(20.5);
    expect(s.joulesPerToken).toBeCloseTo(30 / s.decodeTokensPerSecond!, 9);

    // Idle: the last generation's figures, no energy per token.
    tracker.generating = false;
    tracker.last = { decodeTokensPerSecond: 33, ttftMs: 120, tokens: 64 };
    watts = 5;
    const idle = (await sampler.tick())!;
    expect(idle).toMatchObject({
      generating: false,
      decodeTokensPerSecond: 33,
      ttftMs: 120,
      generatedTokens: 64,
      joulesPerToken: null,
    });
    for (let i = 0; i < LIVE_HISTORY + 10; i++) await sampler.tick();
    expect(sampler.history).toHaveLength(LIVE_HISTORY);
    expect(samples).toHaveLength(LIVE_HISTORY + 12);
  });

  it("has no engine figures while no engine runs", async () => {
    const sampler = new LiveSampler(
      {
        stats: async () => null,
        tracker: idleTracker(),
        generating: () => false,
        budget: () => null,
        expertCache: () => false,
        power: null,
      },
      () => undefined,
    );
    const s = (await sampler.tick())!;
    expect(s).toMatchObject({
      rssBytes: null,
      decodeTokensPerSecond: null,
      expertCache: null,
      powerWatts: null,
      thermal: null,
    });
    expect(s.freeMemoryBytes).toBeGreaterThan(0);
  });
});
