// `npm run bench [-- name ...]`: runs the named benchmarks (all by default). Each prints a
// readable table and writes JSON under bench/results/.
import { runKernelBench } from "./kernels.ts";
import { runEngineBench } from "./engine.ts";

const benches: Record<string, () => Promise<void>> = {
  kernels: runKernelBench,
  engine: runEngineBench,
};

const requested = process.argv.slice(2).filter((arg) => !arg.startsWith("-"));
const names = requested.length > 0 ? requested : Object.keys(benches);
for (const name of names) {
  const bench = benches[name];
  if (!bench) {
    console.error(`unknown benchmark "${name}"; known: ${Object.keys(benches).join(", ")}`);
    process.exit(2);
  }
  console.log(`\n## ${name}`);
  await bench();
}
