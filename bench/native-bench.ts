// Running one of the native benchmark tools (native/tools/redwing-bench-*): its own options
// passed through from our command line, its JSON report parsed, a table printed, the raw report
// written to bench/results/<name>.json.
import type { z } from "zod";
import { captureOutput, nativeBinary } from "../core/native.ts";
import { writeResult } from "./stats.ts";

/** Our command line's options among `own`, each with its value where it takes one. */
export function passThrough(own: string[], argv = process.argv.slice(2)): string[] {
  return argv.filter((a, i, all) => own.includes(a) || own.includes(all[i - 1] ?? ""));
}

/**
 * Runs `binary` with `args` (its progress lines on our stderr, its JSON report on stdout), checks
 * the report against `schema`, prints `format(report)` and writes bench/results/`name`.json.
 */
export async function runNativeBench<S extends z.ZodTypeAny>(options: {
  binary: string;
  args: string[];
  schema: S;
  format: (report: z.infer<S>) => string;
  name: string;
}): Promise<z.infer<S>> {
  const stdout = await captureOutput([nativeBinary(options.binary), ...options.args], {
    inheritStderr: true,
  });
  const report = options.schema.parse(JSON.parse(stdout)) as z.infer<S>;
  console.log(options.format(report));
  await writeResult(options.name, report);
  return report;
}
