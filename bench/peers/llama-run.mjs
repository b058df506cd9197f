// Runs llama.cpp (through node-llama-cpp's prebuilt CPU binaries) on a GGUF and prints one JSON
// line: prefill and decode rates for a fixed token sequence. Started by bench/vs-llama-cpp.ts in
// its own process, so that each engine runs alone and its memory is returned afterwards.
//
//   node bench/peers/llama-run.mjs MODEL.gguf THREADS PROMPT_TOKENS DECODE_TOKENS CONTEXT
//                                  [--mmap on|off] [--ignore-memory-checks]
//
// --mmap: llama.cpp's load mode (default: node-llama-cpp's, which maps the file where it can).
// --ignore-memory-checks: skip node-llama-cpp's own check of the model against the machine's free
// memory (it cannot see a cgroup's limit; the memory-limited runs let the kernel decide).
// Weight repacking is llama.cpp's default; bench/peers/no-repack.c, preloaded, turns it off.
//
// Before the prompt it prints {"event":"loaded",...} (so a run killed later is known to have
// loaded; model buffers are printed as they are made, below); the last line is the report: rates, the process's peak RSS, the bytes it read from the
// disk during prefill and decode (/proc/self/io, page faults on the mapped file included; null
// where unreadable) and llama.cpp's model buffers by type (CPU_Mapped: the file's pages;
// CPU_REPACK, AMX, CPU: copies in RAM).
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { getLlama } from "node-llama-cpp";

const positional = [];
let mmap;
let ignoreMemorySafetyChecks = false;
for (let i = 2; i < process.argv.length; i++) {
  const arg = process.argv[i];
  if (arg === "--mmap") mmap = process.argv[++i] ?? "";
  else if (arg === "--ignore-memory-checks") ignoreMemorySafetyChecks = true;
  else positional.push(arg);
}
const [modelPath, threadsArg, promptArg, decodeArg, contextArg] = positional;
const threads = Number(threadsArg);
const promptLength = Number(promptArg);
const decodeTokens = Number(decodeArg);
const contextSize = Number(contextArg);
if (
  positional.length !== 5 ||
  ![threads, promptLength, decodeTokens, contextSize].every(Number.isInteger) ||
  (mmap !== undefined && mmap !== "on" && mmap !== "off")
) {
  console.error(
    "usage: llama-run.mjs MODEL.gguf THREADS PROMPT_TOKENS DECODE_TOKENS CONTEXT [--mmap on|off] [--ignore-memory-checks]",
  );
  process.exit(2);
}

/** Bytes this process has caused to be read from the disk so far; null where not readable. */
function readBytes() {
  try {
    const m = /^read_bytes:\s*(\d+)$/m.exec(readFileSync("/proc/self/io", "utf8"));
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}
const between = (a, b) => (a === null || b === null ? null : b - a);

// llama.cpp's info log names each model buffer ("load_tensors: CPU_REPACK model buffer size =
// 1234.00 MiB") when it allocates them, before it reads the weights: each is printed at once as
// {"event":"model_buffer",...}, so a run killed while loading still shows them. Errors go on to
// stderr, as before.
const modelBuffersMib = {};
const llama = await getLlama({
  gpu: false,
  build: "never",
  logLevel: "info",
  logger: (level, message) => {
    const m = /(\S+) model buffer size =\s*([\d.]+) MiB/.exec(message);
    if (m) {
      modelBuffersMib[m[1]] = (modelBuffersMib[m[1]] ?? 0) + Number(m[2]);
      console.log(JSON.stringify({ event: "model_buffer", type: m[1], mib: Number(m[2]) }));
    }
    if (level === "fatal" || level === "error") process.stderr.write(message);
  },
});
const loadStart = performance.now();
const model = await llama.loadModel({
  modelPath,
  gpuLayers: 0,
  ...(mmap ? { useMmap: mmap === "on" } : {}),
  ...(ignoreMemorySafetyChecks ? { ignoreMemorySafetyChecks } : {}),
});
const context = await model.createContext({
  contextSize,
  threads,
  batchSize: Math.min(512, Math.max(promptLength, 1)),
  sequences: 1,
  ...(ignoreMemorySafetyChecks ? { ignoreMemorySafetyChecks } : {}),
});
const loadSeconds = (performance.now() - loadStart) / 1000;
console.log(JSON.stringify({ event: "loaded", load_seconds: loadSeconds }));
const sequence = context.getSequence();
// The same spread-out ids as Redwing's engine benchmark (bench/engine.ts syntheticPrompt).
const prompt = Array.from({ length: promptLength }, (_, i) => 1000 + ((i * 7919) % 200000));

const readAtPrefill = readBytes();
let t = performance.now();
await sequence.evaluateWithoutGeneratingNewTokens(prompt);
const prefillSeconds = (performance.now() - t) / 1000;

// Greedy decode; every step computes the full logits and samples one token.
const readAtDecode = readBytes();
let produced = 0;
t = performance.now();
for await (const token of sequence.evaluate([prompt.at(-1) ?? 2], { temperature: 0 })) {
  void token;
  if (++produced >= decodeTokens) break;
}
const decodeSeconds = (performance.now() - t) / 1000;
const readAtEnd = readBytes();
console.log(
  JSON.stringify({
    engine: "llama.cpp",
    system_info: llama.systemInfo,
    load_seconds: loadSeconds,
    prompt_tokens: promptLength,
    prefill_seconds: prefillSeconds,
    decode_tokens: produced,
    decode_seconds: decodeSeconds,
    peak_rss_bytes: process.resourceUsage().maxRSS * 1024,
    prefill_read_bytes: between(readAtPrefill, readAtDecode),
    decode_read_bytes: between(readAtDecode, readAtEnd),
    model_buffers_mib: modelBuffersMib,
  }),
);
await context.dispose();
await model.dispose();
await llama.dispose();
