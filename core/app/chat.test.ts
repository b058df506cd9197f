/**
 * ChatManager with a scripted engine (the controller tests cover it with the real one): what the
 * generation loop's results become in the app's messages and events.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadTokenizer, type ChatTokenizer } from "../chat/tokenizer.ts";
import type { GenerateParams } from "../engine/protocol.ts";
import { gemma3TokenizerFiles } from "../models/gemma3.ts";
import { DEFAULT_SETTINGS, type AppEvent, type Message, type Settings } from "./api.ts";
import { ChatManager } from "./chat.ts";
import { ConversationStore } from "./conversations.ts";
import type { EngineManager } from "./engine.ts";
import { HitRateBook } from "./memory.ts";
import { finishedEvent, scriptedEngineManager } from "../../testkit/scripted-engine.ts";

let tok: ChatTokenizer;
let dir: string;
beforeAll(async () => {
  tok = await loadTokenizer(dirname(gemma3TokenizerFiles().tokenizer));
  dir = await mkdtemp(join(tmpdir(), "redwing-chat-manager-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/**
 * An engine manager whose engine streams `reply`'s tokens one at a time until cancelled or
 * `max_new_tokens` are out (`endless`: the reply's tokens over and over); the model's context is
 * `context`.
 */
function scriptedEngine(
  reply: string,
  seen: GenerateParams[],
  { endless = false, context = DEFAULT_SETTINGS.engine.context } = {},
): EngineManager {
  const ids = tok.encode(reply);
  const template = "{% for m in messages %}{{ m.content }}\n{% endfor %}";
  return scriptedEngineManager(
    { tokenizer: tok, template, context },
    async function* (params, options) {
      seen.push(params);
      const maxNew = params.max_new_tokens ?? Infinity;
      expect(params.tokens.length + maxNew).toBeLessThanOrEqual(context);
      const out: number[] = [];
      while (out.length < maxNew && (endless || out.length < ids.length)) {
        if (options.signal?.aborted) break;
        out.push(ids[out.length % ids.length]!);
        yield { type: "tokens", id: 1, tokens: [out.at(-1)!] };
        await new Promise((r) => setImmediate(r));
      }
      yield finishedEvent(params, out, options.signal?.aborted ? "cancelled" : "length");
    },
  );
}

async function replyTo(
  content: string,
  reply: string,
  sampling: Partial<Settings["sampling"]>,
  options: {
    earlier?: { role: "user" | "assistant"; content: string }[];
    policy?: Settings["engine"]["contextOverflow"];
    endless?: boolean;
    context?: number;
  } = {},
): Promise<{ message: Message; deltas: string[]; params: GenerateParams[] }> {
  const events: AppEvent[] = [];
  const params: GenerateParams[] = [];
  const store = new ConversationStore(dir);
  const settings: Settings = {
    ...DEFAULT_SETTINGS,
    sampling: { ...DEFAULT_SETTINGS.sampling, ...sampling },
    engine: {
      ...DEFAULT_SETTINGS.engine,
      contextOverflow: options.policy ?? DEFAULT_SETTINGS.engine.contextOverflow,
    },
  };
  let done!: (m: Message) => void;
  const finished = new Promise<Message>((resolve) => (done = resolve));
  const chat = new ChatManager({
    engine: scriptedEngine(reply, params, options),
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
  for (const m of options.earlier ?? []) {
    c.messages.push({ id: randomUUID(), createdAt: new Date().toISOString(), ...m });
  }
  await store.save(c);
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

  /** Eight earlier exchanges of about 40 tokens each: far more than a 256-token context. */
  const earlier = Array.from({ length: 8 }, (_, i) => [
    {
      role: "user" as const,
      content: `Question ${i}: ${"tell me about the river and the stone ".repeat(5)}`,
    },
    {
      role: "assistant" as const,
      content: `Answer ${i}: ${"the river runs past the stone ".repeat(5)}`,
    },
  ]).flat();

  it("rolling window: the context fills mid-reply, more is left out, the reply goes on into the same message", async () => {
    const { message, deltas, params } = await replyTo(
      "Go on",
      " and the light",
      { maxNewTokens: 150 },
      {
        earlier,
        endless: true,
        context: 256,
      },
    );
    expect(params.length).toBeGreaterThan(1);
    expect(message.finishReason).toBe("length");
    expect(message.stats?.generatedTokens).toBe(150);
    expect(message.content).toBe(deltas.join(""));
    expect(message.contextNote).toMatchObject({
      policy: "rolling_window",
      context: 256,
      continued: params.length - 1,
    });
    // Each later pass: the conversation rendered again with fewer earlier messages, the user's
    // message, then the reply written so far (this template: one message per line, no turn
    // markers), which grows from pass to pass.
    let before = 0;
    let dropped = 0;
    for (let i = 1; i < params.length; i++) {
      const prompt = tok.decode(params[i]!.tokens);
      const partial = prompt.slice(prompt.indexOf("Go on\n") + "Go on\n".length);
      expect(partial.length).toBeGreaterThan(before);
      expect(message.content.startsWith(partial)).toBe(true);
      before = partial.length;
      const left = (prompt.match(/Question \d/g) ?? []).length;
      expect(16 - 2 * left).toBeGreaterThan(dropped);
      dropped = 16 - 2 * left;
    }
    expect(message.contextNote?.droppedMessages).toBe(dropped);
  });

  it("stop: the reply that fills the context ends as context_full with its note, in one pass", async () => {
    const { message, params } = await replyTo(
      "Go on",
      " and the light",
      { maxNewTokens: 300 },
      {
        earlier: earlier.slice(0, 4),
        endless: true,
        context: 256,
        policy: "stop",
      },
    );
    expect(params.length).toBe(1);
    expect(params[0]!.tokens.length + params[0]!.max_new_tokens!).toBe(256);
    expect(message.finishReason).toBe("context_full");
    expect(message.contextNote).toMatchObject({ policy: "stop", droppedMessages: 0, context: 256 });
  });

  it("stop: a conversation longer than the context is refused with the fix, nothing generated", async () => {
    const { message, params } = await replyTo(
      "Go on",
      "x",
      {},
      { earlier, context: 256, policy: "stop" },
    );
    expect(params.length).toBe(0);
    expect(message.finishReason).toBe("error");
    expect(message.error).toMatchObject({ code: "context_overflow", action: "apply_fix" });
    expect(message.error?.fix?.label).toMatch(/^Raise context to \d/);
  });

  it("truncate middle: the first exchange stays, a note counts what was left out", async () => {
    const { message, params } = await replyTo(
      "Go on",
      " done",
      {},
      {
        earlier,
        context: 256,
        policy: "truncate_middle",
      },
    );
    const prompt = tok.decode(params[0]!.tokens);
    expect(prompt).toContain("Question 0:");
    expect(prompt).not.toContain("Question 1:");
    expect(message.finishReason).toBe("length");
    expect(message.contextNote?.droppedMessages).toBeGreaterThan(0);
    expect(message.contextNote?.droppedTokens).toBeGreaterThan(0);
  });
});
