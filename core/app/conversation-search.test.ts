/** Conversation search: folding, snippets with highlights, the in-memory index and its updates. */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { Conversation, SearchHit } from "./api.ts";
import { ConversationStore } from "./conversations.ts";
import {
  fold,
  foldWithOffsets,
  queryTerms,
  SearchIndex,
  snippetOf,
} from "./conversation-search.ts";

function conversation(
  id: string,
  title: string,
  texts: string[],
  updatedAt = "2026-01-01T00:00:00.000Z",
): Conversation {
  return {
    id,
    format: 2,
    title,
    systemPrompt: "",
    createdAt: "2026-01-01T00:00:00.000Z",
    updatedAt,
    messages: texts.map((content, i) => ({
      id: `${id}-m${i}`,
      role: i % 2 === 0 ? "user" : "assistant",
      content,
      createdAt: "2026-01-01T00:00:00.000Z",
    })),
  };
}

/** The highlighted pieces of a hit's snippet. */
function marked(hit: SearchHit): string[] {
  return hit.highlights.map(([a, b]) => hit.snippet.slice(a, b));
}

describe("fold", () => {
  it("drops case and diacritics in Latin, Cyrillic and Greek; unifies apostrophes", () => {
    expect(fold("Café CRÈME Ångström")).toBe("cafe creme angstrom");
    expect(fold("ДОБРИЙ ВЕЧІР, Україно")).toBe(fold("добрии вечір, україно"));
    expect(fold("її")).toBe("іі");
    expect(fold("ΟΔΟΣ")).toBe(fold("οδος")); // final sigma
    expect(fold("м’ята")).toBe(fold("м'ята"));
    expect(fold("мʼята")).toBe("м'ята");
    expect(fold("İstanbul")).toBe("istanbul");
  });

  it("folding one code point at a time gives the same text, with offsets into the original", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme", maxLength: 40 }), (text) => {
        const { folded, start, end } = foldWithOffsets(text);
        expect(folded).toBe(fold(text));
        expect(start.length).toBe(folded.length);
        for (let j = 0; j < folded.length; j++) {
          // Each folded character comes from the code point at [start, end), folding to it.
          expect(fold(text.slice(start[j]!, end[j]!))).toContain(folded[j]!);
        }
      }),
      { numRuns: 300 },
    );
  });

  it("a query is its distinct folded words", () => {
    expect(queryTerms("  Лісабон  ЛІСАБОН trip ")).toEqual(["лісабон", "trip"]);
    expect(queryTerms(" \n ")).toEqual([]);
  });
});

describe("snippetOf", () => {
  it("cuts around the first match at words and highlights every match in the original spelling", () => {
    const text = `${"Lorem ipsum dolor sit amet. ".repeat(5)}We met at the Café Lisboa, a café\nby the river. ${"More words follow here. ".repeat(10)}`;
    const { snippet, highlights } = snippetOf(text, ["cafe"]);
    expect(snippet.startsWith("…")).toBe(true);
    expect(snippet.endsWith("…")).toBe(true);
    expect(snippet).not.toContain("\n");
    expect(highlights.map(([a, b]) => snippet.slice(a, b))).toEqual(["Café", "café"]);
    // Cut at spaces: no half words at the edges.
    expect(snippet).toMatch(/^…\S+ /);
    expect(snippet.length).toBeLessThan(200);
  });

  it("maps offsets through decomposed input and astral characters", () => {
    const text = "😀 cafe\u0301 and CAFÉ";
    const { snippet, highlights } = snippetOf(text, ["cafe"]);
    expect(snippet).toBe(text);
    expect(highlights.map(([a, b]) => snippet.slice(a, b))).toEqual(["cafe\u0301", "CAFÉ"]);
  });

  it("overlapping words are one mark", () => {
    const { snippet, highlights } = snippetOf("Привітання", ["прив", "віт"]);
    expect(highlights.map(([a, b]) => snippet.slice(a, b))).toEqual(["Привіт"]);
  });
});

