/** Conversation files: persistence, ordering, atomic writes, damaged files. */
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AppCallError, ConversationSchema } from "./api.ts";
import { ConversationStore, titleFrom, UNTITLED, writeFileAtomic } from "./conversations.ts";

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
