/**
 * The app's OpenAI-compatible server (core/app/server.ts) through the app controller, with the
 * real decode service and the demo model: the fields a request leaves out come from the app's
 * Tuning settings, requests are listed and can be cancelled, and the server keeps answering
 * (503, then 200 again) when the engine crashes and restarts.
 */
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { EngineClient, type GenerateParams } from "../engine/index.ts";
import { nativeBuildDir } from "../native.ts";
import { appCalls } from "../../testkit/app-calls.ts";
import { freePort } from "../../testkit/free-port.ts";
import { EXAMPLE_MAX_TOKENS, type AppEvent } from "./api.ts";
import { createAppController, type AppController } from "./controller.ts";

const haveService = existsSync(join(nativeBuildDir(), "redwing-service"));

let root: string;
let app: AppController;
const events: AppEvent[] = [];

const { call } = appCalls(() => app);

async function until(condition: () => boolean | Promise<boolean>, timeoutMs = 20_000) {
  const start = Date.now();
  while (!(await condition())) {
    if (Date.now() - start > timeoutMs) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 20));
  }
}

function chatRequest(url: string, body: Record<string, unknown>): Promise<Response> {
  return fetch(`${url}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "demo", messages: [{ role: "user", content: "Hi" }], ...body }),
  });
}

describe.skipIf(!haveService)("the app's server (real engine, demo model)", () => {
  let url: string;

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "redwing-app-server-"));
    app = await createAppController({
      shell: "web",
      dataDir: join(root, "data"),
      modelsDir: join(root, "models"),
      power: null,
      liveIntervalMs: 100,
      log: () => undefined,
    });
    app.subscribe((e) => events.push(e));
    await app.ready;
    const on = await call("server.set", { enabled: true, port: await freePort() });
    url = on.url!;
  }, 120_000);

  afterAll(async () => {
    await app?.close();
    await rm(root, { recursive: true, force: true });
  });

  afterEach(() => vi.restoreAllMocks());

  it("fills left-out sampling fields from the Tuning settings and caps an absent max_tokens", async () => {
    await call("settings.update", {
      sampling: { topK: 7, topP: 0.5, temperature: 0.3, repetitionPenalty: 1.25, maxNewTokens: 9 },
    });
    const seen: GenerateParams[] = [];
    const original = EngineClient.prototype.generate;
    vi.spyOn(EngineClient.prototype, "generate").mockImplementation(function (
      this: EngineClient,
      ...args: Parameters<EngineClient["generate"]>
    ) {
      seen.push(args[0]);
      return original.apply(this, args);
    });
    const res = await chatRequest(url, { ignore_eos: true });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { usage: { completion_tokens: number } };
    expect(seen).toHaveLength(1);
    expect(seen[0]!.sampling).toMatchObject({
      top_k: 7,
      top_p: 0.5,
      temperature: 0.3,
      repetition_penalty: 1.25,
    });
    expect(seen[0]!.max_new_tokens).toBe(9);
    expect(body.usage.completion_tokens).toBe(9);

    // A field the request names wins over the app's value.
    const named = await chatRequest(url, { top_k: 3, temperature: 0, max_tokens: 2 });
    expect(named.status).toBe(200);
    expect(seen[1]!.sampling).toMatchObject({ top_k: 3, temperature: 0, top_p: 0.5 });
    expect(seen[1]!.max_new_tokens).toBe(2);
  });

  it("lists running and queued requests with their client and tokens, and cancels them", async () => {
    await call("settings.update", { sampling: { maxNewTokens: 3000 } });
    const long = { ignore_eos: true, max_tokens: 3000 };
    const first = chatRequest(url, long);
    await until(async () => {
      const r = (await call("server.status")).requests;
      return r.length === 1 && r[0]!.state === "running" && r[0]!.tokens > 0;
    });
    const second = chatRequest(url, long);
    await until(async () => (await call("server.status")).requests.length === 2);
    const [running, queued] = (await call("server.status")).requests;
    expect(running).toMatchObject({ endpoint: "chat", state: "running", maxTokens: 3000 });
    expect(running!.client).toMatch(/^(127\.0\.0\.1|::ffff:127\.0\.0\.1|::1):\d+$/);
    expect(queued).toMatchObject({ state: "queued", tokens: 0 });
    // The app's status events carry the progress too.
    expect(
      events.some((e) => e.type === "server" && e.status.requests.some((r) => r.tokens > 0)),
    ).toBe(true);

    expect(await call("server.cancel", { id: queued!.id })).toEqual({ ok: true });
    const queuedAnswer = await second;
    expect(queuedAnswer.status).toBe(503);
    expect(((await queuedAnswer.json()) as { error: { code: string } }).error.code).toBe(
      "request_cancelled",
    );
    expect(await call("server.cancel", { id: running!.id })).toEqual({ ok: true });
    const runningAnswer = await first;
    expect(runningAnswer.status).toBe(503);
    await until(async () => (await call("server.status")).requests.length === 0);
    await expect(call("server.cancel", { id: running!.id })).rejects.toMatchObject({
      message: expect.stringMatching(/already finished/),
    });
  });

  it("answers 503 with Retry-After while the engine restarts after a crash, then serves again", async () => {
    await call("settings.update", { sampling: { maxNewTokens: 3000 } });
    const inFlight = chatRequest(url, { ignore_eos: true, max_tokens: 3000 });
    await until(async () => (await call("server.status")).requests[0]?.state === "running");
    const pid = (await call("engine.status")).pid!;
    process.kill(pid, "SIGKILL");
    const failed = await inFlight;
    expect(failed.status).toBeGreaterThanOrEqual(500);

    // The server stays up; until the model is back it answers 503 with Retry-After.
    let sawUnavailable = false;
    await until(async () => {
      const res = await chatRequest(url, { max_tokens: 2 });
      if (res.status === 503) {
        sawUnavailable = true;
        expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(0);
      }
      await res.body?.cancel();
      return res.status === 200;
    }, 60_000);
    expect(sawUnavailable).toBe(true);
    const engine = await call("engine.status");
    expect(engine.state).toBe("ready");
    expect(engine.pid).not.toBe(pid); // a new engine, restarted without anyone pressing a button
    expect((await call("server.status")).unavailable).toBeNull();
  }, 90_000);

  it("shows an example that asks for a bounded answer", async () => {
    const status = await call("server.status");
    expect(status.example).toContain(`"max_tokens":${EXAMPLE_MAX_TOKENS}`);
  });
});
