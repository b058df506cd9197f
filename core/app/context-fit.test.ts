/**
 * What a reply sends when the conversation outgrows the context, counted with the shipped demo
 * model's own tokenizer and chat template: every figure is checked against an independent
 * tokenization of the rendered prompt.
 */
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { ChatTemplate, loadChatTemplate, type ChatMessage } from "../chat/template.ts";
import { loadTokenizer, type ChatTokenizer } from "../chat/tokenizer.ts";
import { AppFailure } from "./errors.ts";
import { fitPrompt, promptTextFor, type FitRequest, type PromptText } from "./context-fit.ts";

const DEMO_DIR = join(import.meta.dirname, "../../demo-model/model");

let tok: ChatTokenizer;
let template: ChatTemplate;
let text: PromptText;
beforeAll(async () => {
  tok = await loadTokenizer(DEMO_DIR);
  const source = await loadChatTemplate(DEMO_DIR, tok.configTemplate, "gemma4");
  template = new ChatTemplate(source);
  text = promptTextFor(source, tok);
});

type Turn = { role: "user" | "assistant"; content: string };

/** The ids of a prompt, tokenized here independently of fitPrompt. */
function idsOf(system: string, messages: readonly Turn[], partial = ""): number[] {
  const all: ChatMessage[] = system ? [{ role: "system", content: system }] : [];
  const prompt =
    template.render([...all, ...messages], { bosToken: tok.bosToken, eosToken: tok.eosToken }) +
    partial;
  return tok.encode(prompt, { addBos: true });
}

/** A paragraph of about `words` words, distinct per `seed`. */
function words(seed: number, count: number): string {
  const pool = ["light", "water", "stone", "house", "river", "night", "field", "bread", "voice"];
  return Array.from({ length: count }, (_, i) => pool[(seed * 7 + i * 3) % pool.length]).join(" ");
}

/** `n` exchanges of ~`size` words each, then the question being answered. */
function conversation(n: number, size: number): Turn[] {
  const out: Turn[] = [];
  for (let i = 0; i < n; i++) {
    out.push({ role: "user", content: `Question ${i}: ${words(i, size)}` });
    out.push({ role: "assistant", content: `Answer ${i}: ${words(i + 50, size)}` });
  }
  out.push({ role: "user", content: "And the last question?" });
  return out;
}

function request(over: Partial<FitRequest>): FitRequest {
  return {
    policy: "rolling_window",
    model: "demo",
    systemPrompt: "You are a careful assistant.",
    history: conversation(8, 40),
    partial: "",
    context: 256,
    maxContext: 4096,
    replyRoom: 64,
    ...over,
  };
}

async function refusal(req: FitRequest): Promise<AppFailure> {
  const e = await fitPrompt(text, req).then(
    () => null,
    (error: unknown) => error,
  );
  expect(e).toBeInstanceOf(AppFailure);
  return e as AppFailure;
}

