import { describe, expect, it } from "vitest";
import { initialState, isReplying, MAX_SAMPLES, messageText, reduce, type State } from "./store.ts";
import type { Conversation, Download, LiveSample, Message } from "../../../core/app/api.ts";
import { runningDownload } from "../../../testkit/download.ts";

const user: Message = { id: "u1", role: "user", content: "hi", createdAt: "t" };
const pendingReply: Message = { id: "a1", role: "assistant", content: "", createdAt: "t" };
const conv = (messages: Message[]): Conversation => ({
  id: "c1",
  title: "Chat",
  systemPrompt: "",
  createdAt: "t",
  updatedAt: "t",
  messages,
});
const doneReply: Message = {
  ...pendingReply,
  content: "Hello there",
  finishReason: "eos",
  stats: {
    line: "19.9 t/s, TTFT: 660.1ms (19.7 t/s, 13 tokens), 53 tokens",
    decodeTokensPerSecond: 19.9,
    ttftMs: 660.1,
    prefillTokensPerSecond: 19.7,
    promptTokens: 13,
    generatedTokens: 53,
    peakRssBytes: null,
    hitRate: null,
  },
};

function delta(s: State, text: string): State {
  return reduce(s, {
    type: "event",
    event: { type: "chat.delta", conversationId: "c1", messageId: "a1", text },
  });
}

describe("streaming replies", () => {
  it("appends deltas to the reply and replaces it on done", () => {
    let s = reduce(initialState, {
      type: "conversation",
      conversation: conv([user, pendingReply]),
      select: true,
      reply: true,
    });
    expect(isReplying(s)).toBe(true);
    const userObj = s.current!.messages[0];
    s = delta(s, "Hel");
    s = delta(s, "lo");
    expect(messageText(s, s.current!.messages[1]!)).toBe("Hello");
    // The finished user message keeps its identity: its memoized row does not re-render.
    expect(s.current!.messages[0]).toBe(userObj);
    s = reduce(s, {
      type: "event",
      event: { type: "chat.done", conversationId: "c1", message: doneReply },
    });
    expect(s.current!.messages[1]).toEqual(doneReply);
    expect(messageText(s, s.current!.messages[1]!)).toBe("Hello there");
    expect(s.liveText).toEqual({});
    expect(isReplying(s)).toBe(false);
  });

  it("keeps deltas and the done message that arrive before the send answer", () => {
    let s = reduce(initialState, { type: "conversation", conversation: conv([]), select: true });
    s = delta(s, "Hel");
    expect(isReplying(s)).toBe(true);
    s = reduce(s, { type: "conversation", conversation: conv([user, pendingReply]), reply: true });
    expect(messageText(s, s.current!.messages[1]!)).toBe("Hel");

    let t = reduce(initialState, { type: "conversation", conversation: conv([]), select: true });
    t = reduce(t, {
      type: "event",
      event: { type: "chat.done", conversationId: "c1", message: doneReply },
    });
    t = reduce(t, { type: "conversation", conversation: conv([user, pendingReply]), reply: true });
    expect(t.current!.messages[1]).toEqual(doneReply);
    expect(t.finished).toEqual({});
    expect(isReplying(t)).toBe(false);
  });

  it("ignores conversations that are not current unless selected", () => {
    const s = reduce(initialState, { type: "conversation", conversation: conv([user]) });
    expect(s.current).toBeNull();
    const other = { ...conv([user]), id: "c2" };
    const t = reduce(reduce(s, { type: "conversation", conversation: conv([]), select: true }), {
      type: "conversation",
      conversation: other,
    });
    expect(t.current!.id).toBe("c1");
  });

  it("forgets a deleted current conversation", () => {
    let s = reduce(initialState, {
      type: "conversation",
      conversation: conv([user]),
      select: true,
    });
    s = reduce(s, {
      type: "event",
      event: {
        type: "conversations",
        conversations: [
          { id: "c1", title: "Chat", updatedAt: "t", messageCount: 1, pinned: false },
        ],
      },
    });
    s = reduce(s, { type: "conversationDeleted", id: "c1" });
    expect(s.current).toBeNull();
    expect(s.conversations).toEqual([]);
  });
});

describe("New chat", () => {
  it("clears the current conversation until the new one arrives, then selects it", () => {
    let s = reduce(initialState, {
      type: "conversation",
      conversation: conv([user]),
      select: true,
    });
    s = reduce(s, { type: "newChatStarted" });
    expect(s.current).toBeNull();
    expect(s.newChatPending).toBe(true);
    // Another conversation's refresh (not selected) does not become current meanwhile.
    s = reduce(s, { type: "conversation", conversation: conv([user, doneReply]) });
    expect(s.current).toBeNull();
    s = reduce(s, {
      type: "conversation",
      conversation: { ...conv([]), id: "c2" },
      select: true,
    });
    expect(s.current?.id).toBe("c2");
    expect(s.newChatPending).toBe(false);
  });

  it("a failed creation ends the pending state", () => {
    let s = reduce(initialState, { type: "newChatStarted" });
    s = reduce(s, { type: "newChatFailed" });
    expect(s.newChatPending).toBe(false);
  });
});

