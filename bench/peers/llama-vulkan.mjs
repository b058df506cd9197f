// llama.cpp's Vulkan backend (node-llama-cpp 3.22.1's prebuilt linux-x64-vulkan binaries) on a
// GGUF: decode tok/s at batch 1 after 8 and after 512 prompt tokens, prefill tok/s for 512 and
// 4096 tokens. One JSON line per measurement. Used by the fifth round's device run (docs/gpu.md).
//   node bench/peers/llama-vulkan.mjs MODEL.gguf   (after `npm ci --prefix bench/peers`; the fifth
// round ran it with VK_DRIVER_FILES set to the NVIDIA driver's file)
import { performance } from "node:perf_hooks";
import { getLlama } from "node-llama-cpp";

const [modelPath] = process.argv.slice(2);
const llama = await getLlama({ gpu: "vulkan", build: "never", logLevel: "warn" });
console.log(JSON.stringify({ gpu: llama.gpu, devices: await llama.getGpuDeviceNames() }));
const model = await llama.loadModel({ modelPath, gpuLayers: "max" });
const context = await model.createContext({ contextSize: 4608, batchSize: 512, sequences: 1 });
const sequence = context.getSequence();
const prompt = (n) => Array.from({ length: n }, (_, i) => 1000 + ((i * 7919) % 200000));

async function prefill(n) {
  await sequence.clearHistory();
  const t = performance.now();
  await sequence.evaluateWithoutGeneratingNewTokens(prompt(n));
  return n / ((performance.now() - t) / 1000);
}
async function decode(promptLength, tokens) {
  await sequence.clearHistory();
  const p = prompt(promptLength);
  await sequence.evaluateWithoutGeneratingNewTokens(p.slice(0, -1));
  let produced = 0;
  const t = performance.now();
  for await (const token of sequence.evaluate([p.at(-1)], { temperature: 0 })) {
    void token;
    if (++produced >= tokens) break;
  }
  return produced / ((performance.now() - t) / 1000);
}
const warm = await decode(8, 8);
for (const [what, run] of [
  ["decode after 8 (64 tokens)", () => decode(8, 64)],
  ["decode after 512 (64 tokens)", () => decode(512, 64)],
  ["prefill 512", () => prefill(512)],
  ["prefill 4096", () => prefill(4096)],
]) {
  const rates = [];
  for (let r = 0; r < 3; r++) rates.push(await run());
  console.log(JSON.stringify({ what, tok_s: rates.map((x) => Number(x.toFixed(1))), warm }));
}
await context.dispose();
await model.dispose();
await llama.dispose();
