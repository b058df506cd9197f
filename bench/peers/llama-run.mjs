// Runs llama.cpp (through node-llama-cpp's prebuilt CPU binaries) on a GGUF and prints one JSON
// line: prefill and decode rates for a fixed token sequence. Started by bench/vs-llama-cpp.ts in
// its own process, so that each engine runs alone and its memory is returned afterwards.
//
//   node bench/peers/llama-run.mjs MODEL.gguf THREADS PROMPT_TOKENS DECODE_TOKENS CONTEXT
import { performance } from "node:perf_hooks";
import { getLlama } from "node-llama-cpp";

const [modelPath, threadsArg, promptArg, decodeArg, contextArg] = process.argv.slice(2);
const threads = Number(threadsArg);
const promptLength = Number(promptArg);
const decodeTokens = Number(decodeArg);
const contextSize = Number(contextArg);
if (!modelPath || ![threads, promptLength, decodeTokens, contextSize].every(Number.isInteger)) {
  console.error("usage: llama-run.mjs MODEL.gguf THREADS PROMPT_TOKENS DECODE_TOKENS CONTEXT");
  process.exit(2);
}

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({
  contextSize,
  threads,
  batchSize: Math.min(512, Math.max(promptLength, 1)),
  sequences: 1,
});
const sequence = context.getSequence();
// The same spread-out ids as Redwing's engine benchmark (bench/engine.ts syntheticPrompt).
const prompt = Array.from({ length: promptLength }, (_, i) => 1000 + ((i * 7919) % 200000));

let t = performance.now();
await sequence.evaluateWithoutGeneratingNewTokens(prompt);
const prefillSeconds = (performance.now() - t) / 1000;

// Greedy decode; every step computes the full logits and samples one token.
let produced = 0;
t = performance.now();
for await (const token of sequence.evaluate([prompt.at(-1) ?? 2], { temperature: 0 })) {
  void token;
  if (++produced >= decodeTokens) break;
}
const decodeSeconds = (performance.now() - t) / 1000;
console.log(
  JSON.stringify({
    engine: "llama.cpp",
    system_info: llama.systemInfo,
    prompt_tokens: promptLength,
    prefill_seconds: prefillSeconds,
    decode_tokens: produced,
    decode_seconds: decodeSeconds,
  }),
);
await context.dispose();
await model.dispose();
await llama.dispose();
