import { formatBytes } from "../units.ts";
/** The statistics line the CLI prints to stderr after a generation. */
export interface GenerationStats {
  promptTokens: number;
  generatedTokens: number;
  /** Seconds from the request to the first generated token (prefill plus one step). */
  ttftSeconds: number;
  /** Seconds spent generating the tokens after the first. */
  decodeSeconds: number;
  /** Peak resident memory of the engine in bytes, when known. */
  peakMemoryBytes?: number | null;
  /** Expert cache hit rate in [0, 1], when the model streams experts. */
  cacheHitRate?: number | null;
}

function rate(tokens: number, seconds: number): string {
  return seconds > 0 ? (tokens / seconds).toFixed(1) : "0.0";
}

/** Sizes in the one unit family the app and the CLI use (core/units.ts). */
export { formatBytes } from "../units.ts";

/**
 * `19.9 t/s, TTFT: 660.1ms (19.7 t/s, 13 tokens), 53 tokens, peak memory 1.21 GiB, expert cache
 * hit rate 87.5%`: the decode rate (tokens after the first over their time), the time to the
 * first token with the prefill rate and prompt length, the number of generated tokens, then the
 * peak memory and the cache hit rate where the engine reports them.
 */
export function formatStats(s: GenerationStats): string {
  const decoded = Math.max(0, s.generatedTokens - 1);
  const parts = [
    `${rate(decoded, s.decodeSeconds)} t/s`,
    `TTFT: ${(s.ttftSeconds * 1000).toFixed(1)}ms (${rate(s.promptTokens, s.ttftSeconds)} t/s, ${s.promptTokens} tokens)`,
    `${s.generatedTokens} tokens`,
  ];
  if (s.peakMemoryBytes != null) parts.push(`peak memory ${formatBytes(s.peakMemoryBytes)}`);
  if (s.cacheHitRate != null) {
    parts.push(`expert cache hit rate ${(s.cacheHitRate * 100).toFixed(1)}%`);
  }
  return parts.join(", ");
}
