// Small helpers every benchmark shares: command-line numbers, medians and the results file.
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseByteSize } from "../core/units.ts";

/** Where benchmarks write their JSON unless told otherwise. */
const resultsDir = fileURLToPath(new URL("results", import.meta.url));

/** Writes `data` as indented JSON to `dir`/`name`.json (the folder made if missing); the path. */
export async function writeResult(name: string, data: unknown, dir = resultsDir): Promise<string> {
  await mkdir(dir, { recursive: true });
  const path = join(dir, `${name}.json`);
  await writeFile(path, JSON.stringify(data, null, 2) + "\n");
  return path;
}

/**
 * `--name N` from the command line: an integer of at least `min` (1 unless a flag gives 0 a
 * meaning), or `fallback` when absent.
 */
export function flag(name: string, fallback: number, min = 1): number {
  const i = process.argv.indexOf(`--${name}`);
  const value = i >= 0 ? Number(process.argv[i + 1]) : fallback;
  if (!Number.isInteger(value) || value < min)
    throw new Error(`--${name} must be an integer of at least ${min}`);
  return value;
}

/** `--name SIZE` from the command line (`3.5G`, `512M`: powers of 1024), in bytes; undefined when absent. */
export function sizeFlag(name: string): number | undefined {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return undefined;
  const bytes = parseByteSize(process.argv[i + 1] ?? "");
  if (bytes === undefined) throw new Error(`--${name} must be a size such as 3.5G or 512M`);
  return bytes;
}

/** The median (mean of the middle two for an even count); what the benches report on noisy machines. */
export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}
