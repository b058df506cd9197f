/**
 * Expert-cache policies on real routing: the demo model (demo-model/, a trained Gemma 4 MoE with
 * 32 experts per layer, top 4) is run by `redwing-engine` with `--record-routing` on
 *   - held-out text: demo-model/heldout.txt, one window (every token routed once, as in decode)
 *   - chats: greedy replies to the demo's prompts, one after another, prompt rows then replies
 * and the recorded routing is replayed through a per-layer cache simulation (cache-policy-sim.ts)
 * for LFU, LRU, LRFU at a few half-lives and Belady's offline optimum, against a uniform random
 * trace of the same shape (what a random-weight model's router gives).
 *
 *   npm run bench -- cache-policy        (or: node --import tsx bench/cache-policy.ts)
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { loadChatTemplate, renderChat } from "../core/chat/template.ts";
import { loadTokenizer } from "../core/chat/tokenizer.ts";
import { demoRecipeFile, shippedDemoDir } from "../core/demo/demo.ts";
import { captureOutput, nativeBinary } from "../core/native.ts";
import {
  hitRate,
  parseTrace,
  policyName,
  uniformTrace,
  type Policy,
  type Trace,
} from "./cache-policy-sim.ts";
import { writeResult } from "./stats.ts";

const CHAT_PROMPTS = [
  "Quote Genesis 1:3",
  "Tell me a fortune about cats",
  "Continue: And God said",
  "Quote John 3:16",
  "Tell me a fortune about computers",
  "Quote Psalms 23:1",
  "Continue: In the beginning",
  "Tell me a fortune",
  "What does Exodus 20:13 say?",
  "Tell me a fortune about love",
  "Continue: The LORD is my shepherd",
  "Give me a fortune about work",
];

export const POLICIES: Policy[] = [
  { kind: "lfu" },
  { kind: "lru" },
  { kind: "lrfu", halfLife: 4 },
  { kind: "lrfu", halfLife: 16 },
  { kind: "lrfu", halfLife: 64 },
  { kind: "belady" },
];
const SLOTS = [4, 6, 8, 12, 16, 20, 24];

async function record(args: string[]): Promise<Trace> {
  const dir = mkdtempSync(join(tmpdir(), "redwing-routing-"));
  try {
    const file = join(dir, "routing.txt");
    await captureOutput([nativeBinary("redwing-engine"), ...args, "--record-routing", file]);
    return parseTrace(readFileSync(file, "utf8"));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function concat(traces: Trace[]): Trace {
  const out: Trace = new Map();
  for (const t of traces) {
    for (const [layer, rows] of t) out.set(layer, [...(out.get(layer) ?? []), ...rows]);
  }
  return out;
}

export async function runCachePolicyBench(): Promise<unknown> {
  const model = shippedDemoDir();
  const tok = await loadTokenizer(model);
  const template = await loadChatTemplate(model, tok.configTemplate, "gemma4");
  const common = ["--model", model, "--threads", "2", "--kv-dtype", "f32"];

  // Held-out text: one window over all of it, so every token is routed exactly once.
  const heldIds = tok.encode(readFileSync(demoRecipeFile("heldout.txt"), "utf8"), {
    addBos: true,
  });
  const tmp = mkdtempSync(join(tmpdir(), "redwing-cache-policy-"));
  let heldout: Trace;
  try {
    const idsFile = join(tmp, "ids.txt");
    writeFileSync(idsFile, heldIds.join(","));
    heldout = await record([
      "perplexity",
      ...common,
      "--tokens-file",
      idsFile,
      "--window",
      String(heldIds.length + 1),
      "--stride",
      String(heldIds.length),
    ]);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }

  const chats: Trace[] = [];
  for (const prompt of CHAT_PROMPTS) {
    const ids = tok.encode(
      renderChat(template, [{ role: "user", content: prompt }], { bosToken: tok.bosToken }),
    );
    chats.push(
      await record([
        "generate",
        ...common,
        "--tokens",
        ids.join(","),
        "--max-new",
        "64",
        "--temperature",
        "0",
      ]),
    );
  }
  const chat = concat(chats);
  const numExperts = 32;
  const traces: [string, Trace][] = [
    ["held-out text", heldout],
    ["chats", chat],
    ["uniform (synthetic)", uniformTrace(concat([heldout, chat]), numExperts, 16)],
  ];

  const table: { trace: string; rows: number; slots: number; hitRate: Record<string, number> }[] =
    [];
  for (const [name, trace] of traces) {
    const rows = trace.get(0)?.length ?? 0;
    for (const slots of SLOTS) {
      const rates: Record<string, number> = {};
      for (const p of POLICIES) rates[policyName(p)] = hitRate(trace, slots, p);
      table.push({ trace: name, rows, slots, hitRate: rates });
    }
  }

  const names = POLICIES.map(policyName);
  const lines = [
    `| trace (rows per layer) | slots | ${names.join(" | ")} |`,
    `|---|---:|${names.map(() => "---:").join("|")}|`,
    ...table.map(
      (r) =>
        `| ${r.trace} (${r.rows}) | ${r.slots} | ${names.map((n) => (100 * r.hitRate[n]!).toFixed(1)).join(" | ")} |`,
    ),
  ];
  console.log("Expert cache hit rate (%) by slots per layer (32 experts, top 4), demo model\n");
  console.log(lines.join("\n"));
  const out = await writeResult("cache-policy", { policies: names, table });
  console.log(`\nwrote ${out}`);
  return table;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  await runCachePolicyBench();
}
