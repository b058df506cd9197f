/**
 * The app controller end to end, with the real decode service and the demo model (cheap real
 * generation), a fake hub for downloads (testkit/test-hub.ts) and a temporary data
 * directory. Every call goes through `parseCall` as the transports do, and every result and
 * event is checked against the API schemas independently of the controller's own check.
 */
import { existsSync } from "node:fs";
import { mkdtemp, open, readFile, readdir, rm } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readModelDir } from "../format/read.ts";
import { writeTinyCheckpoint, TINY_GEMMA4_MOE } from "../../testkit/checkpoints.ts";
import { hasPartial } from "../install/installer.ts";
import { waitForPlacedRange } from "../../testkit/install.ts";
import { TestHub } from "../../testkit/test-hub.ts";
import { appCalls } from "../../testkit/app-calls.ts";
import { freePort } from "../../testkit/free-port.ts";
import { nativeBuildDir } from "../native.ts";
import {
  AppEventSchema,
  DEFAULT_SETTINGS,
  type AppEvent,
  type Download,
  type Message,
} from "./api.ts";
import { createAppController, type AppController } from "./controller.ts";

const haveService = existsSync(join(nativeBuildDir(), "redwing-service"));
const STATS_RE = /t\/s, TTFT: .*ms \(.* t\/s, \d+ tokens\), \d+ tokens/;

let root: string;
let dataDir: string;
let modelsDir: string;
let hub: TestHub;
let app: AppController;
const events: AppEvent[] = [];
const badEvents: string[] = [];
const logs: string[] = [];

const { call, callError } = appCalls(() => app);

/** The first event from index `from` on that matches. */
async function waitEvent<T extends AppEvent>(
  match: (e: AppEvent) => e is T,
  from = 0,
  timeoutMs = 30_000,
): Promise<T> {
  const start = Date.now();
  for (;;) {
    const found = events.slice(from).find(match);
    if (found) return found;
    if (Date.now() - start > timeoutMs) throw new Error("timed out waiting for an event");
    await new Promise((r) => setTimeout(r, 10));
  }
}

const isDone =
  (messageId: string) =>
  (e: AppEvent): e is Extract<AppEvent, { type: "chat.done" }> =>
    e.type === "chat.done" && e.message.id === messageId;
const isDelta =
  (messageId: string) =>
  (e: AppEvent): e is Extract<AppEvent, { type: "chat.delta" }> =>
    e.type === "chat.delta" && e.messageId === messageId;
const isDownload =
  (taskId: string, ok: (d: Download) => boolean) =>
  (e: AppEvent): e is Extract<AppEvent, { type: "download" }> =>
    e.type === "download" && e.download.taskId === taskId && ok(e.download);

function deltasOf(messageId: string): string {
  return events
    .filter(isDelta(messageId))
    .map((e) => e.text)
    .join("");
}

/** Sends a message and waits for the finished reply. */
async function exchange(conversationId: string, content: string): Promise<Message> {
  const from = events.length;
  const c = await call("chat.send", { conversationId, content });
  const reply = c.messages.at(-1)!;
  return (await waitEvent(isDone(reply.id), from)).message;
}

/**
 * Sends a message and waits for the first text of its reply; answers the reply's id and the
 * index in `events` from which its events count.
 */
async function startReply(
  conversationId: string,
  content: string,
): Promise<{ replyId: string; from: number }> {
  const from = events.length;
  const sent = await call("chat.send", { conversationId, content });
  const replyId = sent.messages.at(-1)!.id;
  await waitEvent(isDelta(replyId), from);
  return { replyId, from };
}

