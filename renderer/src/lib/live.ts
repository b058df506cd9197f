/** Derived numbers for the live panels, from the latest sample and the engine status. */
import type { EngineStatus, LiveSample } from "../../../core/app/api.ts";
import { formatBytes } from "./format.ts";

export interface MemoryGauge {
  rss: number;
  /** The budget, or the machine's total memory when there is none. */
  max: number;
  maxKind: "budget" | "total";
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
  const maxKind = budget != null ? "budget" : "total";
  let text: string;
  if (rss == null) text = "no engine running";
  else if (max > 0) {
    text = `${formatBytes(rss)} of ${formatBytes(max)} ${maxKind === "budget" ? "budget" : "total memory"}`;
  } else text = formatBytes(rss);
  return { rss: rss ?? 0, max, maxKind, free: sample?.freeMemoryBytes ?? null, total, text };
}

/** Tokens/s samples while generating (null elsewhere, so charts show gaps between replies). */
export function tokensPerSecondSeries(samples: LiveSample[]): [number[], (number | null)[]] {
  const xs: number[] = [];
  const ys: (number | null)[] = [];
  for (const s of samples) {
    xs.push(s.t / 1000);
    ys.push(s.generating ? s.decodeTokensPerSecond : null);
  }
  return [xs, ys];
}