describe("downloads and samples", () => {
  const d = runningDownload("t1", { ref: "demo", name: "demo" });
  it("upserts downloads in first-seen order and drops dismissed ones", () => {
    let s = reduce(initialState, { type: "event", event: { type: "download", download: d } });
    s = reduce(s, { type: "event", event: { type: "download", download: { ...d, taskId: "t2" } } });
    s = reduce(s, {
      type: "event",
      event: { type: "download", download: { ...d, bytesDone: 50 } },
    });
    expect(s.downloads.map((x) => [x.taskId, x.bytesDone])).toEqual([
      ["t1", 50],
      ["t2", 10],
    ]);
    s = reduce(s, { type: "downloadDismissed", taskId: "t1" });
    expect(s.downloads.map((x) => x.taskId)).toEqual(["t2"]);
  });

  it("a new download of a name replaces that name's finished card, not a running one", () => {
    const download = (taskId: string, name: string, state: Download["state"]) =>
      ({
        type: "event",
        event: { type: "download", download: { ...d, taskId, name, state } },
      }) as const;
    let s = reduce(initialState, download("t1", "tiny", "done"));
    s = reduce(s, download("t2", "other", "running"));
    s = reduce(s, download("t3", "tiny", "running"));
    expect(s.downloads.map((x) => x.taskId)).toEqual(["t2", "t3"]);
    s = reduce(s, download("t4", "other", "running"));
    expect(s.downloads.map((x) => x.taskId)).toEqual(["t2", "t3", "t4"]);
  });

  it("keeps the last MAX_SAMPLES live samples", () => {
    const sample = (t: number): LiveSample => ({
      t,
      generating: false,
      rssBytes: t,
      peakRssBytes: null,
      budgetBytes: null,
      freeMemoryBytes: 1,
      totalMemoryBytes: 2,
      decodeTokensPerSecond: null,
      ttftMs: null,
      generatedTokens: null,
      expertCache: null,
      powerWatts: null,
      joulesPerToken: null,
      thermal: null,
    });
    let s = reduce(initialState, { type: "history", samples: [sample(1), sample(2)] });
    for (let t = 3; t <= MAX_SAMPLES + 10; t++) {
      s = reduce(s, { type: "event", event: { type: "live", sample: sample(t) } });
    }
    expect(s.samples).toHaveLength(MAX_SAMPLES);
    expect(s.samples[0]!.t).toBe(11);
    expect(s.samples.at(-1)!.t).toBe(MAX_SAMPLES + 10);
    // History arriving after live samples keeps the newer live ones after it, in order.
    let h = reduce(initialState, { type: "event", event: { type: "live", sample: sample(3) } });
    h = reduce(h, { type: "event", event: { type: "live", sample: sample(4) } });
    h = reduce(h, { type: "history", samples: [sample(1), sample(2), sample(3)] });
    expect(h.samples.map((x) => x.t)).toEqual([1, 2, 3, 4]);
  });

  it("takes reloadNeeded from the latest settings or engine event", () => {
    let s = reduce(initialState, {
      type: "event",
      event: { type: "settings", settings: {} as never, reloadNeeded: true },
    });
    expect(s.reloadNeeded).toBe(true);
    s = reduce(s, {
      type: "event",
      event: { type: "engine", status: { reloadNeeded: false } as never },
    });
    expect(s.reloadNeeded).toBe(false);
  });
});

describe("connections", () => {
  it("takes the connection list from its event", () => {
    const connection = {
      id: "c1",
      name: "GPU box",
      baseUrl: "http://127.0.0.1:8000/v1",
      keyStorage: null,
      warning: null,
      models: ["big"],
      error: null,
    };
    expect(initialState.connections).toBeNull();
    const s = reduce(initialState, {
      type: "event",
      event: { type: "connections", connections: [connection] },
    });
    expect(s.connections).toEqual([connection]);
    const emptied = reduce(s, { type: "event", event: { type: "connections", connections: [] } });
    expect(emptied.connections).toEqual([]);
  });
});

describe("search hits", () => {
  it("jumpTo holds the message to scroll to until the list clears it", () => {
    const s = reduce(initialState, { type: "jumpTo", messageId: "m1" });
    expect(s.jumpTo).toBe("m1");
    expect(reduce(s, { type: "jumpTo", messageId: "m1" })).toBe(s);
    expect(reduce(s, { type: "jumpTo", messageId: null }).jumpTo).toBeNull();
  });
});
