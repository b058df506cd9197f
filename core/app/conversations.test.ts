/** Conversation files: persistence, ordering, atomic writes, damaged files. */
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AppCallError, ConversationSchema, type Message } from "./api.ts";
import {
  ConversationStore,
  MAX_VERSIONS,
  regeneratedReply,
  replyVersions,
  showVersion,
  titleFrom,
  UNTITLED,
  writeFileAtomic,
} from "./conversations.ts";

let dir: string;
let clock: number;
const now = (): Date => new Date(clock++ * 1000);

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "redwing-conv-"));
  clock = 1_700_000_000;
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("ConversationStore", () => {
  it("keeps conversations in one file each, newest first, across reopening", async () => {
    const store = new ConversationStore(dir, undefined, now);
    const a = await store.create();
    const b = await store.create("Named", "Be brief.");
    expect(a.title).toBe(UNTITLED);
    a.messages.push({
      id: "m1",
      role: "user",
      content: "Plan a trip to Lisbon\nin May",
      createdAt: now().toISOString(),
    });
    await store.save(a);

    const again = new ConversationStore(dir, undefined, now);
    const list = await again.list();
    expect(list.map((c) => c.id)).toEqual([a.id, b.id]); // a was updated last
    expect(list[0]).toMatchObject({ title: "Plan a trip to Lisbon", messageCount: 1 });
    const readB = await again.get(b.id);
    expect(readB).toMatchObject({ title: "Named", systemPrompt: "Be brief.", messages: [] });
    expect((await readdir(dir)).sort()).toEqual([`${a.id}.json`, `${b.id}.json`].sort());
    // The file is the conversation, valid against the schema.
    const onDisk = JSON.parse(await readFile(join(dir, `${a.id}.json`), "utf8"));
    expect(ConversationSchema.parse(onDisk).messages[0]!.content).toBe(
      "Plan a trip to Lisbon\nin May",
    );

    await again.delete(a.id);
    expect((await again.list()).map((c) => c.id)).toEqual([b.id]);
    await expect(again.get(a.id)).rejects.toBeInstanceOf(AppCallError);
  });

  it("refuses ids that are not plain names", async () => {
    const store = new ConversationStore(dir);
    await expect(store.get("../settings")).rejects.toMatchObject({
      error: { code: "conversation_not_found" },
    });
  });

  it("names an untitled conversation after its first user message, cut at a word", () => {
    expect(titleFrom("  Hello   there \nsecond line")).toBe("Hello there");
    const long = "word ".repeat(30);
    const t = titleFrom(long);
    expect(t.length).toBeLessThanOrEqual(60);
    expect(t.endsWith("…")).toBe(true);
    expect(t).not.toMatch(/\s…$/);
  });

  it("writes atomically: the last of many concurrent saves wins and no temporary file is left", async () => {
    const store = new ConversationStore(dir, undefined, now);
    const c = await store.create();
    await Promise.all(
      Array.from({ length: 20 }, (_, i) => store.save({ ...c, title: `title ${i}` })),
    );
    expect(await readdir(dir)).toEqual([`${c.id}.json`]);
    const onDisk = JSON.parse(await readFile(join(dir, `${c.id}.json`), "utf8"));
    expect(onDisk.title).toBe("title 19");
  });

  it("leaves the old file whole when a write fails", async () => {
    const path = join(dir, "x.json");
    await writeFileAtomic(path, '{"old":true}');
    // Writing into a directory that does not exist fails before anything is renamed over.
    await expect(writeFileAtomic(join(dir, "missing", "x.json"), "new")).rejects.toThrow();
    expect(await readFile(path, "utf8")).toBe('{"old":true}');
    expect(await readdir(dir)).toEqual(["x.json"]);
  });

  it("moves damaged files aside and loads the rest", async () => {
    const store = new ConversationStore(dir, undefined, now);
    const good = await store.create("Good");
    await writeFile(join(dir, "broken.json"), '{"id": "broken", "title": ');
    await writeFile(join(dir, "wrong.json"), JSON.stringify({ id: "wrong", title: 3 }));
    // A temporary file a crash left behind is not a conversation.
    await writeFile(join(dir, `${good.id}.json.tmp-1-abcd`), "{");
    const lines: string[] = [];
    const again = new ConversationStore(dir, (l) => lines.push(l), now);
    expect((await again.list()).map((c) => c.id)).toEqual([good.id]);
    const names = await readdir(dir);
    expect(names.filter((n) => n.startsWith("broken.json.corrupt-"))).toHaveLength(1);
    expect(names.filter((n) => n.startsWith("wrong.json.corrupt-"))).toHaveLength(1);
    expect(lines.join("\n")).toMatch(/broken\.json is damaged/);
  });
});

