import { dirname } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import type { ChatTokenizer } from "../chat/tokenizer.ts";
import { loadTokenizer } from "../chat/tokenizer.ts";
import type { GenerateEvent, GenerateParams } from "../engine/protocol.ts";
import { gemma3TokenizerFiles } from "../models/gemma3.ts";
import {
  generate,
  generateAll,
  type GenerationEvent,
  type GenerationRequest,
  type TokenEngine,
} from "./generate.ts";

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await loadTokenizer(dirname(gemma3TokenizerFiles().tokenizer));
});

interface FakeEngine extends TokenEngine {
  produced: number;
  sawAbort: boolean;
  params: GenerateParams | null;
}

/**
 * An engine that streams `ids` one token per event (as the decode service does) until its
 * signal is aborted, then ends with a finished event, as EngineClient does. `failAt`: throws
 * instead of producing that token.
 */
function fakeEngine(ids: number[], opts: { failAt?: number; timings?: boolean } = {}): FakeEngine {
  const e: FakeEngine = {
    produced: 0,
    sawAbort: false,
    params: null,
    async *generate(params, options = {}): AsyncIterable<GenerateEvent> {
      e.params = params;
      for (const id of ids) {
        if (options.signal?.aborted) {
          e.sawAbort = true;
          break;
        }
        if (e.produced === opts.failAt) throw new Error("engine exploded");
        e.produced++;
        yield { type: "tokens", id: 1, tokens: [id] };
        await new Promise((r) => setImmediate(r));
      }
      const tokens = ids.slice(0, e.produced);
      yield {
        type: "finished",
        id: 1,
        reason: e.sawAbort ? "cancelled" : "length",
        tokens,
        prompt_tokens: params.tokens.length,
        cached_tokens: 0,
        prefill_tokens: params.tokens.length,
        ...(opts.timings === false
          ? {}
          : {
              timings: {
                prefill_seconds: 0.1,
                ttft_seconds: 0.125,
                decode_seconds: 1,
                prefill_tokens_per_second: 10,
                decode_tokens_per_second: tokens.length - 1,
              },
            }),
      };
    },
  };
  return e;
}

const REQUEST: GenerationRequest = {
  tokens: [2, 17],
  maxNewTokens: 100,
  sampling: { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1 },
  stopIds: [1, 106],
};

async function collect<T>(
  events: AsyncIterable<GenerationEvent<T>>,
): Promise<GenerationEvent<T>[]> {
  const out: GenerationEvent<T>[] = [];
  for await (const e of events) out.push(e);
  return out;
}

