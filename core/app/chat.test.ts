/**
 * ChatManager with a scripted engine (the controller tests cover it with the real one): what the
 * generation loop's results become in the app's messages and events.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadTokenizer, type ChatTokenizer } from "../chat/tokenizer.ts";
import type { GenerateEvent, GenerateParams } from "../engine/protocol.ts";
import { EngineQueue } from "../server/queue.ts";
import { gemma3TokenizerFiles } from "../models/gemma3.ts";
import { DEFAULT_SETTINGS, type AppEvent, type Message, type Settings } from "./api.ts";
import { ChatManager } from "./chat.ts";
import { ConversationStore } from "./conversations.ts";
import type { EngineManager } from "./engine.ts";
import { HitRateBook } from "./memory.ts";

let tok: ChatTokenizer;
let dir: string;
beforeAll(async () => {
  tok = await loadTokenizer(dirname(gemma3TokenizerFiles().tokenizer));
  dir = await mkdtemp(join(tmpdir(), "redwing-chat-manager-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** An engine manager whose engine streams `reply`'s tokens one at a time until cancelled. */
function scriptedEngine(reply: string, seen: GenerateParams[]): EngineManager {
  const ids = tok.encode(reply);
  const client = {
    async *generate(
      params: GenerateParams,
      options: { signal?: AbortSignal } = {},
    ): AsyncIterable<GenerateEvent> {
      seen.push(params);
      let n = 0;
      for (const id of ids) {
        if (options.signal?.aborted) break;
        n++;
        yield { type: "tokens", id: 1, tokens: [id] };
        await new Promise((r) => setImmediate(r));
      }
      yield {
        type: "finished",
        id: 1,
        reason: options.signal?.aborted ? "cancelled" : "length",
        tokens: ids.slice(0, n),
        prompt_tokens: params.tokens.length,
        cached_tokens: 0,
        prefill_tokens: params.tokens.length,
        timings: {
          prefill_seconds: 0.1,
          ttft_seconds: 0.1,
          decode_seconds: 0.5,
          prefill_tokens_per_second: 10,
          decode_tokens_per_second: 10,
        },
      };
    },
  };
  const fake = {
    queue: new EngineQueue(4),
    loaded: { name: "scripted" },
    status: () => ({ model: "scripted" }),
    settled: async () => undefined,
    stats: async () => null,
    requireLoaded: () => ({
      client,
      model: {
        name: "scripted",
        tokenizer: tok,
        template: "{% for m in messages %}{{ m.content }}\n{% endfor %}",
        stopIds: [1],
        settings: DEFAULT_SETTINGS.engine,
        ready: { expert_cache_slots: 0 },
      },
    }),
  };
  return fake as unknown as EngineManager;
}

async function replyTo(
  content: string,
  reply: string,
  sampling: Partial<Settings["sampling"]>,
): Promise<{ message: Message; deltas: string[]; params: GenerateParams[] }> {
  const events: AppEvent[] = [];
  const params: GenerateParams[] = [];
  const store = new ConversationStore(dir);
  const settings: Settings = {
    ...DEFAULT_SETTINGS,
    sampling: { ...DEFAULT_SETTINGS.sampling, ...sampling },
  };
  let done!: (m: Message) => void;
  const finished = new Promise<Message>((resolve) => (done = resolve));
  const chat = new ChatManager({
    engine: scriptedEngine(reply, params),
    store,
    settings: () => settings,
    emit: (e) => {
      events.push(e);
      if (e.type === "chat.done") done(e.message);
    },
    onConversations: () => undefined,
    hitRates: new HitRateBook(),
  });
  const c = await store.create();
  await chat.send(c.id, content);
  const message = await finished;
  const deltas = events.flatMap((e) => (e.type === "chat.delta" ? [e.text] : []));
  return { message, deltas, params };
}

describe("ChatManager replies", () => {
  it("honours the settings' stop strings: the reply ends before one, never showing it", async () => {
    const { message, deltas, params } = await replyTo("Count", "one two three four five six", {
      stop: ["three"],
    });
    expect(message.content).toBe("one two ");
    expect(message.finishReason).toBe("stop");
    expect(deltas.join("")).toBe("one two ");
    expect(params[0]!.max_new_tokens).toBe(DEFAULT_SETTINGS.sampling.maxNewTokens);
  });

  it("without stop strings the whole reply is kept, with its statistics line", async () => {
    const { message, params } = await replyTo("Count", "one two three four", {
      temperature: 0.7,
      topK: 5,
      seed: 3,
    });
    expect(message.content).toBe("one two three four");
    expect(message.finishReason).toBe("length");
    expect(message.stats?.line).toMatch(/t\/s, TTFT: 100\.0ms/);
    expect(params[0]!.sampling).toEqual({
      temperature: 0.7,
      top_k: 5,
      top_p: DEFAULT_SETTINGS.sampling.topP,
      repetition_penalty: DEFAULT_SETTINGS.sampling.repetitionPenalty,
      seed: 3,
    });
  });
});