describe("reply versions (Regenerate keeps the earlier replies)", () => {
  const reply = (id: string, content: string): Message => ({
    id,
    role: "assistant",
    content,
    createdAt: "2026-01-01T00:00:00.000Z",
    model: "demo",
    finishReason: "eos",
  });

  it("a regenerated reply shows the newest version and keeps the others in order", () => {
    const v2 = regeneratedReply(reply("a1", "first"), reply("a2", "second"));
    const v3 = regeneratedReply(v2, reply("a3", "third"));
    expect(v3).toMatchObject({ id: "a3", content: "third", versionIndex: 2 });
    expect(replyVersions(v3).map((v) => v.content)).toEqual(["first", "second", "third"]);
    // Showing the first: its text is the message's; the order of versions stays.
    const shown = showVersion(v3, 0);
    expect(shown).toMatchObject({ id: "a1", content: "first", role: "assistant", versionIndex: 0 });
    expect(replyVersions(shown).map((v) => v.id)).toEqual(["a1", "a2", "a3"]);
    // Regenerating while an older one is shown appends the new one after all of them.
    const v4 = regeneratedReply(shown, reply("a4", "fourth"));
    expect(replyVersions(v4).map((v) => v.content)).toEqual(["first", "second", "third", "fourth"]);
    expect(v4.versionIndex).toBe(3);
    expect(() => showVersion(v4, 4)).toThrow(AppCallError);
  });

  it("a message stored before versions existed is one version", () => {
    const old = reply("a1", "only");
    expect(replyVersions(old).map((v) => v.id)).toEqual(["a1"]);
    expect(showVersion(old, 0)).toEqual(old);
  });

  it("keeps at most MAX_VERSIONS, forgetting the oldest", () => {
    let m = reply("a0", "0");
    for (let i = 1; i <= MAX_VERSIONS + 5; i++) m = regeneratedReply(m, reply(`a${i}`, `${i}`));
    const all = replyVersions(m);
    expect(all).toHaveLength(MAX_VERSIONS);
    expect(all.at(-1)!.id).toBe(`a${MAX_VERSIONS + 5}`);
    expect(all[0]!.id).toBe("a6");
  });

  it("selectVersion stores the choice; an old file without versions loads and switches", async () => {
    const store = new ConversationStore(dir, undefined, now);
    const c = await store.create();
    c.messages.push(
      { id: "u1", role: "user", content: "Hi", createdAt: "2026-01-01T00:00:00.000Z" },
      regeneratedReply(reply("a1", "first"), reply("a2", "second")),
    );
    await store.save(c);
    const updatedAt = (await store.get(c.id)).updatedAt;
    await store.selectVersion(c.id, "a2", 0);
    const reopened = await new ConversationStore(dir, undefined, now).get(c.id);
    expect(reopened.messages[1]).toMatchObject({ id: "a1", content: "first", versionIndex: 0 });
    expect(reopened.updatedAt).toBe(updatedAt);
    // A file written before versions existed: plain messages, which load and have one version.
    const legacy = {
      id: "legacy",
      title: "Old",
      systemPrompt: "",
      createdAt: "2025-01-01T00:00:00.000Z",
      updatedAt: "2025-01-01T00:00:00.000Z",
      messages: [
        { id: "u", role: "user", content: "Q", createdAt: "2025-01-01T00:00:00.000Z" },
        { id: "a", role: "assistant", content: "A", createdAt: "2025-01-01T00:00:00.000Z" },
      ],
    };
    await writeFile(join(dir, "legacy.json"), JSON.stringify(legacy));
    const fresh = new ConversationStore(dir, undefined, now);
    expect((await fresh.get("legacy")).messages[1]).toEqual(legacy.messages[1]);
    await expect(fresh.selectVersion("legacy", "a", 1)).rejects.toThrow(/has no version 2/);
    await expect(fresh.selectVersion("legacy", "nope", 0)).rejects.toThrow(AppCallError);
  });
});
