/**
 * Chatting with a model on a connection through the app controller, against a second Redwing
 * (`redwing serve` in its own process): the same conversation, `chat.delta` / `chat.done` events
 * and statistics line as a local reply, and the endpoint's faults on the reply in plain words.
 * The app itself loads no model here: a remote chat needs none.
 */
import { existsSync } from "node:fs";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { appCalls } from "../../testkit/app-calls.ts";
import { startRemoteServe, type RemoteServe } from "../../testkit/remote-serve.ts";
import { nativeBuildDir } from "../native.ts";
import { AppEventSchema, type AppEvent, type Message } from "./api.ts";
import { createAppController, type AppController } from "./controller.ts";

const haveService = existsSync(join(nativeBuildDir(), "redwing-service"));

describe.skipIf(!haveService)("app: chatting with a model on a connection", () => {
  let root: string;
  let app: AppController;
  let remote: RemoteServe;
  let keyed: RemoteServe;
  const events: AppEvent[] = [];

  const { call, callError } = appCalls(() => app);

  async function waitDone(messageId: string, timeoutMs = 30_000): Promise<Message> {
    const start = Date.now();
    for (;;) {
      const done = events.find((e) => e.type === "chat.done" && e.message.id === messageId);
      if (done?.type === "chat.done") return done.message;
      if (Date.now() - start > timeoutMs) throw new Error("timed out waiting for chat.done");
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  /** Sends; answers the reply's id (its events follow). */
  async function send(conversationId: string, content: string): Promise<string> {
    const c = await call("chat.send", { conversationId, content });
    return c.messages.at(-1)!.id;
  }

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "redwing-app-remote-"));
    [remote, keyed] = await Promise.all([
      startRemoteServe(join(root, "a")),
      startRemoteServe(join(root, "b"), { args: ["--api-key", "sesame"] }),
    ]);
    app = await createAppController({
      shell: "web",
      dataDir: join(root, "data"),
      modelsDir: join(root, "models"),
      autoLoad: false,
      power: null,
      liveIntervalMs: 60_000,
      log: () => undefined,
    });
    app.subscribe((e) => {
      AppEventSchema.parse(e);
      events.push(e);
    });
  }, 120_000);

  afterAll(async () => {
    await app?.close();
    await remote?.stop("SIGKILL");
    await keyed?.stop("SIGKILL");
    await rm(root, { recursive: true, force: true });
  });

  it("adds a connection, lists its models, and streams a reply with the statistics line", async () => {
    const added = await call("connections.add", { name: "Second Redwing", baseUrl: remote.url });
    expect(added).toMatchObject({
      name: "Second Redwing",
      baseUrl: remote.url,
      keyStorage: null,
      warning: null,
      models: ["demo"],
      error: null,
    });
    expect(events.some((e) => e.type === "connections" && e.connections.length === 1)).toBe(true);

    // No local model is loaded: the remote one answers.
    await call("settings.update", { remote: { connectionId: added.id, model: "demo" } });
    const c = await call("chat.create", {});
    const replyId = await send(c.id, "Hello");
    const message = await waitDone(replyId);
    expect(message.error).toBeUndefined();
    expect(message.model).toBe("demo (Second Redwing)");
    expect(["eos", "length"]).toContain(message.finishReason);
    const streamed = events
      .filter((e) => e.type === "chat.delta" && e.messageId === replyId)
      .map((e) => (e.type === "chat.delta" ? e.text : ""))
      .join("");
    expect(message.content.length).toBeGreaterThan(0);
    expect(streamed).toBe(message.content);
    expect(message.stats!.line).toMatch(
      /^\d+\.\d t\/s, TTFT: \d+\.\dms \(\d+\.\d t\/s, \d+ tokens\), \d+ tokens \(server's count\)$/,
    );
    expect(message.stats!.generatedTokens).toBeGreaterThan(0);
    expect(message.stats!.peakRssBytes).toBeNull();
    // Saved like any reply.
    expect((await call("chat.get", { id: c.id })).messages.at(-1)!.content).toBe(message.content);
  });

  it("keeps the key out of every answer, in a 0600 file, and says when it is refused", async () => {
    const wrong = await call("connections.add", {
      name: "Keyed",
      baseUrl: keyed.url,
      apiKey: "sk-not-this-one",
    });
    expect(JSON.stringify(wrong)).not.toContain("sk-not-this-one");
    expect(wrong.keyStorage).toBe("file");
    expect(wrong.error).toMatchObject({ code: "remote_auth", action: "open_connections" });
    expect(wrong.error!.message).toContain("The API key was refused");
    if (process.platform !== "win32") {
      expect((await stat(join(root, "data", "connections.json"))).mode & 0o777).toBe(0o600);
    }
    const refused = await callError("connections.test", { id: wrong.id });
    expect(refused.code).toBe("remote_auth");
    const fixed = await call("connections.update", { id: wrong.id, apiKey: "sesame" });
    expect(fixed).toMatchObject({ models: ["demo"], error: null });
    expect(JSON.stringify(await call("connections.list", {}))).not.toContain("sesame");
  });

  it("keeps a reply cut mid-way with Retry, then says plainly that the server is gone", async () => {
    const [first] = await call("connections.list", {});
    await call("settings.update", { remote: { connectionId: first!.id, model: "demo" } });
    const c = await call("chat.create", {});
    const from = events.length;
    const replyId = await send(c.id, "Tell me a long story");
    // The server dies at its first piece of text.
    for (;;) {
      if (events.slice(from).some((e) => e.type === "chat.delta" && e.messageId === replyId)) break;
      if (events.slice(from).some((e) => e.type === "chat.done")) break;
      await new Promise((r) => setTimeout(r, 2));
    }
    await remote.stop("SIGKILL");
    const cut = await waitDone(replyId);
    if (cut.finishReason !== "error") {
      // The demo finished its reply before the kill landed: nothing was cut.
      expect(["eos", "length"]).toContain(cut.finishReason);
    } else {
      expect(cut.error).toMatchObject({ code: "remote_cut", action: "retry" });
      expect(cut.content.length).toBeGreaterThan(0);
    }

    const gone = await waitDone(await send(c.id, "Are you there?"));
    expect(gone.finishReason).toBe("error");
    expect(gone.error).toMatchObject({ code: "remote_refused", action: "retry" });
    expect(gone.error!.message).toBe(
      `Could not connect to ${remote.url}: the connection was refused. Is the server running at ${remote.url}?`,
    );

    // Removing the connection puts chats back on the local model.
    await call("connections.remove", { id: first!.id });
    expect((await call("settings.get", {})).remote).toBeNull();
  });
});
