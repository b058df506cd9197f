/** Derived numbers for the live panels, from the latest sample and the engine status. */
import {
  effectiveVramBudget,
  type Conversation,
  type EngineStatus,
  type LiveSample,
} from "../../../core/app/api.ts";
import { formatBytes, formatPercent } from "./format.ts";
import { deviceMemoryText } from "./plan.ts";

export interface MemoryGauge {
  rss: number;
  /**
   * The memory budget the model was loaded with; without one, the engine's plan for the loaded
   * settings (what the Tuning view and the planned total show); else the machine's total memory.
   */
  max: number;
  maxKind: "budget" | "plan" | "total";
  free: number | null;
  total: number | null;
  text: string;
}

export function memoryGauge(
  sample: LiveSample | undefined,
  engine: EngineStatus | null,
  totalMemory: number | null,
): MemoryGauge {
  const rss = sample?.rssBytes ?? engine?.memory?.rssBytes ?? null;
  const budget = sample?.budgetBytes ?? null;
  const total = sample?.totalMemoryBytes ?? totalMemory;
  const max = budget ?? total ?? 0;
  // The sample's budget is the plan's total when the model was loaded without a budget: say so
  // rather than call the plan a budget.
  const maxKind: MemoryGauge["maxKind"] =
    budget == null ? "total" : engine?.loadedWith?.memoryBudgetBytes == null ? "plan" : "budget";
  const unit = { budget: "budget", plan: "planned", total: "total memory" }[maxKind];
  let text: string;
  if (rss == null) text = "no engine running";
  else if (max > 0) text = `${formatBytes(rss)} of ${formatBytes(max)} ${unit}`;
  else text = formatBytes(rss);
  return { rss: rss ?? 0, max, maxKind, free: sample?.freeMemoryBytes ?? null, total, text };
}

/**
 * The loaded model's GPU memory next to the host memory gauge: the engine's plan for the loaded
 * settings and the GPU memory budget they were loaded with; null on the CPU (none planned).
 */
export function deviceMemoryGauge(engine: EngineStatus | null): string | null {
  const deviceBytes = engine?.memory?.deviceBytes ?? 0;
  const budget = engine?.loadedWith ? effectiveVramBudget(engine.loadedWith) : undefined;
  return deviceMemoryText({ deviceBytes, vramBudgetBytes: budget ?? null });
}

/**
 * Tokens/s samples while generating, plus the sample at which each generation finished (its final
 * figure: a reply shorter than the sampling interval has only that one); null elsewhere, so
 * charts show gaps between replies.
 */
export function tokensPerSecondSeries(samples: LiveSample[]): [number[], (number | null)[]] {
  const xs: number[] = [];
  const ys: (number | null)[] = [];
  for (const s of samples) {
    xs.push(s.t / 1000);
    ys.push(s.generating || s.finished ? s.decodeTokensPerSecond : null);
  }
  return [xs, ys];
}

/** Indices of the last non-null value of each run of non-null values (where charts put a dot). */
export function runEnds(ys: ArrayLike<number | null | undefined>): number[] {
  const ends: number[] = [];
  for (let i = 0; i < ys.length; i++) {
    if (ys[i] != null && (i + 1 >= ys.length || ys[i + 1] == null)) ends.push(i);
  }
  return ends;
}

/** One finished assistant reply's figures, for the per-reply charts and table. */
export interface ReplyPoint {
  /** 1-based position among the conversation's assistant messages. */
  n: number;
  messageId: string;
  tokensPerSecond: number;
  ttftMs: number;
  tokens: number;
  promptTokens: number;
  hitRate: number | null;
}

/**
 * The conversation's assistant replies that have statistics (finished ones; a failed or running
 * reply, or one stopped before its first token, has none and leaves a gap in the numbering),
 * oldest first.
 */
export function replyPoints(conversation: Conversation | null | undefined): ReplyPoint[] {
  const points: ReplyPoint[] = [];
  let n = 0;
  for (const m of conversation?.messages ?? []) {
    if (m.role !== "assistant") continue;
    n++;
    // No tokens (stopped while thinking; stored so by older versions): nothing to chart.
    if (!m.stats || m.stats.generatedTokens === 0) continue;
    points.push({
      n,
      messageId: m.id,
      tokensPerSecond: m.stats.decodeTokensPerSecond,
      ttftMs: m.stats.ttftMs,
      tokens: m.stats.generatedTokens,
      promptTokens: m.stats.promptTokens,
      hitRate: m.stats.hitRate,
    });
  }
  return points;
}

/** Milliseconds of expert-read wait per token as `1.25 ms`; unknown as an em dash. */
export function formatIoWait(ms: number | null | undefined): string {
  if (ms == null || !Number.isFinite(ms)) return "—";
  return `${ms < 10 ? ms.toFixed(2) : ms.toFixed(1)} ms`;
}

/** One figure of the Live view's expert cache panel. */
export interface LiveStat {
  label: string;
  value: string;
  hint?: string;
}

/**
 * The expert tiers of a GPU backend, as far as the engine reports them (docs/protocol.md,
 * `stats`): under the RAM tier (fewer GPU slots than host slots) the share of expert uses found
 * on the GPU, in RAM and read from the SSD; on any GPU that streams, the bytes copied to the GPU
 * per token; with hybrid experts ("cpu" or "split" as `gpuMisses`, the engine's own word, else
 * uses it reports), the experts the CPU computed per token and its time on them. Empty on the CPU
 * (no GPU slots) and for figures an older service leaves out.
 */
export function expertTierStats(
  cache: NonNullable<LiveSample["expertCache"]>,
  gpuMisses: EngineStatus["gpuMisses"],
): LiveStat[] {
  const out: LiveStat[] = [];
  const gpuSlots = cache.gpuSlots ?? 0;
  if (gpuSlots <= 0) return out;
  if (gpuSlots < cache.slots) {
    const tiers = `${gpuSlots} expert slots per layer on the GPU, fed from ${cache.slots} in system RAM`;
    out.push(
      { label: "GPU hit rate", value: formatPercent(cache.gpuHitRate, 1), hint: tiers },
      { label: "RAM hit rate", value: formatPercent(cache.ramHitRate, 1), hint: tiers },
      {
        label: "SSD misses",
        value: cache.hitRate == null ? "—" : formatPercent(1 - cache.hitRate, 1),
        hint: "Expert uses read from the model's files",
      },
    );
  }
  if (cache.gpuCopyBytesPerToken != null) {
    out.push({
      label: "Copied to GPU",
      value: `${formatBytes(cache.gpuCopyBytesPerToken)}/token`,
      hint: "Expert bytes copied from system RAM to the GPU per token",
    });
  }
  const cpu = cache.cpuExpertsPerToken;
  // Both "cpu" and "split" compute misses on the CPU (split: those beyond the GPU's share).
  if (cpu != null && (gpuMisses === "cpu" || gpuMisses === "split" || cpu > 0)) {
    const ms = cache.cpuExpertMsPerToken;
    out.push({
      label: "Experts on the CPU",
      value: `${cpu.toFixed(1)}/token${ms == null ? "" : ` (${formatIoWait(ms)})`}`,
      hint: "Hybrid experts: expert uses the CPU computed from system RAM per token, and its time on them",
    });
  }
  return out;
}
