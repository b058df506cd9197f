/**
 * The live panel's samples: every `intervalMs` (default 500 ms) one LiveSample with the engine's
 * memory (the service's `stats` answer, which its reader thread gives at once, even while
 * generating), free memory, the budget, the running (else last) generation's decode rate and
 * time to first token, the expert cache, power and energy per token where the machine exposes
 * them, and the thermal state the shell reports. The last 240 samples (2 minutes) are kept.
 */
import { readFile } from "node:fs/promises";
import { freemem, totalmem } from "node:os";
import type { StatsEvent } from "../engine/index.ts";
import type { LiveSample } from "./api.ts";
import type { GenerationTracker } from "./chat.ts";
import { joulesPerToken, type PowerMeter } from "./energy.ts";

export const LIVE_HISTORY = 240;

/** Memory available to new work: MemAvailable on Linux (counts reclaimable cache), else free. */
export async function freeMemoryBytes(meminfo = "/proc/meminfo"): Promise<number> {
  if (process.platform === "linux") {
    try {
      const m = /^MemAvailable:\s+(\d+)\s+kB/m.exec(await readFile(meminfo, "utf8"));
      if (m) return Number(m[1]) * 1024;
    } catch {
      // fall through
    }
  }
  return freemem();
}

export interface LiveSources {
  /** The service's stats, or null while no engine runs. */
  stats: () => Promise<StatsEvent | null>;
  tracker: GenerationTracker;
  /** True while a chat reply or a server request holds the engine. */
  generating: () => boolean;
  /** The memory budget, else the load-time estimate; null without a model. */
  budget: () => number | null;
  /** Whether a model with an expert cache is loaded. */
  expertCache: () => boolean;
  power: PowerMeter | null;
  thermal?: () => string | null;
  freeMemory?: () => Promise<number>;
  now?: () => number;
}

export class LiveSampler {
  readonly history: LiveSample[] = [];
  private timer: NodeJS.Timeout | null = null;
  private busy = false;

  constructor(
    private readonly sources: LiveSources,
    private readonly onSample: (sample: LiveSample) => void,
    private readonly intervalMs = 500,
  ) {}

  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.tick(), this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** Takes one sample (skipped while the previous one is still being taken). */
  async tick(): Promise<LiveSample | null> {
    if (this.busy) return null;
    this.busy = true;
    try {
      const sample = await this.sample();
      this.history.push(sample);
      if (this.history.length > LIVE_HISTORY)
        this.history.splice(0, this.history.length - LIVE_HISTORY);
      this.onSample(sample);
      return sample;
    } finally {
      this.busy = false;
    }
  }

  private async sample(): Promise<LiveSample> {
    const s = this.sources;
    const [stats, free, watts] = await Promise.all([
      s.stats(),
      (s.freeMemory ?? freeMemoryBytes)(),
      s.power ? s.power.read().catch(() => null) : Promise.resolve(null),
    ]);
    const generating = s.generating();
    const t = s.tracker;
    let decode: number | null = null;
    let ttft: number | null = null;
    let tokens: number | null = null;
    if (t.generating) {
      // The chat's own reply: measured here, token by token.
      const now = Date.now();
      tokens = t.tokens;
      if (t.firstTokenAt !== null) {
        ttft = t.firstTokenAt - t.startedAt;
        const secs = (now - t.firstTokenAt) / 1000;
        decode = secs > 0 && t.tokens > 1 ? (t.tokens - 1) / secs : null;
      }
    } else if (t.last) {
      decode = t.last.decodeTokensPerSecond;
      ttft = t.last.ttftMs;
      tokens = t.last.tokens;
    }
    if (!t.generating && stats && stats.generations > 0 && (generating || !t.last)) {
      // A server request (or nothing from the chat yet): the service's own figures.
      decode = stats.decode_tokens_per_second;
      ttft = stats.ttft_seconds * 1000;
      tokens = stats.generating ? (stats.tokens_so_far ?? null) : stats.generated_tokens;
    }
    return {
      t: (s.now ?? Date.now)(),
      generating,
      rssBytes: stats?.memory.rss_bytes ?? null,
      peakRssBytes: stats?.memory.peak_rss_bytes ?? null,
      budgetBytes: s.budget(),
      freeMemoryBytes: free,
      totalMemoryBytes: totalmem(),
      decodeTokensPerSecond: decode,
      ttftMs: ttft,
      generatedTokens: tokens,
      expertCache:
        stats && s.expertCache()
          ? {
              slots: stats.expert_cache.slots,
              hitRate: stats.expert_cache.hit_rate,
              readBytesPerToken: stats.expert_cache.read_bytes_per_token,
            }
          : null,
      powerWatts: watts,
      joulesPerToken: generating ? joulesPerToken(watts, decode) : null,
      thermal: s.thermal?.() ?? null,
    };
  }
}
