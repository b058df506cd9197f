/**
 * CPU kernel benchmark: runs native/build/redwing-bench-kernels (REDWING_NATIVE_BUILD overrides
 * the build directory), prints a table of quantized matrix-vector throughput at Gemma 4
 * 26B-A4B shapes next to the machine's measured memory bandwidth, and writes the raw JSON to
 * bench/results/kernels.json.
 *
 *   node --import tsx bench/kernels.ts [--quick] [--threads 1,2] [--runs N]
 */
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { passThrough, runNativeBench } from "./native-bench.ts";

const Result = z.object({
  shape: z.tuple([z.number(), z.number()]),
  bits: z.number(),
  group_size: z.number(),
  threads: z.number(),
  isa: z.string(),
  ms: z.number(),
  gbps: z.number(),
  fraction_of_bandwidth: z.number(),
});

/** A decode step's 8 routed experts of one MoE layer, batched as the CPU backend runs them. */
const ExpertLayer = z.object({
  activations: z.enum(["exact", "int8"]),
  threads: z.number(),
  gate_up_ms: z.number(),
  down_ms: z.number(),
  gbps: z.number(),
  fraction_of_bandwidth: z.number(),
});

export const KernelBenchReport = z.object({
  cpu_features: z.string(),
  active_isa: z.string(),
  bandwidth_gbps: z.number(),
  bandwidth_gbps_by_threads: z.record(z.string(), z.number()),
  expert_layer: z.array(ExpertLayer),
  results: z.array(Result),
});
export type KernelBenchReport = z.infer<typeof KernelBenchReport>;

/** A readable table: one line per shape, thread count and ISA. */
export function formatKernelTable(report: KernelBenchReport): string {
  const bw = Object.entries(report.bandwidth_gbps_by_threads)
    .map(([t, v]) => `${t} thread${t === "1" ? "" : "s"}: ${v.toFixed(1)} GB/s`)
    .join(", ");
  const header = ["shape", "bits", "threads", "isa", "ms", "GB/s", "of bandwidth"];
  const rows = report.results.map((r) => [
    `${r.shape[0]} x ${r.shape[1]}`,
    String(r.bits),
    String(r.threads),
    r.isa,
    r.ms.toFixed(3),
    r.gbps.toFixed(1),
    `${(r.fraction_of_bandwidth * 100).toFixed(0)}%`,
  ]);
  const widths = header.map((h, i) =>
    Math.max(h.length, ...rows.map((row) => row[i]?.length ?? 0)),
  );
  const line = (cells: string[]): string =>
    cells.map((c, i) => (i < 2 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join("  ");
  const experts = report.expert_layer.map(
    (e) =>
      `8 routed experts (one layer, ${e.activations}), ${e.threads} thread${e.threads === 1 ? "" : "s"}: ` +
      `gate/up ${e.gate_up_ms.toFixed(3)} ms, down ${e.down_ms.toFixed(3)} ms, ` +
      `${e.gbps.toFixed(1)} GB/s (${(e.fraction_of_bandwidth * 100).toFixed(0)}% of bandwidth)`,
  );
  return [
    `CPU: ${report.cpu_features} (kernels: ${report.active_isa})`,
    `Memory read bandwidth: ${bw}`,
    ...(experts.length ? ["", ...experts] : []),
    "",
    line(header),
    ...rows.map(line),
  ].join("\n");
}

/** Runs the kernel benchmark, prints the table and writes bench/results/kernels.json. */
export async function runKernelBench(args?: string[]): Promise<void> {
  await measureKernels(args);
}

/** As runKernelBench, returning the parsed report. */
export async function measureKernels(
  args: string[] = passThrough(["--quick", "--threads", "--runs", "--only"]),
): Promise<KernelBenchReport> {
  return runNativeBench({
    binary: "redwing-bench-kernels",
    args,
    schema: KernelBenchReport,
    format: formatKernelTable,
    name: "kernels",
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  measureKernels().catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  });
}
