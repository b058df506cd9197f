// The tokenizer on a worker thread (core/chat/tokenizer.ts, encodeAsync): long texts take
// seconds to tokenize, which must not hold up the event loop that answers every other client.
// Plain JavaScript so that it runs without a TypeScript loader (as the packaged app does).
import { readFileSync } from "node:fs";
import { parentPort, workerData } from "node:worker_threads";
import { Tokenizer } from "@huggingface/tokenizers";

const { tokenizerPath, configPath } = workerData;
const json = JSON.parse(readFileSync(tokenizerPath, "utf8"));
const config = configPath === null ? {} : JSON.parse(readFileSync(configPath, "utf8"));
const tokenizer = new Tokenizer(json, config);

parentPort.on("message", ({ id, text }) => {
  try {
    const ids = Int32Array.from(tokenizer.encode(text, { add_special_tokens: false }).ids);
    parentPort.postMessage({ id, ids }, [ids.buffer]);
  } catch (error) {
    parentPort.postMessage({ id, error: error instanceof Error ? error.message : String(error) });
  }
});
