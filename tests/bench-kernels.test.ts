// The CPU kernel benchmark (`npm run bench -- kernels`): the native tool's JSON as bench/kernels.ts
// reads it, with the expert layer (a decode step's 8 routed experts of one MoE layer, batched as
// the CPU backend runs them, exact and with 8-bit activations) next to the single products.
import { describe, expect, it } from "vitest";
import { formatKernelTable, KernelBenchReport } from "../bench/kernels.ts";
import { captureOutput, nativeBinary } from "../core/native.ts";

async function runKernels(...args: string[]): Promise<KernelBenchReport> {
  const out = await captureOutput([
    nativeBinary("redwing-bench-kernels"),
    "--quick",
    "--runs",
    "1",
    "--threads",
    "1",
    ...args,
  ]);
  return KernelBenchReport.parse(JSON.parse(out));
}

describe("redwing-bench-kernels", () => {
  it("times one MoE layer's routed experts, exact and with 8-bit activations", async () => {
    const report = await runKernels("--only", "experts");
    expect(report.results).toEqual([]);
    expect(report.expert_layer.map((e) => [e.activations, e.threads])).toEqual([
      ["exact", 1],
      ["int8", 1],
    ]);
    const bandwidth = report.bandwidth_gbps_by_threads["1"] ?? 0;
    expect(bandwidth).toBeGreaterThan(0);
    for (const e of report.expert_layer) {
      expect(e.gate_up_ms).toBeGreaterThan(0);
      expect(e.down_ms).toBeGreaterThan(0);
      // 8 experts' gate, up and down: 8 x 3 x (704 x 2,816 4-bit weights + bf16 scales and biases
      // per group of 64) bytes over the two products' time.
      const bytes = 8 * 3 * (704 * 2816 * 0.5 + 704 * (2816 / 64) * 4);
      expect(e.gbps).toBeCloseTo(bytes / ((e.gate_up_ms + e.down_ms) * 1e-3) / 1e9, 1);
      expect(e.fraction_of_bandwidth).toBeCloseTo(e.gbps / bandwidth, 3);
    }
    const table = formatKernelTable(report);
    expect(table).toMatch(/8 routed experts \(one layer, exact\), 1 thread: gate\/up [\d.]+ ms/);
    expect(table).toMatch(/8 routed experts \(one layer, int8\), 1 thread: .*% of bandwidth\)/);
  });

  it("leaves the expert layer out when --only names a shape", async () => {
    const report = await runKernels("--only", "2816x704");
    expect(report.expert_layer).toEqual([]);
    expect(new Set(report.results.map((r) => r.shape.join("x")))).toEqual(new Set(["2816x704"]));
    expect(formatKernelTable(report)).not.toContain("routed experts");
  });
});
