/**
 * Shared by the property-based fuzz tests (`*.fuzz.test.ts`, fast-check): how many runs, and
 * the corpus of regression inputs kept in fixtures/fuzz/<target>/ (JSON files, each an array of
 * inputs in the target's own shape), replayed before the random runs on every `npm test`.
 *
 * `npm test` runs each target for a few seconds; a long run is one command:
 *
 *   FUZZ_RUNS=1000000 npx vitest run core/**\/*.fuzz.test.ts
 *
 * FUZZ_SEED replays a run fast-check reported. A counterexample it finds goes into the target's
 * corpus file (with the fix), so that it is checked on every run from then on.
 */
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import fc from "fast-check";

const CORPUS_ROOT = fileURLToPath(new URL("../fixtures/fuzz", import.meta.url));

/** Runs per property: FUZZ_RUNS when set, else `fallback` (sized for a few seconds). */
export function fuzzRuns(fallback: number): number {
  const n = Number(process.env.FUZZ_RUNS);
  return Number.isSafeInteger(n) && n > 0 ? n : fallback;
}

/** fast-check parameters: the run count, and the seed when FUZZ_SEED replays one. */
export function fuzzParameters(fallbackRuns: number): { numRuns: number; seed?: number } {
  const seed = Number(process.env.FUZZ_SEED);
  return {
    numRuns: fuzzRuns(fallbackRuns),
    ...(process.env.FUZZ_SEED && Number.isFinite(seed) ? { seed } : {}),
  };
}

/** Every input stored for `target` (fixtures/fuzz/<target>/*.json, each an array). */
export function corpus<T = unknown>(target: string): T[] {
  const dir = join(CORPUS_ROOT, target);
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => n.endsWith(".json"));
  } catch {
    return [];
  }
  return names.sort().flatMap((n) => JSON.parse(readFileSync(join(dir, n), "utf8")) as T[]);
}

/**
 * Checks `predicate` on the corpus inputs and then on `numRuns` generated ones (FUZZ_RUNS);
 * with FUZZ_RUNS set, prints how many executions it made and how long they took (the long run's
 * report).
 */
export async function fuzz<T>(
  name: string,
  arbitrary: fc.Arbitrary<T>,
  predicate: (input: T) => void | Promise<void>,
  options: { runs: number; examples?: T[] },
): Promise<void> {
  let executions = 0;
  const started = performance.now();
  await fc.assert(
    fc.asyncProperty(arbitrary, async (input) => {
      executions++;
      await predicate(input);
    }),
    {
      ...fuzzParameters(options.runs),
      examples: (options.examples ?? []).map((e) => [e] as [T]),
    },
  );
  if (process.env.FUZZ_RUNS) {
    const s = ((performance.now() - started) / 1000).toFixed(1);
    process.stderr.write(`fuzz ${name}: ${executions} executions in ${s} s\n`);
  }
}
