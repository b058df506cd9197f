import { describe, expect, it } from "vitest";
import { formatBytes, formatStats } from "./stats.ts";

describe("formatStats", () => {
  it("prints the decode rate, TTFT with prefill rate and prompt size, and the token count", () => {
    // 52 tokens after the first in 2.613 s; 13 prompt tokens in 0.6601 s.
    expect(
      formatStats({
        promptTokens: 13,
        generatedTokens: 53,
        ttftSeconds: 0.6601,
        decodeSeconds: 2.613,
      }),
    ).toBe("19.9 t/s, TTFT: 660.1ms (19.7 t/s, 13 tokens), 53 tokens");
  });

  it("adds peak memory and the expert cache hit rate when known", () => {
    expect(
      formatStats({
        promptTokens: 4,
        generatedTokens: 1,
        ttftSeconds: 0.5,
        decodeSeconds: 0,
        peakMemoryBytes: 3 * 1024 ** 3,
        cacheHitRate: 0.875,
      }),
    ).toBe(
      "0.0 t/s, TTFT: 500.0ms (8.0 t/s, 4 tokens), 1 tokens, peak memory 3.00 GiB, expert cache hit rate 87.5%",
    );
  });

  it("formats byte sizes", () => {
    expect(formatBytes(512)).toBe("512 B");
    expect(formatBytes(1536)).toBe("1.5 KiB");
    expect(formatBytes(73 * 1024 ** 2)).toBe("73.0 MiB");
  });
});
