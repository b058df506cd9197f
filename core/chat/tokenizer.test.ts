import { dirname } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { gemma3TokenizerFiles } from "../models/gemma3.ts";
import { IncrementalDecoder } from "./detokenize.ts";
import { TextStream } from "./text-stream.ts";
import { loadTokenizer, type ChatTokenizer } from "./tokenizer.ts";

// The real Gemma 3 tokenizer (262144 pieces + <image_soft_token>), as the demo model ships it.
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await loadTokenizer(dirname(gemma3TokenizerFiles().tokenizer));
});

const SAMPLES = [
  "Hello, world!",
  "Привіт, світе! Як справи? Ґанок, їжак, є.",
  "emoji 🦀🇺🇦👩‍👩‍👧 ok",
  "def f(x):\n    return x  # two  spaces\n\n\tindented\t\n",
  "  leading and trailing  ",
  "mixed: café naïve 日本語 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u{10FFFF} end",
];

describe("Gemma tokenizer", () => {
  it("has the Gemma 3 vocabulary and special ids (gemma-arch.md section 6)", () => {
    expect(tok.size).toBe(262145);
    expect(tok.bosId).toBe(2);
    expect(tok.tokenId("<eos>")).toBe(1);
    expect(tok.tokenId("<pad>")).toBe(0);
    expect(tok.tokenId("<start_of_turn>")).toBe(105);
    expect(tok.tokenId("<end_of_turn>")).toBe(106);
    expect(tok.encode("\n")).toEqual([107]);
  });

  it.each(SAMPLES)("round-trips %j", (text) => {
    const ids = tok.encode(text);
    expect(ids.length).toBeGreaterThan(0);
    for (const id of ids) expect(id).toBeLessThan(tok.size);
    expect(tok.decode(ids)).toBe(text);
  });

  it("uses byte fallback for characters outside the vocabulary", () => {
    const ids = tok.encode("\u{10FFFF}");
    // U+10FFFF is F4 8F BF BF in UTF-8: four <0xXX> byte pieces.
    expect(ids).toHaveLength(4);
    expect(tok.decode(ids.slice(0, 2))).toContain("\uFFFD");
    expect(tok.decode(ids)).toBe("\u{10FFFF}");
  });

  it("matches special-token strings as single tokens and adds BOS once", () => {
    const ids = tok.encode("<bos><start_of_turn>user\nhi<end_of_turn>\n");
    expect(ids.slice(0, 2)).toEqual([2, 105]);
    expect(ids.filter((i) => i === 106)).toHaveLength(1);
    expect(tok.encode("<bos>x", { addBos: true }).filter((i) => i === 2)).toHaveLength(1);
    expect(tok.encode("x", { addBos: true })[0]).toBe(2);
    expect(tok.decode(ids)).toBe("user\nhi\n");
    expect(tok.decode(ids, { skipSpecial: false })).toBe(
      "<bos><start_of_turn>user\nhi<end_of_turn>\n",
    );
  });

  it("decodes incrementally to exactly the full decoding at every prefix", () => {
    const decode = (ids: readonly number[]): string => tok.decode(ids);
    for (const text of SAMPLES) {
      const ids = tok.encode(text);
      const dec = new IncrementalDecoder(decode);
      let out = "";
      for (let n = 1; n <= ids.length; n++) {
        const piece = dec.push(ids[n - 1]!);
        expect(piece).not.toContain("\uFFFD");
        out += piece;
        const full = decode(ids.slice(0, n));
        // What was emitted is the full decoding minus at most an incomplete character.
        expect(full.startsWith(out)).toBe(true);
        if (!full.endsWith("\uFFFD")) expect(out).toBe(full);
      }
      out += dec.flush();
      expect(out).toBe(text);
    }
  });

  it("decodes random token sequences (stray and split byte pieces included) like a full decode", () => {
    const decode = (ids: readonly number[]): string => tok.decode(ids);
    // Byte-fallback pieces of 🦀 (F0 9F A6 80) and of "ї" (D1 97), stray continuation bytes,
    // words with and without a leading ▁, newlines, spaces and special tokens.
    const bytes = ["<0xF0>", "<0x9F>", "<0xA6>", "<0x80>", "<0xD1>", "<0x97>"].map((b) => {
      const id = tok.tokenId(b);
      expect(id, b).not.toBeNull();
      return id!;
    });
    const pool = [
      ...bytes,
      ...tok.encode("Hello world, Привіт світе!\n\n  x"),
      ...tok.encode(" the"),
      1,
      106,
      107,
    ];
    let seed = 12345;
    const next = (): number => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed;
    };
    for (let round = 0; round < 200; round++) {
      const ids = Array.from({ length: 1 + (next() % 24) }, () => pool[next() % pool.length]!);
      const dec = new IncrementalDecoder(decode);
      const out = ids.map((id) => dec.push(id)).join("") + dec.flush();
      expect(out, JSON.stringify(ids)).toBe(decode(ids));
    }
  });

  it("keeps spaces right when a word starts a new token (no dropped ▁)", () => {
    const ids = tok.encode("a b  c");
    const dec = new IncrementalDecoder((x) => tok.decode(x));
    const pieces = ids.map((id) => dec.push(id));
    expect(pieces.join("") + dec.flush()).toBe("a b  c");
    expect(pieces.some((p) => p.startsWith(" "))).toBe(true);
  });

  it("streams text, stopping at an end-of-turn id or a stop string split across tokens", () => {
    const ids = tok.encode("The answer is 42.\nUser: more");
    const run = (
      stopStrings: string[],
      extra: number[] = [],
    ): { text: string; reason: string | null } => {
      const s = new TextStream((x) => tok.decode(x), { stopStrings, stopIds: [1, 106] });
      let text = "";
      for (const id of [...ids, ...extra]) {
        text += s.push(id);
        if (s.stopped) break;
      }
      text += s.end();
      return { text, reason: s.finishReason };
    };
    expect(run(["User:"])).toEqual({ text: "The answer is 42.\n", reason: "stop_string" });
    expect(run(["swer is"])).toEqual({ text: "The an", reason: "stop_string" });
    expect(run([])).toEqual({ text: "The answer is 42.\nUser: more", reason: "length" });
    const cut = tok.encode("Hi there");
    const s = new TextStream((x) => tok.decode(x), { stopIds: [106] });
    const text = [...cut, 106, ...cut].map((id) => s.push(id)).join("") + s.end();
    expect(text).toBe("Hi there");
    expect(s.finishReason).toBe("stop_token");
  });
});

