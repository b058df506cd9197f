/**
 * GPU decode ops alone: runs native/build/redwing-bench-gpu-ops (REDWING_NATIVE_BUILD overrides
 * the build directory), which records each decode op of Gemma 4 26B-A4B's shapes many times in a
 * row, once as a dependent chain (a barrier between repeats, as the steps of a token) and once
 * independent (no barrier), prints the table and writes the raw JSON to
 * bench/results/gpu-ops.json. docs/gpu.md ("Eighteenth round") says how to read it.
 *
 *   npm run bench -- gpu-ops [--repeat 200] [--rounds 5] [--only q,head,...] [--backend vulkan]
 *
 * The output head is a 369 MB product: through lavapipe leave it out (`--only`).
 */
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { passThrough, runNativeBench } from "./native-bench.ts";

const OpResult = z.object({
  name: z.string(),
  what: z.string(),
  weight_bytes: z.number(),
  dependent_us: z.number(),
  independent_us: z.number(),
  dependent_gbps: z.number(),
  independent_gbps: z.number(),
  dispatches: z.number(),
  barriers_dependent: z.number(),
  barriers_independent: z.number(),
  record_us: z.number(),
});

export const GpuOpsReport = z.object({
  backend: z.string(),
  device: z.string(),
  repeat: z.number(),
  rounds: z.number(),
  cases: z.array(OpResult),
});
export type GpuOpsReport = z.infer<typeof GpuOpsReport>;

/** A readable table: one line per op, µs per repeat in a chain and alone, and weight GB/s. */
export function formatGpuOpsTable(report: GpuOpsReport): string {
  const header = ["op", "dependent us", "independent us", "chain cost us", "GB/s (indep.)", "what"];
  const rows = report.cases.map((c) => [
    c.name,
    c.dependent_us.toFixed(2),
    c.independent_us.toFixed(2),
    (c.dependent_us - c.independent_us).toFixed(2),
    c.weight_bytes > 0 ? c.independent_gbps.toFixed(0) : "-",
    c.what,
  ]);
  const widths = header.map((h, i) =>
    Math.max(h.length, ...rows.map((row) => row[i]?.length ?? 0)),
  );
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => (i === 0 || i === 5 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return [
    `${report.device}: medians of ${report.rounds} rounds of ${report.repeat} repeats`,
    "",
    line(header),
    ...rows.map(line),
  ].join("\n");
}

/** Runs the benchmark, prints the table and writes bench/results/gpu-ops.json. */
export async function runGpuOpsBench(
  args: string[] = passThrough(["--repeat", "--rounds", "--only", "--backend"]),
): Promise<GpuOpsReport> {
  return runNativeBench({
    binary: "redwing-bench-gpu-ops",
    args,
    schema: GpuOpsReport,
    format: formatGpuOpsTable,
    name: "gpu-ops",
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  runGpuOpsBench().catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  });
}
