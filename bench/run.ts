// `npm run bench [-- name ...]`: runs the named benchmarks (all by default). Each prints a
// readable table and writes JSON under bench/results/.
import { runKernelBench } from "./kernels.ts";
import { runEngineBench } from "./engine.ts";
import { runInstallBench } from "./install.ts";
import { runServerLoadBench } from "./server-load.ts";
import { runStreamingBench } from "./streaming.ts";
import { runCachePolicyBench } from "./cache-policy.ts";
import { runVsLlamaCppBench } from "./vs-llama-cpp.ts";
import { runGpuBench } from "./gpu.ts";
import { runGpuStreamingBench } from "./gpu-streaming.ts";
import { runGpuOpsBench } from "./gpu-ops.ts";
import { runConversationSearchBench } from "./conversation-search.ts";

const benches: Record<string, () => Promise<unknown>> = {
  kernels: runKernelBench,
  engine: runEngineBench,
  install: () => runInstallBench(),
  server: () => runServerLoadBench(),
  streaming: runStreamingBench,
  "cache-policy": runCachePolicyBench,
  "vs-llama-cpp": runVsLlamaCppBench,
  gpu: runGpuBench,
  "gpu-streaming": runGpuStreamingBench,
  "gpu-ops": () => runGpuOpsBench(),
  search: runConversationSearchBench,
};

// Names are the arguments that are neither options nor an option's value (`--model DIR`).
const args = process.argv.slice(2);
const requested = args.filter((arg, i) => !arg.startsWith("-") && !args[i - 1]?.startsWith("--"));
// vs-llama-cpp installs its peer from the npm registry and writes two 14 GB models, and gpu and
// gpu-streaming and gpu-ops need a Vulkan device: they run only when named.
const onlyNamed = new Set(["vs-llama-cpp", "gpu", "gpu-streaming", "gpu-ops"]);
const names =
  requested.length > 0 ? requested : Object.keys(benches).filter((n) => !onlyNamed.has(n));
for (const name of names) {
  const bench = benches[name];
  if (!bench) {
    console.error(`unknown benchmark "${name}"; known: ${Object.keys(benches).join(", ")}`);
    process.exit(2);
  }
  console.log(`\n## ${name}`);
  await bench();
}
