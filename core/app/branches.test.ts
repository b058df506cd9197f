/**
 * Branches: Regenerate of any reply and Edit of any user message keep the branch shown before
 * with everything after it; selectVersion switches branches; format-1 files migrate; the model
 * sees the branch shown (ChatManager with a scripted engine that records its prompts); pins.
 */
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { loadTokenizer, type ChatTokenizer } from "../chat/tokenizer.ts";
import { gemma3TokenizerFiles } from "../models/gemma3.ts";
import { ConversationSchema, DEFAULT_SETTINGS, type Conversation, type Message } from "./api.ts";
import { ChatManager } from "./chat.ts";
import {
  branchAt,
  ConversationStore,
  migrateConversation,
  replyVersions,
  switchBranch,
} from "./conversations.ts";
import type { EngineManager } from "./engine.ts";
import { HitRateBook } from "./memory.ts";
import { finishedEvent, scriptedEngineManager } from "../../testkit/scripted-engine.ts";

const T = "2026-01-01T00:00:00.000Z";
const user = (id: string, content: string): Message => ({
  id,
  role: "user",
  content,
  createdAt: T,
});
const reply = (id: string, content: string): Message => ({
  id,
  role: "assistant",
  content,
  createdAt: T,
  finishReason: "eos",
});
const texts = (ms: Message[]) => ms.map((m) => m.content);
/** A reply as format 1 kept it: shown `content`, and one earlier version beside it. */
const formatOneReply = (id: string, content: string, oldId: string, old: string): Message => ({
  ...reply(id, content),
  otherVersions: [{ id: oldId, content: old, createdAt: T }],
  versionIndex: 1,
});