describe.skipIf(!haveService)("app controller (real engine, demo model)", () => {
  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "redwing-app-"));
    dataDir = join(root, "data");
    modelsDir = join(root, "models");
    hub = await TestHub.start();
    const ckpt = join(root, "ckpt");
    await writeTinyCheckpoint(ckpt, TINY_GEMMA4_MOE, { form: "nested", kind: "mlx", shards: 2 });
    await hub.addRepoFromDir("test/tiny", ckpt);
    app = await createAppController({
      shell: "web",
      dataDir,
      modelsDir,
      env: { ...process.env, HF_ENDPOINT: hub.url, HF_TOKEN: undefined },
      power: null,
      liveIntervalMs: 100,
      log: (line) => logs.push(line),
      install: {
        maxRangeBytes: 64 * 1024,
        unitBytes: 16 * 1024,
        reserveBytes: 0,
        durable: false,
        concurrency: 2,
        hub: {
          retry: { attempts: 3, baseDelayMs: 5, maxDelayMs: 20, maxRetryAfterMs: 1000 },
          stallTimeoutMs: 1500,
        },
      },
    });
    app.subscribe((e) => {
      const r = AppEventSchema.safeParse(e);
      if (!r.success) badEvents.push(`${e.type}: ${r.error.message}`);
      events.push(e);
    });
    await app.ready;
  }, 120_000);

  afterAll(async () => {
    await app?.close();
    await hub?.close();
    await rm(root, { recursive: true, force: true });
  });

  it("first run: makes and loads the demo model; the memory plan matches the engine's", async () => {
    const status = await call("engine.status");
    expect(status).toMatchObject({ state: "ready", model: "demo", error: null });
    expect(status.pid).toBeGreaterThan(0);
    expect(status.loadedWith).toEqual(DEFAULT_SETTINGS.engine);
    expect(status.reloadNeeded).toBe(false);
    // The engine's own word (its ready event): the CPU has no hybrid experts, whatever the
    // settings ask for (the default, split, is sent only on a GPU with a GPU memory budget).
    expect(status.loadedWith).toMatchObject({ gpuMisses: "split", gpuExpertCopies: 2 });
    expect(status.gpuMisses).toBe("copy");

    const models = await call("models.list");
    expect(models).toHaveLength(1);
    expect(models[0]).toMatchObject({ name: "demo", isDemo: true, loaded: true, moe: true });
    expect(models[0]!.verify.state).toBe("unchecked");
    const catalog = await call("models.catalog");
    expect(catalog.find((c) => c.id === "demo")?.installedAs).toBe("demo");
    expect(catalog.filter((c) => c.kind === "hub").every((c) => c.installedAs === null)).toBe(true);

    const info = await call("app.info");
    expect(info).toMatchObject({
      shell: "web",
      modelsDir,
      features: { energy: false, reveal: false },
    });
    expect(await call("models.reveal", { name: "demo" })).toEqual({
      path: join(modelsDir, "demo"),
      shown: false,
    });

    // Computed in TypeScript from the manifest, compared with the engine's own plan.
    const plan = await call("settings.memoryPlan", {});
    expect(plan.totalBytes).toBe(status.memory!.estimateBytes);
    expect(plan.kvBytes).toBe(status.memory!.kvBytes);
    // One figure everywhere: Live's weights are the plan's (not the model directory's size),
    // the Models card and the catalog show the plan's total and the installed size.
    expect(plan.weightsBytes).toBe(status.memory!.weightsBytes);
    expect(plan.expertCacheBytes).toBe(status.memory!.expertCacheBytes);
    expect(plan.workBytes).toBe(status.memory!.workBytes);
    const [listed] = await call("models.list");
    expect(listed!.memoryEstimateBytes).toBe(plan.totalBytes);
    const demoItem = (await call("models.catalog")).find((c) => c.installedAs === "demo")!;
    expect(demoItem.memoryBytes).toBe(plan.totalBytes);
    expect(demoItem.installBytes).toBe(listed!.sizeBytes);
    expect(plan.fits).toBe(true);
    expect(plan.overBudget).toBeNull();
    expect(plan.expertCacheSlots).toBe(status.expertCacheSlots);
    expect(plan.hitRateSource).toBe("estimate");
  });

  it("a memory budget picks the slot count the engine picks; reload applies it", async () => {
    // Planned under a budget that holds every expert: a budget also sets the prefill chunk a
    // budgeted run takes (the smaller one, docs/protocol.md), so the rest is measured under one.
    const all = await call("settings.memoryPlan", { engine: { memoryBudgetBytes: 1024 ** 4 } });
    const perSlot = all.expertCacheBytes / all.expertCacheSlots!;
    // Room for exactly 5 slots per layer (plus a little that does not make a sixth).
    const budget = all.totalBytes - all.expertCacheBytes + 5 * perSlot + perSlot / 3;
    const updated = await call("settings.update", { engine: { memoryBudgetBytes: budget } });
    expect(updated.reloadNeeded).toBe(true);
    const plan = await call("settings.memoryPlan", {});
    expect(plan.expertCacheSlots).toBe(5);
    expect(plan.overBudget).toBeNull();
    // A budget too small for the model: over the budget, yet the small plan fits the free
    // memory (the badge named the wrong limit when both were one flag).
    const tiny = await call("settings.memoryPlan", { engine: { memoryBudgetBytes: 1024 ** 2 } });
    expect(tiny.overBudget).toMatch(/budget/);
    expect(tiny.budgetBytes).toBe(1024 ** 2);
    expect(tiny.fits).toBe(true);
    // The CPU backend ignores a GPU memory budget: the same plan, with none recorded.
    const cpuWithVram = await call("settings.memoryPlan", {
      engine: { backend: "cpu", vramBudgetBytes: 1024 ** 2 },
    });
    expect(cpuWithVram.overBudget).toBeNull();
    expect(cpuWithVram.vramBudgetBytes).toBeNull();
    expect(cpuWithVram.expertCacheSlots).toBe(5);
    const reloaded = await call("engine.reload");
    expect(reloaded.state).toBe("ready");
    expect(reloaded.expertCacheSlots).toBe(5);
    expect(reloaded.reloadNeeded).toBe(false);
    await call("settings.update", { engine: { memoryBudgetBytes: null } });
    expect((await call("engine.reload")).expertCacheSlots).toBe(16);
  });

  it("chat.send streams deltas, then done with the CLI's statistics line, and saves the reply", async () => {
    await call("settings.update", { sampling: { maxNewTokens: 32, temperature: 0 } });
    const c = await call("chat.create", {});
    expect(c.title).toBe("New chat");
    const from = events.length;
    const sent = await call("chat.send", { conversationId: c.id, content: "Hello there" });
    expect(sent.messages.map((m) => [m.role, m.content])).toEqual([
      ["user", "Hello there"],
      ["assistant", ""],
    ]);
    const replyId = sent.messages[1]!.id;
    const done = await waitEvent(isDone(replyId), from);
    const m = done.message;
    expect(m.content.length).toBeGreaterThan(0);
    expect(deltasOf(replyId)).toBe(m.content);
    expect(m.stats?.line).toMatch(STATS_RE);
    expect(m.stats!.generatedTokens).toBeGreaterThan(0);
    expect(m.stats!.generatedTokens).toBeLessThanOrEqual(32);
    expect(m.stats!.promptTokens).toBeGreaterThan(5);
    expect(["length", "eos"]).toContain(m.finishReason);
    expect(m.model).toBe("demo");
    // At most ~30 delta events a second.
    const deltas = events.slice(from).filter(isDelta(replyId)).length;
    expect(deltas).toBeGreaterThan(0);
    expect(deltas).toBeLessThanOrEqual(
      Math.ceil(
        ((m.stats!.ttftMs / 1000 + m.stats!.generatedTokens / m.stats!.decodeTokensPerSecond) *
          1000) /
          33,
      ) + 2,
    );
    const stored = await call("chat.get", { id: c.id });
    expect(stored.title).toBe("Hello there");
    expect(stored.messages[1]).toEqual(m);
    expect(
      events.slice(from).some((e) => e.type === "engine" && e.status.state === "generating"),
    ).toBe(true);
    expect((await call("chat.list"))[0]).toMatchObject({ id: c.id, messageCount: 2 });

    // The hit rate this session saw at 16 slots is now the plan's ("measured").
    const plan = await call("settings.memoryPlan", {});
    expect(plan.hitRateSource).toBe("measured");
    expect(plan.expectedHitRate).toBe(m.stats!.hitRate);

    // The live panel saw the engine's memory.
    await new Promise((r) => setTimeout(r, 250));
    const history = await call("live.history");
    const last = history.at(-1)!;
    expect(last.rssBytes).toBeGreaterThan(0);
    expect(last.budgetBytes).toBeGreaterThan(0);
    expect(last.decodeTokensPerSecond).toBeCloseTo(m.stats!.decodeTokensPerSecond, 6);
    expect(last.expertCache?.slots).toBe(16);
  });

  it("chat.send of a million characters: other calls answer within 100 ms; the reply fails clearly", async () => {
    const c = await call("chat.create", {});
    const from = events.length;
    const content = "hello world. ".repeat(80_000).slice(0, 1_000_000);
    const sent = await call("chat.send", { conversationId: c.id, content });
    const replyId = sent.messages.at(-1)!.id;
    let settled = false;
    const finished = waitEvent(isDone(replyId), from).finally(() => (settled = true));
    let maxMs = 0;
    let probes = 0;
    while (!settled) {
      const t0 = performance.now();
      await call("engine.status");
      maxMs = Math.max(maxMs, performance.now() - t0);
      probes++;
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(probes).toBeGreaterThan(0);
    expect(maxMs).toBeLessThan(100);
    const m = (await finished).message;
    expect(m.finishReason).toBe("error");
    // No context this model supports holds it: the message says to shorten it, with no button.
    expect(m.error).toMatchObject({ code: "context_overflow", action: null });
    expect(m.error!.message).toMatch(/^Your message \(1,000,000 characters\) is far longer/);
    // Nothing is lost: the message is kept, the chat can be trimmed or deleted.
    expect((await call("chat.get", { id: c.id })).messages[0]!.content).toBe(content);
    await call("chat.delete", { id: c.id });
  });

  it("chat.stop ends a reply mid-way and keeps the text so far", async () => {
    await call("settings.update", { sampling: { maxNewTokens: 3000 } });
    const c = await call("chat.create", { title: "Stopping" });
    const { replyId, from } = await startReply(c.id, "Tell a long story");
    expect(await call("chat.stop", { conversationId: c.id })).toEqual({ ok: true });
    const m = (await waitEvent(isDone(replyId), from)).message;
    expect(m.finishReason).toBe("cancelled");
    expect(m.content.length).toBeGreaterThan(0);
    expect(m.content).toBe(deltasOf(replyId));
    expect(m.stats?.generatedTokens ?? 0).toBeLessThan(3000);
    expect((await call("chat.get", { id: c.id })).messages[1]!.content).toBe(m.content);
    expect((await call("engine.status")).state).toBe("ready");
  });

  it("regenerate writes the last reply again, keeping the first as a version; edit rewrites a message and drops what followed", async () => {
    await call("settings.update", { sampling: { maxNewTokens: 8 } });
    const c = await call("chat.create", {});
    const first = await exchange(c.id, "One");
    const from = events.length;
    const again = await call("chat.regenerate", { conversationId: c.id });
    expect(again.messages).toHaveLength(2);
    const newId = again.messages[1]!.id;
    expect(newId).not.toBe(first.id);
    const second = (await waitEvent(isDone(newId), from)).message;
    expect(second.content).toBe(first.content); // greedy: the same prompt gives the same text
    // The first reply is kept as a version; selectVersion shows it (and stores the choice).
    expect(second.otherVersions?.map((v) => v.id)).toEqual([first.id]);
    expect(second.versionIndex).toBe(1);
    const back = await call("chat.selectVersion", {
      conversationId: c.id,
      messageId: newId,
      index: 0,
    });
    expect(back.messages[1]).toMatchObject({ id: first.id, versionIndex: 0 });
    expect((await call("chat.get", { id: c.id })).messages[1]!.id).toBe(first.id);
    const noSuch = await callError("chat.selectVersion", {
      conversationId: c.id,
      messageId: first.id,
      index: 2,
    });
    expect(noSuch.code).toBe("version_not_found");

    const user = again.messages[0]!;
    const edited = await call("chat.edit", {
      conversationId: c.id,
      messageId: user.id,
      content: "Two",
    });
    expect(edited.messages.map((m) => [m.role, m.content])).toEqual([
      ["user", "Two"],
      ["assistant", ""],
    ]);
    await waitEvent(isDone(edited.messages[1]!.id), from);
    const bad = await callError("chat.edit", {
      conversationId: c.id,
      messageId: edited.messages[1]!.id,
      content: "x",
    });
    expect(bad.code).toBe("message_not_found");
  });

  it("kill -9 of the service: crashed status, the reply fails with restart_engine, reload recovers", async () => {
    await call("settings.update", { sampling: { maxNewTokens: 3000 } });
    const c = await call("chat.create", {});
    const { replyId, from } = await startReply(c.id, "Go on and on");
    const pid = (await call("engine.status")).pid!;
    process.kill(pid, "SIGKILL");
    const m = (await waitEvent(isDone(replyId), from)).message;
    expect(m.finishReason).toBe("error");
    expect(m.error).toMatchObject({ code: "engine_crashed", action: "restart_engine" });
    expect(m.content).toBe(deltasOf(replyId));
    const crashed = await call("engine.status");
    expect(crashed).toMatchObject({ state: "crashed", pid: null });
    expect(crashed.error?.action).toBe("restart_engine");
    expect(
      events.slice(from).some((e) => e.type === "engine" && e.status.state === "crashed"),
    ).toBe(true);
    // A message while crashed is kept, and its reply says what to do.
    const whileDown = await exchange(c.id, "Hello?");
    expect(whileDown.error?.action).toBe("restart_engine");

    const reloaded = await call("engine.reload");
    expect(reloaded).toMatchObject({ state: "ready", model: "demo", error: null });
    expect(reloaded.pid).not.toBe(pid);
    await call("settings.update", { sampling: { maxNewTokens: 6 } });
    const after = await exchange(c.id, "Are you back?");
    expect(after.error).toBeUndefined();
    expect(after.stats?.line).toMatch(STATS_RE);
  });

  it("server.set serves the app's engine and takes turns with the chat", async () => {
    const port = await freePort();
    const on = await call("server.set", { enabled: true, port });
    expect(on).toMatchObject({
      running: true,
      url: `http://127.0.0.1:${port}/v1`,
      modelId: "demo",
    });
    expect(on.example).toContain(`curl http://127.0.0.1:${port}/v1/chat/completions`);
    expect(on.example).toContain('"model":"demo"');
    expect((await call("settings.get")).server).toEqual({ enabled: true, port });
    const health = (await (await fetch(`http://127.0.0.1:${port}/health`)).json()) as {
      engine_pid: number;
    };
    expect(health.engine_pid).toBe((await call("engine.status")).pid); // one engine, shared

    await call("settings.update", { sampling: { maxNewTokens: 150 } });
    const c = await call("chat.create", {});
    const { replyId } = await startReply(c.id, "Long answer");
    const request = fetch(`${on.url}/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "demo",
        messages: [{ role: "user", content: "Hi" }],
        max_tokens: 4,
      }),
    });
    // The chat reply holds the one queue; the API request waits behind it.
    let queue = { active: false, waiting: 0 };
    for (let i = 0; i < 200 && queue.waiting === 0; i++) {
      const h = (await (await fetch(`http://127.0.0.1:${port}/health`)).json()) as {
        queue: typeof queue;
      };
      queue = h.queue;
      if (queue.waiting === 0) await new Promise((r) => setTimeout(r, 10));
    }
    expect(queue).toMatchObject({ active: true, waiting: 1 });
    expect(events.findIndex(isDone(replyId))).toBe(-1); // still replying
    const response = await request;
    expect(response.status).toBe(200);
    const body = (await response.json()) as { choices: { message: { content: string } }[] };
    expect(typeof body.choices[0]!.message.content).toBe("string");
    expect(events.findIndex(isDone(replyId))).toBeGreaterThan(-1); // it went first

    const off = await call("server.set", { enabled: false });
    expect(off.running).toBe(false);
    await expect(fetch(`http://127.0.0.1:${port}/health`)).rejects.toThrow();
    expect((await call("settings.get")).server.enabled).toBe(false);

    const blocker: Server = createServer();
    await new Promise<void>((r) => blocker.listen(port, "127.0.0.1", () => r()));
    try {
      const busy = await callError("server.set", { enabled: true, port });
      expect(busy.code).toBe("port_in_use");
      expect(busy.message).toMatch(new RegExp(`Port ${port} is already in use`));
      const status = await call("server.status");
      expect(status.running).toBe(false);
      expect(status.error?.code).toBe("port_in_use");
    } finally {
      await new Promise((r) => blocker.close(r));
    }
  });

  it("downloads from the hub: pause keeps the partial, resume finishes verified, cancel discards", async () => {
    const dest = join(modelsDir, "test--tiny");
    hub.faults.push({
      on: "data",
      minStart: 1,
      action: { kind: "trickle", chunkBytes: 2048, delayMs: 5 },
    });
    const from = events.length;
    const d = await call("models.install", { ref: "test/tiny" });
    expect(d).toMatchObject({ name: "test--tiny", state: "running" });
    // Paused once a range is placed (not at the first bytes, which may belong to no whole range
    // yet): the resume must say it reuses it.
    const finished = waitEvent(
      isDownload(d.taskId, (x) => x.state !== "running"),
      from,
      120_000,
    );
    expect(await waitForPlacedRange(dest, finished)).toBe(true);
    const paused = await call("models.pause", { taskId: d.taskId });
    expect(paused).toMatchObject({ state: "paused", phase: "paused", error: null });
    expect(await hasPartial(dest)).toBe(true);
    expect(existsSync(dest)).toBe(false);

    hub.faults.length = 0;
    const resumed = await call("models.resume", { taskId: d.taskId });
    expect(resumed.state).toBe("running");
    const done = await waitEvent(
      isDownload(d.taskId, (x) => x.state === "done"),
      from,
    );
    expect(done.download.phase).toBe("done");
    const notes = events
      .slice(from)
      .filter(isDownload(d.taskId, (x) => x.note !== null))
      .map((e) => e.download.note);
    expect(notes.some((n) => /resuming/.test(n!))).toBe(true);
    await readModelDir(dest, { verifyHashes: true });
    const listed = (await call("models.list")).find((m) => m.name === "test--tiny");
    expect(listed).toMatchObject({ loaded: false, isDemo: false, verify: { state: "ok" } });
    expect((await callError("models.install", { ref: "test/tiny" })).code).toBe("model_exists");

    hub.faults.push({
      on: "data",
      minStart: 1,
      action: { kind: "trickle", chunkBytes: 2048, delayMs: 5 },
    });
    const second = await call("models.install", { ref: "test/tiny", name: "tiny-two" });
    await waitEvent(
      isDownload(second.taskId, (x) => x.phase === "downloading" && x.bytesDone > 0),
      from,
    );
    const cancelled = await call("models.cancel", { taskId: second.taskId });
    expect(cancelled.state).toBe("cancelled");
    expect(await hasPartial(join(modelsDir, "tiny-two"))).toBe(false);
    expect(existsSync(join(modelsDir, ".tiny-two.install"))).toBe(false);
    hub.faults.length = 0;
    expect(await call("models.dismiss", { taskId: second.taskId })).toEqual({ ok: true });
    expect((await call("models.downloads")).map((x) => x.taskId)).toEqual([d.taskId]);
  });

  it("models.search: the installed repository with the memory models.list shows; a newer search ends the older", async () => {
    const found = await call("models.search", { query: "tiny" });
    expect(found.endpoint).toBe(hub.url);
    const tiny = found.models.find((m) => m.repo === "test/tiny")!;
    expect(tiny).toMatchObject({ status: "runnable", family: "gemma4", installedAs: "test--tiny" });
    const listed = (await call("models.list")).find((m) => m.name === "test--tiny")!;
    expect(tiny.memoryBytes).toBe(listed.memoryEstimateBytes);
    // The install also writes the chat template it extracts from tokenizer_config.json, which
    // discovery does not fetch: the only difference allowed, and small.
    const templateBytes = listed.sizeBytes - tiny.installBytes!;
    expect(templateBytes).toBeGreaterThanOrEqual(0);
    expect(templateBytes).toBeLessThan(16 * 1024);

    const first = callError("models.search", { query: "tiny" });
    const second = call("models.search", { query: "tiny" });
    expect((await first).code).toBe("search_superseded");
    expect((await second).models.map((m) => m.repo)).toContain("test/tiny");

    hub.faults.push({ on: "api", path: "search", action: { kind: "status", status: 429 } });
    const limited = await callError("models.search", { query: "tiny" });
    hub.faults.length = 0;
    expect(limited.code).toBe("hub_rate_limited");
    expect(limited.message).toMatch(/^The hub at .* is limiting requests \(429/);
  });

  it("installing a checkpoint whose config claims 1e9 layers fails clearly; the app still answers", async () => {
    const ckpt = join(root, "ckpt");
    const files = new Map<string, Buffer>();
    for (const f of await readdir(ckpt)) files.set(f, await readFile(join(ckpt, f)));
    const config = JSON.parse(files.get("config.json")!.toString()) as {
      text_config: Record<string, unknown>;
    };
    config.text_config.num_hidden_layers = 1e9;
    delete config.text_config.layer_types;
    files.set("config.json", Buffer.from(JSON.stringify(config)));
    hub.addRepo("test/huge-layers", files);
    const from = events.length;
    const d = await call("models.install", { ref: "test/huge-layers" });
    const failed = await waitEvent(
      isDownload(d.taskId, (x) => x.state === "failed"),
      from,
    );
    expect(failed.download.error).toMatchObject({ code: "config_invalid" });
    expect(failed.download.error!.message).toMatch(
      /num_hidden_layers is 1000000000, more than Redwing accepts/,
    );
    expect(existsSync(join(modelsDir, "test--huge-layers"))).toBe(false);
    // The app is alive and answers.
    expect((await call("engine.status")).state).toBe("ready");
    expect((await call("models.list")).some((m) => m.name === "test--huge-layers")).toBe(false);
    await call("models.dismiss", { taskId: d.taskId });
  });

  it("verify names a damaged file; a corrupt model is not loaded; remove deletes it", async () => {
    const waitVerify = async (name: string, from: number) =>
      waitEvent(
        (e): e is Extract<AppEvent, { type: "models" }> =>
          e.type === "models" &&
          e.models.some((m) => m.name === name && m.verify.state !== "checking"),
        from,
      );
    let from = events.length;
    expect((await call("models.verify", { name: "demo" })).state).toBe("checking");
    await waitVerify("demo", from);
    expect((await call("models.list")).find((m) => m.name === "demo")?.verify.state).toBe("ok");

    const file = join(modelsDir, "test--tiny", "weights.bin");
    const h = await open(file, "r+");
    const b = Buffer.alloc(1);
    await h.read(b, 0, 1, 100);
    b[0] = b[0]! ^ 0xff;
    await h.write(b, 0, 1, 100);
    await h.close();
    from = events.length;
    await call("models.verify", { name: "test--tiny" });
    await waitVerify("test--tiny", from);
    const state = (await call("models.list")).find((m) => m.name === "test--tiny")!.verify;
    expect(state.state).toBe("corrupt");
    expect(state.message).toMatch(/weights\.bin does not match its checksum/);
    const saved = JSON.parse(await readFile(join(dataDir, "verify.json"), "utf8"));
    expect(saved["test--tiny"].state).toBe("corrupt");

    const refused = await callError("engine.load", { model: "test--tiny" });
    expect(refused).toMatchObject({ code: "model_corrupt", action: "reinstall_model" });
    expect((await call("engine.status")).model).toBe("demo");

    expect(await call("models.remove", { name: "test--tiny" })).toEqual({ ok: true });
    expect(existsSync(join(modelsDir, "test--tiny"))).toBe(false);
    expect((await call("models.list")).map((m) => m.name)).toEqual(["demo"]);
    expect((await callError("models.remove", { name: "nope" })).code).toBe("model_not_found");

    // Removing the loaded model unloads it first; a message then is refused (nothing stored),
    // saying to load a model.
    expect(await call("models.remove", { name: "demo" })).toEqual({ ok: true });
    expect(await call("engine.status")).toMatchObject({ state: "stopped", model: null });
    expect(await call("models.list")).toEqual([]);
    const c = await call("chat.create", {});
    const refusedSend = await callError("chat.send", {
      conversationId: c.id,
      content: "Anyone there?",
    });
    expect(refusedSend).toMatchObject({ code: "no_model", action: "load_model" });
    expect((await call("chat.get", { id: c.id })).messages).toEqual([]);
  });

  it("every event matched the API schema; close stops the engine; settings survive a restart", async () => {
    expect(badEvents).toEqual([]);
    const pid = (await call("engine.status")).pid!;
    await call("settings.update", { sampling: { temperature: 1.1 }, systemPrompt: "Be kind." });
    await app.close();
    expect(() => process.kill(pid, 0)).toThrow(); // the service is gone
    app = await createAppController({
      shell: "web",
      dataDir,
      modelsDir,
      autoLoad: false,
      power: null,
      log: (line) => logs.push(line),
    });
    const s = await call("settings.get");
    expect(s.sampling.temperature).toBe(1.1);
    expect(s.systemPrompt).toBe("Be kind.");
    expect((await call("chat.list")).length).toBeGreaterThanOrEqual(5);
  });
});