describe("long texts", () => {
  it("maxTokenChars bounds what one token covers (Gemma's longest piece is 31 newlines)", () => {
    expect(tok.maxTokenChars).toBe(31);
    for (const text of [...SAMPLES, "\n".repeat(200), " ".repeat(200), "a".repeat(500)]) {
      expect(tok.encode(text).length * tok.maxTokenChars).toBeGreaterThanOrEqual(text.length);
    }
    expect(tok.maxCharsFor(100)).toBe(100 * 31 * 2);
  });

  it("encodeAsync tokenizes a long text on a worker thread, to the same ids, without blocking", async () => {
    const text = SAMPLES.join("\n").repeat(400); // ~60,000 characters
    let ticks = 0;
    let worstGapMs = 0;
    const start = performance.now();
    let last = start;
    const timer = setInterval(() => {
      const now = performance.now();
      worstGapMs = Math.max(worstGapMs, now - last);
      last = now;
      ticks++;
    }, 5);
    let waitMs: number | undefined;
    let inlineMs: number | undefined;
    try {
      const ids = await tok.encodeAsync(text, { addBos: true });
      waitMs = performance.now() - start;
      clearInterval(timer);
      const inlineStart = performance.now();
      const inline = tok.encode(text, { addBos: true });
      inlineMs = performance.now() - inlineStart;
      expect(ids).toEqual(inline);
    } finally {
      clearInterval(timer);
      await tok.close();
    }
    expect(ticks).toBeGreaterThan(5);
    // Encoding on the event loop would stall the timer for about the inline encode's time. A
    // loaded machine also delays timers, so the bound scales with the work: the worst stall must
    // stay well under the inline encode (and under the whole wait), never under a fixed few ms.
    expect(worstGapMs).toBeLessThan(Math.max(100, 0.5 * (inlineMs ?? 0), 0.5 * (waitMs ?? 0)));
  }, 60_000);
});
