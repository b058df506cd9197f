/**
 * Web mode's transport against a fake backend, over real HTTP on loopback: the token, Host and
 * Origin checks must stop a request before the backend sees it; calls are validated like the
 * Electron IPC path; the event stream starts with the current state and follows the backend.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { runningDownload } from "../../testkit/download.ts";
import { UserError } from "../errors.ts";
import {
  DEFAULT_SETTINGS,
  SERVER_OFF,
  type AppBackend,
  type AppEvent,
  type Download,
  type EngineStatus,
  type Method,
  type Result,
} from "./api.ts";
import { CONTENT_SECURITY_POLICY } from "./csp.ts";
import { startWebServer, type WebServer } from "./web.ts";

const ENGINE: EngineStatus = {
  state: "ready",
  model: "demo",
  pid: 1234,
  loadFraction: null,
  loadedWith: DEFAULT_SETTINGS.engine,
  expertCacheSlots: 16,
  reloadNeeded: true,
  memory: null,
  error: null,
};

/** Records every call; answers from `answers` (a function may throw). */
class FakeBackend implements AppBackend {
  calls: { method: string; params: unknown }[] = [];
  listeners = new Set<(event: AppEvent) => void>();
  /** Resolves snapshot calls only when released (to publish events in between). */
  gate: Promise<void> | null = null;
  answers: Partial<Record<Method, (params: unknown) => unknown>> = {
    "settings.get": () => DEFAULT_SETTINGS,
    "models.list": () => [],
    "engine.status": () => ENGINE,
    "server.status": () => SERVER_OFF,
    "chat.list": () => [
      { id: "c1", title: "Hello", updatedAt: "2026-01-01", messageCount: 2, pinned: false },
    ],
    "models.downloads": () => [runningDownload("a"), runningDownload("b")],
    "chat.rename": (p) => ({ renamed: p }),
  };

  async call<M extends Method>(method: M, params: unknown): Promise<Result<M>> {
    this.calls.push({ method, params });
    if (this.gate) await this.gate;
    const answer = this.answers[method];
    if (!answer) throw new Error(`fake backend: no answer for ${method}`);
    return answer(params) as Result<M>;
  }

  subscribe(listener: (event: AppEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  publish(event: AppEvent): void {
    for (const l of this.listeners) l(event);
  }
}

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  text: string;
  json: unknown;
}

function request(
  server: WebServer,
  options: { method?: string; path: string; headers?: Record<string, string>; body?: string },
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      `${server.origin}${options.path}`,
      { method: options.method ?? "GET", headers: options.headers },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString();
          let json: unknown = null;
          try {
            json = JSON.parse(text);
          } catch {
            // not JSON (HTML)
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
        });
      },
    );
    req.on("error", reject);
    req.end(options.body);
  });
}

function call(
  server: WebServer,
  method: string,
  params?: unknown,
  headers: Record<string, string> = {},
): Promise<Answer> {
  return request(server, {
    method: "POST",
    path: `/api/call/${method}`,
    headers: {
      authorization: `Bearer ${server.token}`,
      "content-type": "application/json",
      ...headers,
    },
    body: params === undefined ? undefined : JSON.stringify(params),
  });
}

/** Opens the event stream and collects events as they arrive. */
function openEvents(server: WebServer, token = server.token) {
  const events: AppEvent[] = [];
  let raw = "";
  let response: IncomingMessage | null = null;
  const waiters: (() => void)[] = [];
  const req = httpRequest(`${server.origin}/api/events?token=${token}`);
  const opened = new Promise<IncomingMessage>((resolve, reject) => {
    req.on("response", (res) => {
      response = res;
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        raw += chunk;
        let end: number;
        while ((end = raw.indexOf("\n\n")) >= 0) {
          const block = raw.slice(0, end);
          raw = raw.slice(end + 2);
          for (const line of block.split("\n")) {
            if (line.startsWith("data: ")) events.push(JSON.parse(line.slice(6)) as AppEvent);
          }
        }
        for (const w of waiters.splice(0)) w();
      });
      resolve(res);
    });
    req.on("error", reject);
  });
  req.end();
  const until = async (n: number, ms = 5000): Promise<AppEvent[]> => {
    const deadline = Date.now() + ms;
    while (events.length < n) {
      if (Date.now() > deadline) throw new Error(`got ${events.length} events, wanted ${n}`);
      await new Promise<void>((r) => {
        waiters.push(r);
        setTimeout(r, 50);
      });
    }
    return events;
  };
  return { events, opened, until, close: () => req.destroy(), response: () => response };
}

