/**
 * Conversation search: titles and the text of the messages shown, case- and diacritics-
 * insensitive ("cafe" finds "Café", "ДОБРИЙ" finds "добрий", "іі" finds "її"), every word of the
 * query in the same title or message, in any order. The index keeps each conversation's text
 * folded (see `fold`; each message on the first search that reaches it) in memory and is
 * updated when a conversation is saved or deleted, so a keystroke costs one substring scan of
 * the folded text, never a file read. A hit carries a
 * snippet of the original text around the first match with every match in it highlighted.
 *
 * Substring matching, not word tokens: a word typed half-way already finds ("прив" finds
 * "Привіт"), and it works the same in every script without a stemmer per language.
 */
import type { Conversation, SearchHit } from "./api.ts";

export type { SearchHit };

const MARKS = /\p{M}/gu;
/** Nothing beyond ASCII (space to DEL, tabs and line breaks): folding is lower case alone. */
const ASCII = /^[\t\n\r\x20-\x7f]*$/;
/** Apostrophes users type interchangeably (Ukrainian: ’ ʼ '), and typographic quotes. */
const APOSTROPHES = /[\u2018\u2019\u02BC\u0060\u00B4]/g;

/**
 * The form both text and query are compared in: canonical decomposition with the marks dropped
 * (é → e, й → и, ї → і), lower case, one final sigma, one apostrophe.
 */