describe("SearchIndex", () => {
  it("finds every word in one title or message, title hits first, then pinned, then recent", () => {
    const index = new SearchIndex();
    index.set(
      conversation(
        "old",
        "Trip planning",
        ["Plan a trip to Lisbon", "Lisbon in May is lovely"],
        "2026-01-01T00:00:00.000Z",
      ),
    );
    index.set(
      conversation(
        "new",
        "Cooking",
        ["How long to boil an egg?", "A Lisbon trip? Nine minutes."],
        "2026-02-01T00:00:00.000Z",
      ),
    );
    index.set({
      ...conversation("pinned", "Notes", ["lisbon TRIP list"], "2025-01-01T00:00:00.000Z"),
      pinned: true,
    });
    index.set(conversation("lisbon", "Lisbon trip photos", [], "2024-01-01T00:00:00.000Z"));

    const hits = index.search("lisbon trip");
    expect(hits.map((h) => [h.conversationId, h.messageId])).toEqual([
      ["lisbon", null], // the title
      ["pinned", "pinned-m0"],
      ["new", "new-m1"],
      ["old", "old-m0"], // "Lisbon in May is lovely" lacks "trip"
    ]);
    expect(marked(hits[0]!)).toEqual(["Lisbon", "trip"]);
    expect(marked(hits[2]!)).toEqual(["Lisbon", "trip"]);
    expect(hits[2]).toMatchObject({ role: "assistant", title: "Cooking", pinned: false });
    expect(index.search("   ")).toEqual([]);
    expect(index.search("lisbon", 2)).toHaveLength(2);
  });

  it("Ukrainian: any case, with or without diacritics and apostrophe kinds", () => {
    const index = new SearchIndex();
    index.set(conversation("uk", "Розмова", ["Добрий вечір! Де моя м’ята та її чай?"]));
    for (const query of [
      "ДОБРИЙ",
      "добрии",
      "моя м'ята",
      "іі чай" /* Cyrillic і, no diaeresis */,
      "ВЕЧІР",
    ]) {
      expect(
        index.search(query).map((h) => h.messageId),
        query,
      ).toEqual(["uk-m0"]);
    }
    expect(marked(index.search("іі")[0]!)).toEqual(["її"]);
    expect(index.search("кава")).toEqual([]);
  });

  it("follows changes: a replaced text, a new title and a deleted conversation", () => {
    const index = new SearchIndex();
    const c = conversation("c", "First", ["apples"]);
    index.set(c);
    expect(index.search("apples")).toHaveLength(1);
    index.set({ ...c, title: "Pears", messages: [{ ...c.messages[0]!, content: "pears" }] });
    expect(index.search("apples")).toEqual([]);
    expect(index.search("pears").map((h) => h.messageId)).toEqual([null, "c-m0"]);
    index.delete("c");
    expect(index.search("pears")).toEqual([]);
  });

  it("keeps at most three message hits per conversation", () => {
    const index = new SearchIndex();
    index.set(conversation("many", "x", ["echo", "echo", "echo", "echo", "echo"]));
    expect(index.search("echo")).toHaveLength(3);
  });
});

describe("ConversationStore.search", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "redwing-search-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("indexes the conversations on disk at start and each save and delete after", async () => {
    const first = new ConversationStore(dir);
    const c = await first.create("Garden");
    c.messages.push({
      id: "m1",
      role: "user",
      content: "Tomatoes need sun",
      createdAt: c.createdAt,
    });
    await first.save(c);

    const store = new ConversationStore(dir); // reads the files once
    expect((await store.search("TOMATOES")).map((h) => h.messageId)).toEqual(["m1"]);
    const again = await store.get(c.id);
    again.messages[0]!.content = "Cucumbers need water";
    await store.save(again);
    expect(await store.search("tomatoes")).toEqual([]);
    expect((await store.search("cucumbers")).map((h) => h.conversationId)).toEqual([c.id]);
    await store.delete(c.id);
    expect(await store.search("cucumbers")).toEqual([]);
  });
});