describe("generate (the one generation loop)", () => {
  it("streams text pieces that add up to the decoded tokens, with counts and stats", async () => {
    const ids = tok.encode("Привіт 🦀 world");
    const pieces: string[] = [];
    const r = await generateAll(fakeEngine(ids), tok, REQUEST, {
      onText: (t) => pieces.push(t),
      readMemory: async () => ({ peakMemoryBytes: 1234, cacheHitRate: 0.5 }),
    });
    expect(pieces.join("")).toBe("Привіт 🦀 world");
    expect(r).toMatchObject({
      text: "Привіт 🦀 world",
      tokens: ids,
      finishReason: "length",
      promptTokens: 2,
      cachedTokens: 0,
      toolCalls: null,
    });
    expect(r.stats).toEqual({
      promptTokens: 2,
      generatedTokens: ids.length,
      ttftSeconds: 0.125,
      decodeSeconds: 1,
      peakMemoryBytes: 1234,
      cacheHitRate: 0.5,
    });
  });

  it("sends the protocol's fields: snake_case sampling, the budget, stop ids, stats interval", async () => {
    const engine = fakeEngine(tok.encode("x"));
    await generateAll(engine, tok, {
      ...REQUEST,
      maxNewTokens: 7,
      sampling: { temperature: 0.5, topK: 40, topP: 0.9, repetitionPenalty: 1.1, seed: 42 },
      statsIntervalMs: 500,
    });
    expect(engine.params).toEqual({
      tokens: [2, 17],
      max_new_tokens: 7,
      sampling: { temperature: 0.5, top_k: 40, top_p: 0.9, repetition_penalty: 1.1, seed: 42 },
      stop_token_ids: [1, 106],
      ignore_eos: false,
      stats_interval_ms: 500,
    });
  });

  it("ignoreEos sends no stop ids and reads past an end-of-turn id", async () => {
    const ids = [...tok.encode("a"), 106, ...tok.encode("b")];
    const engine = fakeEngine(ids);
    const r = await generateAll(engine, tok, { ...REQUEST, ignoreEos: true });
    expect(engine.params).toMatchObject({ stop_token_ids: [], ignore_eos: true });
    expect(r.tokens).toEqual(ids);
    expect(r.finishReason).toBe("length");
  });

  it("stops at a stop string, cancels the engine, and never emits the stop string", async () => {
    const ids = tok.encode("one two three four five six seven");
    const engine = fakeEngine(ids);
    let out = "";
    const r = await generateAll(
      engine,
      tok,
      { ...REQUEST, stopStrings: ["three"] },
      { onText: (t) => (out += t) },
    );
    expect(out).toBe("one two ");
    expect(r.text).toBe("one two ");
    expect(r.finishReason).toBe("stop_string");
    expect(engine.sawAbort).toBe(true);
    expect(engine.produced).toBeLessThan(ids.length);
  });

  it("holds back text that may start a stop string and releases it when it does not", async () => {
    const ids = tok.encode("abc ab");
    const seen: string[] = [];
    const r = await generateAll(
      fakeEngine(ids),
      tok,
      { ...REQUEST, stopStrings: ["abd"] },
      { onText: (t) => seen.push(t) },
    );
    // "ab" at the end could be the start of "abd" until the generation ended.
    expect(seen.at(-1)!.endsWith("ab")).toBe(true);
    expect(seen.join("")).toBe("abc ab");
    expect(r.finishReason).toBe("length");
  });

  it("stops at an end-of-turn id without showing it", async () => {
    const ids = [...tok.encode("done"), 106, ...tok.encode("more")];
    let out = "";
    const r = await generateAll(fakeEngine(ids), tok, REQUEST, { onText: (t) => (out += t) });
    expect(out).toBe("done");
    expect(r.finishReason).toBe("stop_token");
    expect(r.tokens).toEqual(ids.slice(0, tok.encode("done").length + 1));
  });

  it("a cancel through the signal ends as cancelled, with the text so far", async () => {
    const ids = tok.encode("one two three four five six seven eight nine ten");
    const engine = fakeEngine(ids);
    const abort = new AbortController();
    let out = "";
    const r = await generateAll(engine, tok, REQUEST, {
      signal: abort.signal,
      onText: (t) => {
        out += t;
        if (out.includes("two")) abort.abort();
      },
    });
    expect(r.finishReason).toBe("cancelled");
    expect(engine.sawAbort).toBe(true);
    expect(r.text).toBe(out);
    expect(out.length).toBeLessThan("one two three four five six seven eight nine ten".length);
  });

  it("an engine error is thrown; one after a cancel is the cancel", async () => {
    const ids = tok.encode("one two three four");
    await expect(generateAll(fakeEngine(ids, { failAt: 2 }), tok, REQUEST)).rejects.toThrow(
      "engine exploded",
    );
    const abort = new AbortController();
    abort.abort();
    const engine: TokenEngine = {
      // eslint-disable-next-line require-yield
      async *generate() {
        throw new Error("killed");
      },
    };
    const r = await generateAll(engine, tok, REQUEST, { signal: abort.signal });
    expect(r).toMatchObject({ finishReason: "cancelled", text: "", stats: null });
  });

  it("no stats without the engine's timings", async () => {
    const r = await generateAll(fakeEngine(tok.encode("hi"), { timings: false }), tok, REQUEST);
    expect(r.stats).toBeNull();
  });

  it("with a tool-call parser, holds all text and returns the calls and their content", async () => {
    const ids = [...tok.encode("call:f{}"), 106];
    const seenByParser: [string, boolean][] = [];
    const events = await collect(
      generate(fakeEngine(ids), tok, REQUEST, {
        parseToolCalls: (text, endedOnStop) => {
          seenByParser.push([text, endedOnStop]);
          return { content: "before", calls: [text] };
        },
      }),
    );
    expect(seenByParser).toEqual([["call:f{}", true]]);
    const texts = events.filter((e) => e.type === "text");
    expect(texts).toEqual([{ type: "text", text: "before" }]);
    const done = events.at(-1);
    expect(done?.type === "done" && done.result.toolCalls).toEqual({
      content: "before",
      calls: ["call:f{}"],
    });
  });

  it("with a tool-call parser that finds none, the text goes out in one piece", async () => {
    const events = await collect(
      generate(fakeEngine(tok.encode("just words here")), tok, REQUEST, {
        parseToolCalls: () => null,
      }),
    );
    expect(events.filter((e) => e.type === "text")).toEqual([
      { type: "text", text: "just words here" },
    ]);
  });

  it("passes the service's periodic stats on and counts tokens as they are read", async () => {
    const ids = tok.encode("one two");
    const stats = { type: "stats", id: 1 } as unknown as GenerateEvent;
    const engine: TokenEngine = {
      async *generate(params, options) {
        yield stats;
        yield* fakeEngine(ids).generate(params, options);
      },
    };
    const events = await collect(generate(engine, tok, REQUEST));
    expect(events[0]).toEqual({ type: "stats", stats });
    const counted = events.reduce((n, e) => n + (e.type === "tokens" ? e.count : 0), 0);
    expect(counted).toBe(ids.length);
  });
});
