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
  /** The chat tracker's `last` at the previous sample (undefined before the first one). */
  private seenLast: GenerationTracker["last"] | undefined = undefined;
  /** The service's finished-generation count already accounted for; null before the first. */
  private seenGenerations: number | null = null;
  /** Chat replies flagged as finished whose increment of the service's count is still to come. */
  private chatCredit = 0;
  /** Whose figures idle samples show: the chat's last reply or the service's last generation. */
  private lastFrom: "chat" | "service" = "chat";

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
    const finished = this.noteFinished(stats);
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
    if (
      !t.generating &&
      stats &&
      stats.generations > 0 &&
      (generating || !t.last || this.lastFrom === "service")
    ) {
      // A server request (running or the latest to finish), or nothing from the chat yet: the
      // service's own figures.
      decode = stats.decode_tokens_per_second;
      ttft = stats.ttft_seconds * 1000;
      tokens = stats.generating ? (stats.tokens_so_far ?? null) : stats.generated_tokens;
    }
    return {
      t: (s.now ?? Date.now)(),
      generating,
      ...(finished ? { finished: true } : {}),
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
              ioWaitMsPerToken: stats.expert_cache.io_wait_ms_per_token ?? null,
              gpuSlots: stats.expert_cache.gpu_slots ?? null,
              gpuHitRate: stats.expert_cache.gpu_hit_rate ?? null,
              ramHitRate: stats.expert_cache.ram_hit_rate ?? null,
              gpuCopyBytesPerToken: stats.expert_cache.gpu_copy_bytes_per_token ?? null,
              cpuExpertsPerToken: stats.expert_cache.cpu_experts_per_token ?? null,
              cpuExpertMsPerToken: stats.expert_cache.cpu_expert_ms_per_token ?? null,
            }
          : null,
      powerWatts: watts,
      joulesPerToken: generating ? joulesPerToken(watts, decode) : null,
      thermal: s.thermal?.() ?? null,
    };
  }

  /**
   * Whether a generation finished since the previous sample. A chat reply shows as a new
   * `tracker.last` (set just before `tracker.generating` goes false, in the same tick); any other
   * generation (a server request) as a rise of the service's `generations` count, which a chat
   * reply raises too, a little earlier (the service counts it before the chat has its figures).
   * So each chat reply earns a credit that absorbs its own rise, whichever sample sees it, and
   * rises are not judged while the chat is still finishing its reply.
   */
  private noteFinished(stats: StatsEvent | null): boolean {
    const t = this.sources.tracker;
    let finished = false;
    if (this.seenLast !== undefined && !t.generating && t.last && t.last !== this.seenLast) {
      finished = true;
      this.chatCredit++;
      this.lastFrom = "chat";
    }
    this.seenLast = t.last;
    if (!stats) return finished;
    const n = stats.generations;
    if (this.seenGenerations === null || n < this.seenGenerations) {
      // The first sample, or a new engine process counting from zero.
      this.seenGenerations = n;
      this.chatCredit = 0;
    } else if (n > this.seenGenerations && !t.generating) {
      const rise = n - this.seenGenerations;
      const fromChat = Math.min(rise, this.chatCredit);
      this.chatCredit -= fromChat;
      this.seenGenerations = n;
      if (rise > fromChat) {
        finished = true;
        this.lastFrom = "service";
      }
    }
    return finished;
  }
}
