/** Export (Markdown, JSON) and import: a lossless round trip with branches, and every refusal. */
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ExportFileSchema, MAX_IMPORT_BYTES, type Conversation, type Message } from "./api.ts";
import type { AppContext } from "./context.ts";
import { branchAt, ConversationStore, switchBranch } from "./conversations.ts";
import { chatHandlers } from "./handlers/chat.ts";
import {
  conversationMarkdown,
  exportFile,
  exportJson,
  fileStem,
  importConversations,
  parseImport,
} from "./transfer.ts";

const T = "2026-03-04T05:06:07.000Z";
let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "redwing-transfer-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A conversation with a branch at its first message and a regenerated reply with statistics. */
async function branched(store: ConversationStore): Promise<Conversation> {
  const c = await store.create("Trip to Lviv", "Answer in Ukrainian.");
  const m = (id: string, role: Message["role"], content: string): Message => ({
    id,
    role,
    content,
    createdAt: T,
    ...(role === "assistant" ? { model: "demo", finishReason: "eos" as const } : {}),
  });
  c.messages = [
    m("u1", "user", "Де випити кави?"),
    m("a1", "assistant", "У «Львівській копальні кави»."),
  ];
  c.messages[1]!.stats = {
    line: "19.9 t/s, TTFT: 660.1ms (19.7 t/s, 13 tokens), 53 tokens",
    decodeTokensPerSecond: 19.9,
    ttftMs: 660.1,
    prefillTokensPerSecond: 19.7,
    promptTokens: 13,
    generatedTokens: 53,
    peakRssBytes: null,
    hitRate: null,
  };
  c.messages = [
    ...branchAt(c.messages, 0, m("u1b", "user", "Where to eat?")),
    m("a1b", "assistant", "Try banosh."),
  ];
  c.pinned = true;
  return store.save(c);
}