async function waitFor(check: () => boolean, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 10));
  }
}

let dist: string;
let backend: FakeBackend;
let server: WebServer;
const others: WebServer[] = [];

beforeAll(async () => {
  dist = await mkdtemp(join(tmpdir(), "redwing-web-"));
  await writeFile(join(dist, "index.html"), "<!doctype html><title>Redwing</title>");
  await writeFile(join(dist, "app.js"), "console.log(1)");
});

afterAll(async () => {
  await rm(dist, { recursive: true, force: true });
});

async function start(options: Partial<Parameters<typeof startWebServer>[0]> = {}) {
  backend = new FakeBackend();
  server = await startWebServer({ backend, staticDir: dist, log: () => {}, ...options });
  others.push(server);
  return server;
}

afterEach(async () => {
  await Promise.all(others.splice(0).map((s) => s.close()));
});

describe("startWebServer", () => {
  it("listens on loopback and prints a URL that carries a fresh 32-hex token", async () => {
    const a = await start();
    expect(a.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/#token=[0-9a-f]{32}$/);
    expect(a.url).toBe(`${a.origin}/#token=${a.token}`);
    const b = await start();
    expect(b.token).not.toBe(a.token);
    expect(b.port).not.toBe(a.port);
  });

  it("refuses to bind anything but loopback", async () => {
    await expect(
      startWebServer({ backend: new FakeBackend(), host: "0.0.0.0", staticDir: dist }),
    ).rejects.toThrow(/only listens on this machine.*not on 0\.0\.0\.0/);
    await expect(
      startWebServer({ backend: new FakeBackend(), host: "192.168.1.10", staticDir: dist }),
    ).rejects.toBeInstanceOf(UserError);
  });

  it("serves the renderer without a token, with CSP and nosniff headers", async () => {
    await start();
    const page = await request(server, { path: "/" });
    expect(page.status).toBe(200);
    expect(page.text).toContain("<title>Redwing</title>");
    expect(page.headers["content-security-policy"]).toBe(CONTENT_SECURITY_POLICY);
    expect(page.headers["content-security-policy"]).toContain("script-src 'self'");
    expect(page.headers["x-content-type-options"]).toBe("nosniff");
    const js = await request(server, { path: "/app.js" });
    expect(js.status).toBe(200);
    expect(js.headers["content-type"]).toMatch(/javascript/);
    expect(js.headers["x-content-type-options"]).toBe("nosniff");
    expect((await request(server, { path: "/nothing.js" })).status).toBe(404);
    expect(backend.calls).toEqual([]);
  });

  it("answers a clear page when the renderer is not built", async () => {
    await start({ staticDir: join(dist, "missing") });
    const page = await request(server, { path: "/" });
    expect(page.status).toBe(500);
    expect(page.headers["content-type"]).toMatch(/text\/html/);
    expect(page.text).toContain("npm run setup");
    // The API still works (the page is only about the static files).
    expect((await call(server, "engine.status")).status).toBe(200);
  });
});

describe("POST /api/call/:method", () => {
  it("round-trips a call: params validated, result wrapped", async () => {
    await start();
    const r = await call(server, "chat.rename", { id: "c1", title: "New title" });
    expect(r.status).toBe(200);
    expect(r.headers["cache-control"]).toBe("no-store");
    expect(r.json).toEqual({ ok: true, result: { renamed: { id: "c1", title: "New title" } } });
    expect(backend.calls).toEqual([
      { method: "chat.rename", params: { id: "c1", title: "New title" } },
    ]);
  });

  it("takes a call without a body as a call without params", async () => {
    await start();
    const r = await call(server, "settings.get");
    expect(r.status).toBe(200);
    expect(r.json).toEqual({ ok: true, result: DEFAULT_SETTINGS });
    const bare = await request(server, {
      method: "POST",
      path: "/api/call/engine.status",
      headers: { authorization: `Bearer ${server.token}` },
    });
    expect(bare.json).toEqual({ ok: true, result: ENGINE });
    expect(backend.calls.map((c) => c.params)).toEqual([{}, {}]);
  });

  it("401 without the token or with a wrong one, and the backend is never called", async () => {
    await start();
    const none = await request(server, {
      method: "POST",
      path: "/api/call/settings.get",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(none.status).toBe(401);
    expect(none.json).toMatchObject({ ok: false, error: { code: "unauthorized" } });
    const wrong = await call(
      server,
      "settings.get",
      {},
      { authorization: `Bearer ${"0".repeat(32)}` },
    );
    expect(wrong.status).toBe(401);
    expect((wrong.json as { error: { message: string } }).error.message).toMatch(/wrong token/);
    const short = await call(server, "settings.get", {}, { authorization: "Bearer abc" });
    expect(short.status).toBe(401);
    const basic = await call(
      server,
      "settings.get",
      {},
      { authorization: `Basic ${server.token}` },
    );
    expect(basic.status).toBe(401);
    // The token in the query string is only for the event stream.
    const query = await request(server, {
      method: "POST",
      path: `/api/call/settings.get?token=${server.token}`,
    });
    expect(query.status).toBe(401);
    expect(backend.calls).toEqual([]);
  });

  it("403 for a foreign Host header (DNS rebinding), on the API and on static files", async () => {
    await start();
    const evil = await call(server, "settings.get", {}, { host: `evil.example:${server.port}` });
    expect(evil.status).toBe(403);
    expect(evil.json).toMatchObject({ ok: false, error: { code: "forbidden" } });
    const wrongPort = await call(
      server,
      "settings.get",
      {},
      { host: `127.0.0.1:${server.port + 1}` },
    );
    expect(wrongPort.status).toBe(403);
    expect((await request(server, { path: "/", headers: { host: "evil.example" } })).status).toBe(
      403,
    );
    expect(backend.calls).toEqual([]);
    for (const host of [`localhost:${server.port}`, `[::1]:${server.port}`]) {
      expect((await call(server, "settings.get", {}, { host })).status).toBe(200);
    }
  });

  it("403 for a foreign Origin; the page's own origin is fine", async () => {
    await start();
    for (const origin of ["http://evil.example", `http://localhost:${server.port + 1}`, "null"]) {
      const r = await call(server, "settings.get", {}, { origin });
      expect(r.status, origin).toBe(403);
    }
    expect(backend.calls).toEqual([]);
    expect((await call(server, "settings.get", {}, { origin: server.origin })).status).toBe(200);
  });

  it("400 with a clear message for an unknown method, bad params or bad JSON", async () => {
    await start();
    const unknown = await call(server, "engine.explode", {});
    expect(unknown.status).toBe(400);
    expect(unknown.json).toEqual({
      ok: false,
      error: { code: "unknown_method", message: 'unknown call "engine.explode"', action: null },
    });
    const bad = await call(server, "chat.rename", { id: "c1", title: "" });
    expect(bad.status).toBe(400);
    expect(bad.json).toMatchObject({ error: { code: "bad_request" } });
    expect((bad.json as { error: { message: string } }).error.message).toMatch(
      /^invalid chat\.rename call: title: /,
    );
    const extra = await call(server, "settings.get", { surprise: 1 });
    expect(extra.status).toBe(400);
    const json = await request(server, {
      method: "POST",
      path: "/api/call/settings.get",
      headers: { authorization: `Bearer ${server.token}`, "content-type": "application/json" },
      body: "{not json",
    });
    expect(json.status).toBe(400);
    expect((json.json as { error: { message: string } }).error.message).toMatch(/not valid JSON/);
    expect(backend.calls).toEqual([]);
  });

  it("413 for a body over the limit", async () => {
    await start({ bodyLimit: 1000 });
    const r = await call(server, "chat.rename", { id: "c1", title: "x".repeat(2000) });
    expect(r.status).toBe(413);
    expect(r.json).toMatchObject({ ok: false, error: { code: "body_too_large" } });
    expect(backend.calls).toEqual([]);
  });

  it("maps backend errors to AppErrors: user errors keep their message, others are 500", async () => {
    await start();
    backend.answers["chat.get"] = () => {
      throw new UserError("no conversation c9", "conversation_not_found");
    };
    const missing = await call(server, "chat.get", { id: "c9" });
    expect(missing.status).toBe(404);
    expect(missing.json).toMatchObject({
      ok: false,
      error: {
        code: "conversation_not_found",
        message: expect.stringMatching(/no conversation c9/i),
      },
    });
    backend.answers["engine.reload"] = () => {
      throw new TypeError("boom");
    };
    const internal = await call(server, "engine.reload", {});
    expect(internal.status).toBe(500);
    expect((internal.json as { ok: boolean }).ok).toBe(false);
  });
});

describe("GET /api/events", () => {
  it("needs the token in the query", async () => {
    await start();
    const r = await request(server, { path: "/api/events" });
    expect(r.status).toBe(401);
    const wrong = await request(server, { path: `/api/events?token=${"f".repeat(32)}` });
    expect(wrong.status).toBe(401);
    expect(backend.listeners.size).toBe(0);
  });

  /** What a new event stream gets first: the state of each part, one event per download. */
  const SNAPSHOT_TYPES = [
    "settings",
    "models",
    "engine",
    "server",
    "conversations",
    "download",
    "download",
  ];

  it("sends the current state first, then every published event", async () => {
    await start();
    const stream = openEvents(server);
    const res = await stream.opened;
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toBe("text/event-stream; charset=utf-8");
    const snapshot = await stream.until(7);
    expect(snapshot.map((e) => e.type)).toEqual(SNAPSHOT_TYPES);
    expect(snapshot[0]).toEqual({
      type: "settings",
      settings: DEFAULT_SETTINGS,
      reloadNeeded: true,
    });
    expect(snapshot[2]).toEqual({ type: "engine", status: ENGINE });
    expect(snapshot.slice(5).map((e) => (e as { download: Download }).download.taskId)).toEqual([
      "a",
      "b",
    ]);
    expect(new Set(backend.calls.map((c) => c.method))).toEqual(
      new Set([
        "settings.get",
        "models.list",
        "engine.status",
        "server.status",
        "chat.list",
        "models.downloads",
      ]),
    );
    const delta: AppEvent = {
      type: "chat.delta",
      conversationId: "c1",
      messageId: "m1",
      text: "Hi",
    };
    backend.publish(delta);
    backend.publish({ ...delta, text: " there" });
    const all = await stream.until(9);
    expect(all.slice(7)).toEqual([delta, { ...delta, text: " there" }]);
    stream.close();
  });

  it("keeps events published while the snapshot is gathered, after the snapshot", async () => {
    await start();
    let release!: () => void;
    backend.gate = new Promise<void>((r) => (release = r));
    const stream = openEvents(server);
    await stream.opened;
    await waitFor(() => backend.listeners.size === 1 && backend.calls.length === 6);
    const early: AppEvent = { type: "chat.delta", conversationId: "c", messageId: "m", text: "x" };
    backend.publish(early);
    release();
    const events = await stream.until(8);
    expect(events.map((e) => e.type)).toEqual([...SNAPSHOT_TYPES, "chat.delta"]);
    stream.close();
  });

  it("a snapshot call that fails is left out; the stream stays up", async () => {
    await start();
    backend.answers["server.status"] = () => {
      throw new Error("no server module");
    };
    const stream = openEvents(server);
    const events = await stream.until(6);
    expect(events.map((e) => e.type)).not.toContain("server");
    backend.publish({ type: "conversations", conversations: [] });
    await stream.until(7);
    stream.close();
  });

  it("sends a ping comment on the interval", async () => {
    await start({ pingIntervalMs: 50 });
    const stream = openEvents(server);
    const res = await stream.opened;
    let text = "";
    res.on("data", (c: string) => (text += c));
    await waitFor(() => (text.match(/: ping\n\n/g) ?? []).length >= 2);
    stream.close();
  });

  it("unsubscribes when the client disconnects", async () => {
    await start();
    const a = openEvents(server);
    const b = openEvents(server);
    await Promise.all([a.until(7), b.until(7)]);
    expect(backend.listeners.size).toBe(2);
    a.close();
    await waitFor(() => backend.listeners.size === 1);
    backend.publish({ type: "conversations", conversations: [] });
    await b.until(8);
    b.close();
    await waitFor(() => backend.listeners.size === 0);
  });

  it("close() ends open streams and returns", async () => {
    await start();
    const stream = openEvents(server);
    const res = await stream.opened;
    await stream.until(7);
    const ended = new Promise<void>((r) => res.on("close", () => r()));
    await server.close();
    await ended;
    expect(backend.listeners.size).toBe(0);
  });
});

/**
 * Sends `path` exactly as written (no URL parsing, which would normalise `/./` and `..`), and
 * answers the status and up to 64 KiB of the body; an event stream is cut after its first chunk.
 */
function rawRequest(
  server: WebServer,
  options: { method: string; path: string; headers?: Record<string, string>; body?: string },
): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: "127.0.0.1",
        port: server.port,
        method: options.method,
        path: options.path,
        headers: options.headers,
      },
      (res) => {
        let text = "";
        const done = (): void => {
          resolve({ status: res.statusCode ?? 0, text });
          req.destroy();
        };
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => {
          text += chunk;
          if (text.length > 65536 || String(res.headers["content-type"]).includes("event-stream"))
            done();
        });
        res.on("end", done);
        res.on("error", done);
      },
    );
    req.on("error", reject);
    req.end(options.body);
  });
}