let tok: ChatTokenizer;
let root: string;
let dir: string;
let n = 0;
beforeAll(async () => {
  tok = await loadTokenizer(dirname(gemma3TokenizerFiles().tokenizer));
  root = await mkdtemp(join(tmpdir(), "redwing-branches-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});
beforeEach(() => {
  dir = join(root, `store-${n++}`);
});

describe("branches of a conversation", () => {
  const base = [user("u1", "Q1"), reply("a1", "A1"), user("u2", "Q2"), reply("a2", "A2")];

  it("editing an earlier message starts a branch; switching back shows the old one whole", () => {
    const edited = branchAt(base, 0, user("u1b", "Q1 edited"));
    expect(texts(edited)).toEqual(["Q1 edited"]);
    expect(edited[0]).toMatchObject({ versionIndex: 1 });
    const answered = [...edited, reply("a1b", "A1b")];

    const back = switchBranch(answered, 0, 0);
    expect(texts(back)).toEqual(["Q1", "A1", "Q2", "A2"]);
    expect(back[0]).toMatchObject({ id: "u1", versionIndex: 0 });
    // ...and forward again: the new branch kept its own reply.
    const forward = switchBranch(back, 0, 1);
    expect(texts(forward)).toEqual(["Q1 edited", "A1b"]);
    expect(forward[0]!.otherVersions?.[0]?.after?.map((m) => m.id)).toEqual(["a1", "u2", "a2"]);
  });

  it("regenerating an earlier reply branches there; branches nest", () => {
    const regenerated = [...branchAt(base, 1, reply("a1b", "A1 again")), user("u3", "Q3")];
    expect(texts(regenerated)).toEqual(["Q1", "A1 again", "Q3"]);
    // A branch inside the new branch: edit Q3.
    const nested = [...branchAt(regenerated, 2, user("u3b", "Q3 edited")), reply("a3b", "A3b")];
    const outer = switchBranch(nested, 1, 0);
    expect(texts(outer)).toEqual(["Q1", "A1", "Q2", "A2"]);
    const inner = switchBranch(outer, 1, 1);
    expect(texts(inner)).toEqual(["Q1", "A1 again", "Q3 edited", "A3b"]);
    expect(texts(switchBranch(inner, 2, 0))).toEqual(["Q1", "A1 again", "Q3"]);
    expect(() => switchBranch(inner, 2, 2)).toThrow(/has no version 3; it has 2/);
    expect(ConversationSchema.safeParse({ ...conversation(inner) }).success).toBe(true);
  });

  it("a format-1 file migrates: each kept version gets a copy of the messages after it", () => {
    const v1: Conversation = {
      ...conversation([]),
      format: undefined,
      messages: [
        user("u1", "Q1"),
        formatOneReply("a1b", "A1b", "a1", "A1"),
        user("u2", "Q2"),
        formatOneReply("a2b", "A2b", "a2", "A2"),
      ],
    };
    const migrated = migrateConversation(v1);
    expect(migrated.format).toBe(2);
    // Switching shows what format 1 showed: the same later messages under either version.
    const first = switchBranch(migrated.messages, 1, 0);
    expect(texts(first)).toEqual(["Q1", "A1", "Q2", "A2b"]);
    // The copy carries the later message's own versions, themselves migrated.
    expect(texts(switchBranch(first, 3, 0))).toEqual(["Q1", "A1", "Q2", "A2"]);
    expect(migrateConversation(migrated)).toBe(migrated);
  });

  it("the store migrates on load, switches with selectVersion and writes format 2", async () => {
    const old = {
      id: "old",
      title: "Old",
      systemPrompt: "",
      createdAt: T,
      updatedAt: T,
      messages: [user("u1", "Q1"), formatOneReply("a1b", "A1b", "a1", "A1"), user("u2", "Q2")],
    };
    const store = new ConversationStore(dir);
    await store.list(); // creates the directory
    await writeFile(join(dir, "old.json"), JSON.stringify(old));
    const fresh = new ConversationStore(dir);
    expect(texts((await fresh.get("old")).messages)).toEqual(["Q1", "A1b", "Q2"]);
    const switched = await fresh.selectVersion("old", "a1b", 0);
    expect(texts(switched.messages)).toEqual(["Q1", "A1", "Q2"]);
    expect(switched.updatedAt).toBe(T);
    const onDisk = JSON.parse(await readFile(join(dir, "old.json"), "utf8"));
    expect(onDisk.format).toBe(2);
    expect(texts((await new ConversationStore(dir).get("old")).messages)).toEqual([
      "Q1",
      "A1",
      "Q2",
    ]);
  });

  it("pinned conversations stay at the top, across reopening; unpinning puts them back in time order", async () => {
    let clock = 0;
    const store = new ConversationStore(
      dir,
      undefined,
      () => new Date(1_700_000_000_000 + clock++ * 1000),
    );
    const a = await store.create("A");
    const b = await store.create("B");
    const c = await store.create("C");
    expect((await store.list()).map((s) => s.title)).toEqual(["C", "B", "A"]);
    const pinned = await store.setPinned(a.id, true);
    expect(pinned.updatedAt).toBe(a.updatedAt);
    await store.save({ ...(await store.get(b.id)), title: "B2" }); // newest now
    const reopened = new ConversationStore(dir);
    expect((await reopened.list()).map((s) => [s.title, s.pinned])).toEqual([
      ["A", true],
      ["B2", false],
      ["C", false],
    ]);
    await reopened.setPinned(a.id, false);
    expect((await reopened.list()).map((s) => s.title)).toEqual(["B2", "C", "A"]);
    expect("pinned" in (await reopened.get(a.id))).toBe(false);
    void c;
  });
});

function conversation(messages: Message[]): Conversation {
  return { id: "c", format: 2, title: "t", systemPrompt: "", createdAt: T, updatedAt: T, messages };
}

/** An engine that answers `R<n>` to the n-th prompt and records every prompt's text. */
function recordingEngine(prompts: string[]): EngineManager {
  const template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
  return scriptedEngineManager({ tokenizer: tok, template }, async function* (params) {
    prompts.push(tok.decode(params.tokens));
    const ids = tok.encode(`R${prompts.length}`);
    yield { type: "tokens", id: 1, tokens: ids };
    yield finishedEvent(params, ids, "length");
  });
}

describe("what the model sees", () => {
  it("always the branch shown: after an edit, a regenerate of an earlier reply and a switch", async () => {
    const prompts: string[] = [];
    const store = new ConversationStore(dir);
    const waiting = new Map<string, () => void>();
    const chat = new ChatManager({
      engine: recordingEngine(prompts),
      store,
      settings: () => DEFAULT_SETTINGS,
      emit: (e) => {
        if (e.type === "chat.done") waiting.get(e.message.id)?.();
      },
      onConversations: () => undefined,
      hitRates: new HitRateBook(),
    });
    const done = async (c: Conversation) => {
      const id = c.messages.at(-1)!.id;
      await new Promise<void>((resolve) => waiting.set(id, resolve));
      return store.get(c.id);
    };
    const c = await store.create("t", "");
    await done(await chat.send(c.id, "Q1")); // R1
    const two = await done(await chat.send(c.id, "Q2")); // R2
    expect(texts(two.messages)).toEqual(["Q1", "R1", "Q2", "R2"]);

    // Edit the first message: the model sees only it, not the old branch.
    const edited = await done(await chat.edit(c.id, two.messages[0]!.id, "Q1 edited")); // R3
    expect(prompts[2]).toBe("[user] Q1 edited\n");
    expect(texts(edited.messages)).toEqual(["Q1 edited", "R3"]);

    // Back to the first branch, and continue it: the model sees that branch.
    const back = await store.selectVersion(c.id, edited.messages[0]!.id, 0);
    expect(texts(back.messages)).toEqual(["Q1", "R1", "Q2", "R2"]);
    await done(await chat.send(c.id, "Q3")); // R4
    expect(prompts[3]).toBe("[user] Q1\n[assistant] R1\n[user] Q2\n[assistant] R2\n[user] Q3\n");

    // Regenerate the first reply of that branch: the model sees only Q1.
    const again = await done(await chat.regenerate(c.id, back.messages[1]!.id)); // R5
    expect(prompts[4]).toBe("[user] Q1\n");
    expect(texts(again.messages)).toEqual(["Q1", "R5"]);
    expect(replyVersions(again.messages[1]!).map((v) => v.content)).toEqual(["R1", "R5"]);
    const previous = await store.selectVersion(c.id, again.messages[1]!.id, 0);
    expect(texts(previous.messages)).toEqual(["Q1", "R1", "Q2", "R2", "Q3", "R4"]);

    // Regenerate with no message named: the last reply, as before branches.
    const last = await done(await chat.regenerate(c.id)); // R6
    expect(prompts[5]).toBe("[user] Q1\n[assistant] R1\n[user] Q2\n[assistant] R2\n[user] Q3\n");
    expect(texts(last.messages).at(-1)).toBe("R6");
    await expect(chat.regenerate(c.id, last.messages[0]!.id)).rejects.toMatchObject({
      error: { code: "message_not_found" },
    });
  });
});