describe("export", () => {
  it("Markdown: title, dates, system prompt, each message with author, model, version and statistics", async () => {
    const store = new ConversationStore(dir);
    const c = await branched(store);
    // The first branch shown: "version 1 of 2" on the edited message.
    const md = conversationMarkdown({ ...c, messages: switchBranch(c.messages, 0, 0) });
    expect(md).toMatch(/^# Trip to Lviv\n/);
    expect(md).toContain("· pinned");
    expect(md).toContain("**System prompt**\n\n> Answer in Ukrainian.");
    expect(md).toContain("### You · 2026-03-04 05:06 UTC\n\nДе випити кави?\n\n*version 1 of 2*");
    expect(md).toContain(
      "### Assistant (demo) · 2026-03-04 05:06 UTC\n\nУ «Львівській копальні кави».\n\n*19.9 t/s, TTFT: 660.1ms (19.7 t/s, 13 tokens), 53 tokens*",
    );
    expect(md).not.toContain("banosh"); // the other branch is the JSON export's
  });

  it("file names: a title for one conversation (any script), the day for several", async () => {
    expect(fileStem("Поїздка до Львова: план / v2")).toBe("Поїздка-до-Львова-план-v2");
    expect(fileStem("???")).toBe("conversation");
    const store = new ConversationStore(dir);
    const c = await branched(store);
    const other = await store.create("Other");
    const day = new Date("2026-05-06T07:00:00Z");
    expect(exportFile([c], "markdown", day)).toMatchObject({
      filename: "Trip-to-Lviv.md",
      mimeType: "text/markdown",
    });
    expect(exportFile([c, other], "json", day)).toMatchObject({
      filename: "redwing-conversations-2026-05-06.json",
      mimeType: "application/json",
    });
  });
});

describe("import", () => {
  it("round trip: what is exported imports back equal, branches included, under new ids when taken", async () => {
    const store = new ConversationStore(dir);
    const c = await branched(store);
    const plain = await store.create("Plain");
    const json = exportJson(await store.all());
    expect(ExportFileSchema.parse(JSON.parse(json)).conversations).toHaveLength(2);

    // Into an empty store: the same ids, every field kept.
    const elsewhere = new ConversationStore(join(dir, "elsewhere"));
    const imported = await importConversations(elsewhere, json);
    expect(imported.map((x) => x.id).sort()).toEqual([c.id, plain.id].sort());
    expect(await elsewhere.get(c.id)).toEqual(c);
    const back = switchBranch((await elsewhere.get(c.id)).messages, 0, 0);
    expect(back.map((m) => m.content)).toEqual([
      "Де випити кави?",
      "У «Львівській копальні кави».",
    ]);
    expect(back[1]!.stats?.generatedTokens).toBe(53);

    // Into the store they came from: nothing is replaced, the copies get new ids.
    const again = await importConversations(store, json);
    expect(again.map((x) => x.id)).not.toContain(c.id);
    expect(again.map((x) => x.id)).not.toContain(plain.id);
    expect(await store.list()).toHaveLength(4);
    const copy = again.find((x) => x.title === "Trip to Lviv")!;
    expect({ ...copy, id: c.id }).toEqual(c);
    expect(await store.get(c.id)).toEqual(c);
  });

  it("reads one conversation file, and gives duplicate ids in one file new ones", async () => {
    const store = new ConversationStore(dir);
    const c = await branched(store);
    const single = await importConversations(
      new ConversationStore(join(dir, "b")),
      JSON.stringify(c),
    );
    expect(single.map((x) => x.title)).toEqual(["Trip to Lviv"]);
    // An id that cannot name a file is replaced too.
    const renamed = await importConversations(
      new ConversationStore(join(dir, "d")),
      JSON.stringify({ ...c, id: "../../etc" }),
    );
    expect(renamed[0]!.id).toMatch(/^[0-9a-f-]{36}$/);
    const twice = JSON.parse(exportJson([c, c]));
    const other = new ConversationStore(join(dir, "c"));
    const both = await importConversations(other, JSON.stringify(twice));
    expect(new Set(both.map((x) => x.id)).size).toBe(2);
  });

  it("refuses what it cannot read, saying why, and writes nothing", async () => {
    const store = new ConversationStore(dir);
    const c = await branched(store);
    const good = JSON.parse(exportJson([c]));
    const refusals: [string, RegExp][] = [
      ["{not json", /not JSON/],
      ["[1, 2]", /not a Redwing conversations export/],
      [JSON.stringify({ hello: "world" }), /not a Redwing conversations export/],
      [JSON.stringify({ ...good, version: 7 }), /version 7; this Redwing reads version 1/],
      [JSON.stringify({ ...good, conversations: [] }), /damaged \(conversations:/],
      [
        JSON.stringify({
          ...good,
          conversations: [{ ...c, messages: [{ ...c.messages[0], role: "robot" }] }],
        }),
        /damaged \(conversations\.0\.messages\.0\.role/,
      ],
      [JSON.stringify({ ...c, title: 5 }), /conversation file is damaged \(title/],
      [" ".repeat(MAX_IMPORT_BYTES + 1), /up to 3\.0 MiB/],
    ];
    for (const [data, message] of refusals) {
      expect(() => parseImport(data), message.source).toThrow(message);
      await expect(importConversations(store, data)).rejects.toMatchObject({
        error: { code: "bad_import" },
      });
    }
    expect(await store.list()).toHaveLength(1);
  });

  it("all or nothing: a write that fails takes back the ones written before it", async () => {
    const store = new ConversationStore(dir);
    const a = await store.create("A");
    const b = await store.create("B");
    const json = exportJson([a, b]);
    const target = new ConversationStore(join(dir, "target"));
    await target.list();
    const save = target.save.bind(target);
    let calls = 0;
    vi.spyOn(target, "save").mockImplementation(async (c, touch) => {
      if (++calls === 2) throw new Error("ENOSPC: no space left on device");
      return save(c, touch);
    });
    await expect(importConversations(target, json)).rejects.toThrow(/ENOSPC/);
    expect(await target.list()).toEqual([]);
    expect(await readdir(join(dir, "target"))).toEqual([]);
  });
});

describe("chat.export and chat.import handlers", () => {
  function handlers(
    store: ConversationStore,
    saveFile?: (name: string, text: string) => Promise<string | null>,
  ) {
    const emitted: string[] = [];
    const ctx = {
      conversations: store,
      chat: {},
      options: { shell: saveFile ? "electron" : "web", dataDir: dir, saveFile },
      emitConversations: () => emitted.push("conversations"),
    } as unknown as AppContext;
    return { h: chatHandlers(ctx), emitted };
  }

  it("web mode answers the text; Electron saves it where the dialog says and sends none", async () => {
    const store = new ConversationStore(dir);
    const c = await branched(store);
    const web = await handlers(store).h["chat.export"]({ ids: [c.id], format: "json" });
    expect(web.savedTo).toBeNull();
    expect(ExportFileSchema.parse(JSON.parse(web.content!)).conversations[0]).toEqual(c);

    const saved: [string, string][] = [];
    const electron = handlers(store, async (name, text) => {
      saved.push([name, text]);
      return `/home/me/${name}`;
    }).h;
    expect(await electron["chat.export"]({ format: "markdown" })).toEqual({
      filename: "Trip-to-Lviv.md",
      mimeType: "text/markdown",
      content: null,
      savedTo: "/home/me/Trip-to-Lviv.md",
    });
    expect(saved[0]![1]).toMatch(/^# Trip to Lviv/);
    const cancelled = handlers(store, async () => null).h;
    expect((await cancelled["chat.export"]({ format: "json" })).savedTo).toBeNull();
  });

  it("import answers the new summaries and announces the list; nothing to export is said", async () => {
    const empty = new ConversationStore(join(dir, "empty"));
    const { h, emitted } = handlers(empty);
    await expect(h["chat.export"]({ format: "markdown" })).rejects.toMatchObject({
      error: { code: "nothing_to_export" },
    });
    const source = new ConversationStore(dir);
    const c = await branched(source);
    const { imported } = await h["chat.import"]({ data: exportJson([c]) });
    expect(imported).toEqual([
      { id: c.id, title: "Trip to Lviv", updatedAt: c.updatedAt, messageCount: 2, pinned: true },
    ]);
    expect(emitted).toEqual(["conversations"]);
  });
});