/** Spellings of `/api/...` that a router might decode, fold or normalise to the real route. */
function spellings(rest: string): string[] {
  return [
    `/api/${rest}`,
    `/%61pi/${rest}`,
    `/%61%70%69/${rest}`,
    `/%41PI/${rest}`,
    `/ap%69/${rest}`,
    `/api%2F${rest}`,
    `/API/${rest}`,
    `/Api/${rest}`,
    `//api/${rest}`,
    `/api//${rest}`,
    `/./api/${rest}`,
    `/api/./${rest}`,
    `/api/../api/${rest}`,
    `/x/../api/${rest}`,
    `/%2e/api/${rest}`,
    `/api/${rest}/`,
    `/api/${rest}%2F`,
    `/api/${rest}%20`,
    `/api/${rest}%00`,
    `/api/${rest};x`,
    `/api/${rest}#x`,
    `/api/${[...rest].map((c) => `%${c.charCodeAt(0).toString(16)}`).join("")}`,
    `/%2561pi/${rest}`,
  ];
}

describe("the token check cannot be walked around by spelling the path differently", () => {
  it("no spelling of /api/call/<method> reaches the backend without the token", async () => {
    await start();
    const reached: string[] = [];
    for (const path of spellings("call/engine.status")) {
      const before = backend.calls.length;
      const r = await rawRequest(server, {
        method: "POST",
        path,
        headers: { "content-type": "application/json" },
        body: "{}",
      });
      if (backend.calls.length > before || r.status < 400) reached.push(`${path} -> ${r.status}`);
      else expect(r.status >= 400 && r.status < 500, `${path} -> ${r.status}`).toBe(true);
    }
    expect(reached).toEqual([]);
    expect(backend.calls).toEqual([]);
  });

  it("no spelling of /api/events opens the stream without the token", async () => {
    await start();
    const reached: string[] = [];
    for (const path of spellings("events")) {
      const r = await rawRequest(server, { method: "GET", path });
      if (backend.listeners.size > 0 || r.status < 400) reached.push(`${path} -> ${r.status}`);
      else expect(r.status >= 400 && r.status < 500, `${path} -> ${r.status}`).toBe(true);
      await waitFor(() => backend.listeners.size === 0);
    }
    expect(reached).toEqual([]);
    expect(backend.calls).toEqual([]);
  });

  it("a spelling that routes to the API works with the token, like the plain one", async () => {
    await start();
    const auth = { authorization: `Bearer ${server.token}`, "content-type": "application/json" };
    const plain = await rawRequest(server, {
      method: "POST",
      path: "/api/call/settings.get",
      headers: auth,
      body: "{}",
    });
    const encoded = await rawRequest(server, {
      method: "POST",
      path: "/%61pi/call/settings.get",
      headers: auth,
      body: "{}",
    });
    expect(plain.status).toBe(200);
    expect(encoded.status).toBe(200);
    expect(JSON.parse(encoded.text)).toEqual(JSON.parse(plain.text));
  });

  it("an unknown route needs the token too (deny by default), and then answers 404", async () => {
    await start();
    const none = await rawRequest(server, { method: "POST", path: "/api/nothing" });
    expect(none.status).toBe(401);
    const withToken = await rawRequest(server, {
      method: "POST",
      path: "/api/nothing",
      headers: { authorization: `Bearer ${server.token}` },
    });
    expect(withToken.status).toBe(404);
  });
});

describe("model names", () => {
  it("a NUL, a control character or a leading dot in a model name is a clear 400", async () => {
    await start();
    const bad = ["a\u0000b", "\u0000", "x\ny", ".tiny.install", ".hidden", ".", ".."];
    for (const name of bad) {
      for (const [method, params] of [
        ["models.remove", { name }],
        ["models.verify", { name }],
        ["models.install", { ref: "test/tiny", name }],
      ] as const) {
        const r = await call(server, method, params);
        expect(r.status, `${method} ${JSON.stringify(name)}`).toBe(400);
        expect(r.json).toMatchObject({ ok: false, error: { code: "bad_request" } });
      }
    }
    expect(backend.calls).toEqual([]);
  });
});
