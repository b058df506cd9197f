import { dirname } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { gemma3TokenizerFiles } from "../models/gemma3.ts";
import type { Backend, BackendEvent, GenerateRequest } from "./backend.ts";
import { runGeneration } from "./session.ts";
import { loadTokenizer, type ChatTokenizer } from "./tokenizer.ts";

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await loadTokenizer(dirname(gemma3TokenizerFiles().tokenizer));
});

/** A backend that streams `ids` one token per event until its signal is aborted. */
function fakeBackend(ids: number[]): Backend & { produced: number; sawAbort: boolean } {
  const b = {
    name: "fake",
    produced: 0,
    sawAbort: false,
    async *generate(req: GenerateRequest): AsyncIterable<BackendEvent> {
      for (const id of ids) {
        if (req.signal?.aborted) {
          b.sawAbort = true;
          break;
        }
        b.produced++;
        yield { type: "tokens", tokens: [id] };
        await new Promise((r) => setImmediate(r));
      }
      yield {
        type: "finished",
        reason: b.sawAbort ? "cancelled" : "length",
        stats: { promptTokens: 1, generatedTokens: b.produced, ttftSeconds: 0.1, decodeSeconds: 1 },
      };
    },
    async close() {},
  };
  return b;
}

const REQUEST = {
  modelDir: "/nowhere",
  tokens: [2],
  maxNew: 100,
  sampling: { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1 },
  stopTokenIds: [1, 106],
  load: { context: 4096 },
};

describe("runGeneration", () => {
  it("streams text pieces that add up to the decoded tokens", async () => {
    const ids = tok.encode("Привіт 🦀 world");
    const pieces: string[] = [];
    const r = await runGeneration(fakeBackend(ids), tok, REQUEST, {
      stopStrings: [],
      onText: (t) => pieces.push(t),
    });
    expect(pieces.join("")).toBe("Привіт 🦀 world");
    expect(r).toMatchObject({ text: "Привіт 🦀 world", tokens: ids, finishReason: "length" });
    expect(r.stats?.generatedTokens).toBe(ids.length);
  });

  it("stops at a stop string, cancels the engine, and never emits the stop string", async () => {
    const ids = tok.encode("one two three four five six seven");
    const backend = fakeBackend(ids);
    let out = "";
    const r = await runGeneration(backend, tok, REQUEST, {
      stopStrings: ["three"],
      onText: (t) => (out += t),
    });
    expect(out).toBe("one two ");
    expect(r.finishReason).toBe("stop_string");
    expect(backend.sawAbort).toBe(true);
    expect(backend.produced).toBeLessThan(ids.length);
  });

  it("stops at an end-of-turn id without printing it", async () => {
    const ids = [...tok.encode("done"), 106, ...tok.encode("more")];
    let out = "";
    const r = await runGeneration(fakeBackend(ids), tok, REQUEST, {
      stopStrings: [],
      onText: (t) => (out += t),
    });
    expect(out).toBe("done");
    expect(r.finishReason).toBe("stop_token");
  });
});
