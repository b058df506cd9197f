/**
 * Conversation search (core/app/conversation-search.ts) at the size the app is meant to stay quick for: 1,000
 * conversations of 20 messages (user messages of 25 words, replies of 150, English and
 * Ukrainian words), indexed, then each query run 20 times (after 3 warm-ups); the median time
 * per query. Typing costs one such query per pause.
 *
 *   npm run bench -- search      or      npx tsx bench/conversation-search.ts
 */
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { Conversation, Message } from "../core/app/api.ts";
import { SearchIndex } from "../core/app/conversation-search.ts";
import { writeResult } from "./stats.ts";

const WORDS = (
  "the of and to in is you that it he was for on are as with his they at be this have from or " +
  "one had by word but not what all were we when your can said there use each which she do how " +
  "their if will up other about out many then them these so some her would make like him into " +
  "time has look two more write go see number no way could people my than first water been call " +
  "who oil now find long down day did get come made may part café добрий вечір україна м’ята її"
).split(" ");
const QUERIES = ["cafe", "ДОБРИЙ вечір", "water people", "th", "zzzz"];

export async function runConversationSearchBench(): Promise<unknown> {
  let seed = 1;
  const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const text = (n: number) =>
    Array.from({ length: n }, () => WORDS[Math.floor(random() * WORDS.length)]).join(" ");
  const conversations: Conversation[] = Array.from({ length: 1000 }, (_, c) => ({
    id: `c${c}`,
    format: 2 as const,
    title: text(6),
    systemPrompt: "",
    createdAt: "2026-01-01T00:00:00.000Z",
    updatedAt: new Date(1e12 + c * 1000).toISOString(),
    messages: Array.from({ length: 20 }, (_, i): Message => ({
      id: `c${c}m${i}`,
      role: i % 2 === 0 ? "user" : "assistant",
      content: text(i % 2 === 0 ? 25 : 150),
      createdAt: "2026-01-01T00:00:00.000Z",
    })),
  }));
  const index = new SearchIndex();
  let t0 = performance.now();
  for (const c of conversations) index.set(c);
  const indexMs = performance.now() - t0;
  // The first search folds every message (kept for the next ones).
  t0 = performance.now();
  index.search("first");
  const firstSearchMs = performance.now() - t0;
  console.log(
    `1000 conversations x 20 messages: indexed in ${indexMs.toFixed(0)} ms, first search (folds the text) ${firstSearchMs.toFixed(0)} ms`,
  );
  const rows: { query: string; medianMs: number; hits: number }[] = [];
  for (const query of QUERIES) {
    for (let w = 0; w < 3; w++) index.search(query);
    const times: number[] = [];
    let hits = 0;
    for (let r = 0; r < 20; r++) {
      t0 = performance.now();
      hits = index.search(query).length;
      times.push(performance.now() - t0);
    }
    const medianMs = times.sort((a, b) => a - b)[10]!;
    rows.push({ query, medianMs, hits });
    console.log(`  ${JSON.stringify(query)}: ${medianMs.toFixed(2)} ms, ${hits} hits`);
  }
  const result = { conversations: 1000, messagesEach: 20, indexMs, firstSearchMs, rows };
  await writeResult("conversation-search", result);
  return result;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await runConversationSearchBench();
}