describe("fitPrompt", () => {
  it("sends the whole conversation, exactly as tokenized, when it fits (every policy)", async () => {
    const history = conversation(2, 10);
    for (const policy of ["stop", "rolling_window", "truncate_middle"] as const) {
      const r = await fitPrompt(text, request({ policy, history, context: 1024 }));
      expect(r).toEqual({
        tokens: idsOf("You are a careful assistant.", history),
        droppedExchanges: 0,
        droppedMessages: 0,
        droppedTokens: 0,
      });
    }
  });

  it("rolling window: leaves out the fewest oldest exchanges that make room, keeping the system prompt", async () => {
    const req = request({});
    const all = req.history;
    expect(idsOf(req.systemPrompt, all).length).toBeGreaterThan(256);
    const r = (await fitPrompt(text, req))!;
    const kept = all.slice(2 * r.droppedExchanges);
    expect(r.tokens).toEqual(idsOf(req.systemPrompt, kept));
    expect(r.tokens.length + 64).toBeLessThanOrEqual(256);
    // One exchange fewer left out would not leave the room: the fewest were dropped.
    const oneMore = all.slice(2 * (r.droppedExchanges - 1));
    expect(idsOf(req.systemPrompt, oneMore).length + 64).toBeGreaterThan(256);
    expect(r.droppedMessages).toBe(2 * r.droppedExchanges);
    const dropped = all.slice(0, 2 * r.droppedExchanges);
    expect(r.droppedTokens).toBe(dropped.reduce((sum, m) => sum + tok.encode(m.content).length, 0));
    expect(tok.decode(r.tokens)).toContain("You are a careful assistant.");
    expect(tok.decode(r.tokens)).toContain("And the last question?");
    expect(tok.decode(r.tokens)).not.toContain("Question 0:");
  });

  it("truncate middle: keeps the first exchange and leaves out the ones after it", async () => {
    const req = request({ policy: "truncate_middle" });
    const all = req.history;
    const r = (await fitPrompt(text, req))!;
    expect(r.droppedExchanges).toBeGreaterThan(0);
    const kept = [...all.slice(0, 2), ...all.slice(2 + 2 * r.droppedExchanges)];
    expect(r.tokens).toEqual(idsOf(req.systemPrompt, kept));
    expect(r.tokens.length + 64).toBeLessThanOrEqual(256);
    expect(tok.decode(r.tokens)).toContain("Question 0:");
    expect(tok.decode(r.tokens)).not.toContain("Question 1:");
  });

  it("truncate middle: the first exchange goes too when nothing else makes room", async () => {
    const history: Turn[] = [
      { role: "user", content: `First: ${words(1, 150)}` },
      { role: "assistant", content: "Noted." },
      { role: "user", content: "Second?" },
    ];
    const r = (await fitPrompt(text, request({ policy: "truncate_middle", history })))!;
    expect(r.droppedExchanges).toBe(1);
    expect(r.tokens).toEqual(idsOf("You are a careful assistant.", history.slice(2)));
  });

  it("stop: refuses with the numbers and a fix that raises the context to what fits", async () => {
    const req = request({ policy: "stop" });
    const n = idsOf(req.systemPrompt, req.history).length;
    const e = await refusal(req);
    const raised = Math.ceil((n + 64) / 256) * 256;
    expect(e.error).toMatchObject({
      code: "context_overflow",
      action: "apply_fix",
      fix: { label: `Raise context to ${raised.toLocaleString("en-US")}`, model: "demo" },
    });
    expect(e.error.fix!.engine.context).toBe(raised);
    expect(e.error.message).toContain(`This conversation is ${n.toLocaleString("en-US")} tokens`);
    expect(e.error.message).toContain("256-token context");
    expect(e.error.message).toContain("supports up to 4,096");
    expect(e.error.message).toMatch(/start a new chat/);
  });

  it("stop at the model's maximum: no raise, the button starts a new chat", async () => {
    const e = await refusal(request({ policy: "stop", maxContext: 256 }));
    expect(e.error.action).toBe("new_chat");
    expect(e.error.fix).toBeUndefined();
    expect(e.error.message).toContain("this model's maximum");
    expect(e.error.message).not.toMatch(/raise/i);
  });

  it("stop: a conversation that fits with little room goes, the reply gets what is left", async () => {
    const history = conversation(2, 30);
    const n = idsOf("You are a careful assistant.", history).length;
    const r = (await fitPrompt(text, request({ policy: "stop", history, context: n + 1 })))!;
    expect(r.tokens.length).toBe(n);
    expect(r.droppedMessages).toBe(0);
  });

  it("a system prompt alone bigger than the context: says so, whatever the policy", async () => {
    const systemPrompt = words(3, 400);
    for (const policy of ["rolling_window", "truncate_middle"] as const) {
      const e = await refusal(request({ policy, systemPrompt }));
      const alone = idsOf(systemPrompt, []).length;
      expect(e.error.message).toContain(
        `The system prompt alone is ${alone.toLocaleString("en-US")} tokens`,
      );
      expect(e.error.action).toBe("apply_fix");
    }
    const e = await refusal(request({ systemPrompt, maxContext: 256 }));
    expect(e.error.action).toBeNull();
    expect(e.error.message).toMatch(/Shorten it \(Chat, System prompt\)\.$/);
  });

  it("a message bigger than the context: refused with its count; an older one is left out", async () => {
    const big = `Long: ${words(9, 300)}`;
    const latest: Turn[] = [...conversation(1, 5).slice(0, 2), { role: "user", content: big }];
    const e = await refusal(request({ history: latest }));
    const n = idsOf("You are a careful assistant.", latest.slice(2)).length;
    expect(e.error.message).toContain(
      `Your message with the system prompt is ${n.toLocaleString("en-US")} tokens`,
    );
    expect(e.error.fix?.engine.context).toBe(Math.ceil((n + 64) / 256) * 256);

    // The same message earlier in the conversation is left out, with the exchanges before it.
    const older: Turn[] = [
      ...conversation(1, 5).slice(0, 2),
      { role: "user", content: big },
      { role: "assistant", content: "That was long." },
      { role: "user", content: "Short now." },
    ];
    const r = (await fitPrompt(text, request({ history: older })))!;
    expect(r.droppedExchanges).toBe(2);
    expect(r.tokens).toEqual(idsOf("You are a careful assistant.", older.slice(4)));
  });

  it("a message longer in characters than any context can hold is refused untokenized", async () => {
    const huge = "x".repeat(tok.maxCharsFor(4096) + 1);
    const seen: number[] = [];
    const counting: PromptText = {
      ...text,
      encode: (t, bos) => {
        seen.push(t.length);
        return text.encode(t, bos);
      },
    };
    const e = await fitPrompt(counting, request({ history: [{ role: "user", content: huge }] }))
      .then(() => null)
      .catch((error: AppFailure) => error);
    expect(e?.error.message).toContain(`${huge.length.toLocaleString("en-US")} characters`);
    expect(e?.error.action).toBeNull();
    expect(Math.max(0, ...seen)).toBeLessThan(huge.length);
  });

  it("an old message too long to count: the newer exchanges are still kept (no NaN estimate)", async () => {
    const huge = "y ".repeat(tok.maxCharsFor(256));
    const history: Turn[] = [
      { role: "user", content: huge },
      { role: "assistant", content: "ok" },
      ...conversation(2, 5),
    ];
    const r = (await fitPrompt(text, request({ history })))!;
    expect(r.droppedExchanges).toBe(1);
    expect(r.droppedTokens).toBeNull();
    expect(r.tokens).toEqual(idsOf("You are a careful assistant.", history.slice(2)));
  });

  it("continuation mid-reply: leaves out more and ends the prompt with the reply so far", async () => {
    const first = (await fitPrompt(text, request({})))!;
    const partial = ` ${words(5, 30)}`;
    const req = request({ partial, minDropped: first.droppedExchanges + 1 });
    const next = (await fitPrompt(text, req))!;
    expect(next.droppedExchanges).toBeGreaterThan(first.droppedExchanges);
    const kept = req.history.slice(2 * next.droppedExchanges);
    expect(next.tokens).toEqual(idsOf(req.systemPrompt, kept, partial));
    expect(tok.decode(next.tokens).endsWith(partial)).toBe(true);
    // Nothing left to leave out: the reply ends (the context is full).
    const exchanges = (req.history.length + 1) / 2;
    expect(await fitPrompt(text, { ...req, minDropped: exchanges })).toBeNull();
    // A reply so far that leaves no room at all ends it too.
    const long = ` ${words(6, 400)}`;
    expect(await fitPrompt(text, { ...req, partial: long })).toBeNull();
  });
});