export function fold(text: string): string {
  // Most text is ASCII: lower case is all there is to do (the Unicode passes cost ~10x more).
  if (ASCII.test(text)) return text.toLowerCase().replace(/`/g, "'");
  return text
    .normalize("NFD")
    .toLowerCase()
    .replace(MARKS, "")
    .replace(/ς/g, "σ")
    .replace(APOSTROPHES, "'");
}

/**
 * `fold(text)` with, for each folded character, the range of the original text it came from
 * (`fold` works one code point at a time, so folding each one gives the same string).
 */
export function foldWithOffsets(text: string): {
  folded: string;
  start: Int32Array;
  end: Int32Array;
} {
  const pieces: string[] = [];
  const start = new Int32Array(text.length);
  const end = new Int32Array(text.length);
  let n = 0;
  for (let i = 0; i < text.length;) {
    const code = text.codePointAt(i)!;
    const width = code > 0xffff ? 2 : 1;
    let f: string;
    if (code < 0x80) {
      f = code >= 65 && code <= 90 ? String.fromCharCode(code + 32) : text[i]!;
      if (code === 0x60) f = "'";
    } else {
      f = fold(text.slice(i, i + width));
    }
    for (let k = 0; k < f.length; k++) {
      // Folding never lengthens much (a few letters lower-case to two); grow when it does.
      if (n >= start.length) return foldWithOffsetsSlow(text);
      start[n] = i;
      end[n] = i + width;
      n++;
    }
    pieces.push(f);
    i += width;
  }
  return { folded: pieces.join(""), start: start.subarray(0, n), end: end.subarray(0, n) };
}

/** The same with plain arrays, for text whose folded form is longer than the original. */
function foldWithOffsetsSlow(text: string): { folded: string; start: Int32Array; end: Int32Array } {
  const pieces: string[] = [];
  const start: number[] = [];
  const end: number[] = [];
  for (let i = 0; i < text.length;) {
    const width = text.codePointAt(i)! > 0xffff ? 2 : 1;
    const f = fold(text.slice(i, i + width));
    for (let k = 0; k < f.length; k++) {
      start.push(i);
      end.push(i + width);
    }
    pieces.push(f);
    i += width;
  }
  return { folded: pieces.join(""), start: Int32Array.from(start), end: Int32Array.from(end) };
}

/** The words of a query, folded; empty when there is nothing to look for. */
export function queryTerms(query: string): string[] {
  return [
    ...new Set(
      fold(query)
        .split(/\s+/u)
        .filter((t) => t !== ""),
    ),
  ];
}

/** `end` moved past the combining marks that follow it (they fold to nothing). */
function withMarks(text: string, end: number): number {
  while (end < text.length && /\p{M}/u.test(text[end]!)) end++;
  return end;
}

/** Characters of context before and after the first match in a snippet. */
const BEFORE = 40;
const AFTER = 120;
/** Message hits per conversation (its title is one more). */
const HITS_PER_CONVERSATION = 3;
export const DEFAULT_SEARCH_LIMIT = 50;

/**
 * A snippet of `text` around the first match of `terms[0]`, every match of every term in it
 * highlighted (`[start, end)` in the snippet). Line breaks become spaces; "…" marks a cut.
 */
export function snippetOf(
  text: string,
  terms: string[],
  whole = false,
): { snippet: string; highlights: [number, number][] } {
  const { folded, start, end } = foldWithOffsets(text);
  const ranges: [number, number][] = [];
  for (const term of terms) {
    for (let at = folded.indexOf(term); at !== -1; at = folded.indexOf(term, at + term.length)) {
      ranges.push([start[at]!, withMarks(text, end[at + term.length - 1]!)]);
    }
  }
  ranges.sort((a, b) => a[0] - b[0] || b[1] - a[1]);
  const first = terms.length > 0 ? folded.indexOf(terms[0]!) : -1;
  let from = 0;
  let to = text.length;
  if (!whole && first !== -1) {
    from = Math.max(0, start[first]! - BEFORE);
    to = Math.min(text.length, end[first + terms[0]!.length - 1]! + AFTER);
    // Cut at a word where one is near.
    if (from > 0) {
      const space = text.slice(from, start[first]).search(/\s/u);
      if (space !== -1 && space < BEFORE / 2) from += space + 1;
    }
    if (to < text.length) {
      const space = text.slice(0, to).search(/\s\S*$/u);
      if (space > end[first]! && to - space < AFTER / 2) to = space;
    }
  } else if (!whole) {
    to = Math.min(text.length, BEFORE + AFTER);
  }
  const prefix = from > 0 ? "…" : "";
  const snippet =
    prefix + text.slice(from, to).replace(/\s/gu, " ") + (to < text.length ? "…" : "");
  const highlights: [number, number][] = [];
  for (const [s, e] of ranges) {
    if (s < from || e > to) continue;
    const last = highlights.at(-1);
    const a = s - from + prefix.length;
    const b = e - from + prefix.length;
    if (last && a <= last[1])
      last[1] = Math.max(last[1], b); // overlapping terms: one mark
    else highlights.push([a, b]);
  }
  return { snippet, highlights };
}

/** A message and, once a search has needed it, its folded text. */
class IndexedMessage {
  private foldedText: string | null = null;
  constructor(
    readonly id: string,
    readonly role: "user" | "assistant",
    readonly content: string,
  ) {}
  /** Folded on first use, so opening the app never waits for the index. */
  get folded(): string {
    return (this.foldedText ??= fold(this.content));
  }
}

interface IndexedConversation {
  id: string;
  title: string;
  titleFolded: string;
  updatedAt: string;
  pinned: boolean;
  messages: IndexedMessage[];
}

export class SearchIndex {
  private readonly entries = new Map<string, IndexedConversation>();

  /** Adds or replaces a conversation; unchanged messages keep their folded text. */
  set(c: Conversation): void {
    const old = new Map(this.entries.get(c.id)?.messages.map((m) => [m.id, m]));
    this.entries.set(c.id, {
      id: c.id,
      title: c.title,
      titleFolded: fold(c.title),
      updatedAt: c.updatedAt,
      pinned: c.pinned === true,
      messages: c.messages.map((m) => {
        const before = old.get(m.id);
        if (before && before.content === m.content) return before;
        return new IndexedMessage(m.id, m.role, m.content);
      }),
    });
  }

  delete(id: string): void {
    this.entries.delete(id);
  }

  /**
   * Conversations whose title matches come first, then the others; within each, pinned first,
   * then the most recent. A title hit has `messageId` null; up to 3 message hits per conversation.
   */
  search(query: string, limit = DEFAULT_SEARCH_LIMIT): SearchHit[] {
    const terms = queryTerms(query);
    if (terms.length === 0) return [];
    const has = (folded: string) => terms.every((t) => folded.includes(t));
    const found: { c: IndexedConversation; titled: boolean; messages: IndexedMessage[] }[] = [];
    for (const c of this.entries.values()) {
      const titled = has(c.titleFolded);
      const messages: IndexedMessage[] = [];
      for (const m of c.messages) {
        if (messages.length === HITS_PER_CONVERSATION) break;
        if (has(m.folded)) messages.push(m);
      }
      if (titled || messages.length > 0) found.push({ c, titled, messages });
    }
    found.sort(
      (a, b) =>
        Number(b.titled) - Number(a.titled) ||
        Number(b.c.pinned) - Number(a.c.pinned) ||
        b.c.updatedAt.localeCompare(a.c.updatedAt) ||
        a.c.id.localeCompare(b.c.id),
    );
    const hits: SearchHit[] = [];
    for (const { c, titled, messages } of found) {
      const base = {
        conversationId: c.id,
        title: c.title,
        updatedAt: c.updatedAt,
        pinned: c.pinned,
      };
      if (titled) {
        hits.push({ ...base, messageId: null, role: null, ...snippetOf(c.title, terms, true) });
      }
      for (const m of messages) {
        hits.push({ ...base, messageId: m.id, role: m.role, ...snippetOf(m.content, terms) });
      }
      if (hits.length >= limit) break;
    }
    return hits.slice(0, limit);
  }
}
