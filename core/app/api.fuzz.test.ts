/**
 * Property-based fuzzing of web mode's API surface: `parseCall` (shared with the Electron IPC
 * handler) and the HTTP layer of web.ts. Arbitrary method names and params never throw; arbitrary
 * spellings of paths never reach the backend without the token and never answer 5xx. Runs:
 * testkit/fuzz.ts (FUZZ_RUNS for a long run).
 */
import { request as httpRequest } from "node:http";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { corpus, fuzz } from "../../testkit/fuzz.ts";
import { API, isMethod, parseCall, type AppBackend, type AppEvent, type Method } from "./api.ts";
import { startWebServer, type WebServer } from "./web.ts";

const METHODS = Object.keys(API) as Method[];

/** Answers `{}` to every call and records it. */
class RecordingBackend implements AppBackend {
  calls: string[] = [];
  listeners = 0;
  async call(method: Method): Promise<never> {
    this.calls.push(method);
    return {} as never;
  }
  subscribe(_listener: (event: AppEvent) => void): () => void {
    this.listeners++;
    return () => this.listeners--;
  }
}

const methodName = fc.oneof(
  fc.constantFrom(...METHODS),
  fc.constantFrom("__proto__", "constructor", "toString", "hasOwnProperty", ""),
  fc.string({ maxLength: 30 }),
);
const params = fc.oneof(
  fc.jsonValue(),
  fc.object(),
  fc.dictionary(
    fc.constantFrom("name", "ref", "id", "conversationId", "content", "taskId", "engine"),
    fc.jsonValue(),
  ),
);

describe("parseCall (fuzz)", () => {
  it("any method name and params: a validated call or a clear error, never a throw", async () => {
    await fuzz(
      "parseCall",
      fc.record({ method: methodName, params }),
      ({ method, params: p }) => {
        const r = parseCall(method, p);
        if (r.ok) {
          expect(isMethod(r.method)).toBe(true);
          expect(r.method).toBe(method);
        } else {
          expect(["unknown_method", "bad_request"]).toContain(r.error.code);
          expect(r.error.message.length).toBeGreaterThan(0);
        }
      },
      { runs: 5000, examples: corpus("web-call") },
    );
  });
});

/** Characters legal in a request target, and how each may be spelled. */
const PATH_CHARS = [..."abcdefghijklmnopqrstuvwxyzAPI0123456789-._~!$&'()*+,;=:@/"];
/** Mostly the character itself, sometimes another spelling (so that whole paths still route). */
function spelled(c: string): fc.Arbitrary<string> {
  const hex = c.charCodeAt(0).toString(16).padStart(2, "0");
  return fc.oneof(
    { weight: 12, arbitrary: fc.constant(c) },
    { weight: 2, arbitrary: fc.constantFrom(`%${hex}`, `%${hex.toUpperCase()}`) },
    { weight: 1, arbitrary: fc.constantFrom(c.toUpperCase(), `%25${hex}`) },
  );
}
/** An API path with every character possibly re-spelled, and noise segments around it. */
const apiPath = fc
  .tuple(
    fc.constantFrom(
      ...METHODS.map((m) => `/api/call/${m}`),
      "/api/events",
      "/api/call/x",
      "/api/",
      "/",
    ),
    fc.oneof(
      { weight: 6, arbitrary: fc.constant("") },
      {
        weight: 1,
        arbitrary: fc.constantFrom("/", "//", "/./", "/x/../", "/%2e/", "/.%2e/api/../"),
      },
    ),
    fc.oneof(
      { weight: 4, arbitrary: fc.constantFrom("", "?", "?token=x") },
      { weight: 1, arbitrary: fc.constantFrom("/", "#", "%00", "%2F", ";", "/..") },
    ),
  )
  .chain(([path, prefix, suffix]) =>
    fc
      .tuple(...[...path.slice(1)].map(spelled))
      .map((chars) => `${prefix.replace(/\/$/, "")}/${chars.join("")}${suffix}`),
  );
const rawPath = fc
  .array(fc.constantFrom(...PATH_CHARS, "%2e", "%2f", "%00", "%ff", "%", "%zz"), {
    maxLength: 40,
  })
  .map((cs) => `/${cs.join("")}`);

interface Answer {
  status: number;
  body: string;
  type?: string;
}

function send(server: WebServer, method: string, path: string, body?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: "127.0.0.1",
        port: server.port,
        method,
        path,
        headers: body === undefined ? {} : { "content-type": "application/json" },
      },
      (res) => {
        let text = "";
        const done = (): void => {
          resolve({ status: res.statusCode ?? 0, body: text, type: res.headers["content-type"] });
          req.destroy();
        };
        res.setEncoding("utf8");
        res.on("data", (c: string) => {
          text += c;
          if (String(res.headers["content-type"]).includes("event-stream")) done();
        });
        res.on("end", done);
        res.on("error", done);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

describe("web mode HTTP layer (fuzz)", () => {
  let backend: RecordingBackend;
  let server: WebServer;
  beforeAll(async () => {
    backend = new RecordingBackend();
    // No built renderer: the fallback page answers static paths.
    server = await startWebServer({ backend, staticDir: "/nonexistent", log: () => {} });
  });
  afterAll(async () => {
    await server?.close();
  });

  it("no path spelling reaches the backend without the token; none answers 5xx but the page", async () => {
    await fuzz(
      "web path without token",
      fc.record({
        method: fc.constantFrom("GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"),
        path: fc.oneof(apiPath, rawPath),
      }),
      async ({ method, path }) => {
        // Per run, so that a failure is this input's (and shrinks to it).
        backend.calls = [];
        const r = await send(server, method, path, method === "POST" ? "{}" : undefined);
        await new Promise((resolve) => setImmediate(resolve));
        expect(backend.calls, `${method} ${path}`).toEqual([]);
        expect(backend.listeners, `${method} ${path}`).toBe(0);
        // 500 only for the "UI is not built" page, which holds no data.
        if (r.status >= 500) expect(r.type, `${method} ${path}`).toMatch(/^text\/html/);
        expect(r.body).not.toContain('"ok":true');
      },
      { runs: 400, examples: corpus("web-path") },
    );
  });

  it("with the token, any method name and params: 200, or a 4xx with an AppError", async () => {
    await fuzz(
      "web call with token",
      fc.record({ method: methodName, params }),
      async ({ method, params: p }) => {
        const before = backend.calls.length;
        const r = await new Promise<Answer>((resolve, reject) => {
          const req = httpRequest(
            {
              host: "127.0.0.1",
              port: server.port,
              method: "POST",
              path: `/api/call/${encodeURIComponent(method)}`,
              headers: {
                authorization: `Bearer ${server.token}`,
                "content-type": "application/json",
              },
            },
            (res) => {
              let text = "";
              res.setEncoding("utf8");
              res.on("data", (c: string) => (text += c));
              res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
            },
          );
          req.on("error", reject);
          req.end(JSON.stringify(p));
        });
        // What the server sees: JSON drops keys whose value is undefined.
        const parsed = parseCall(method, JSON.parse(JSON.stringify(p)) as unknown);
        if (parsed.ok) {
          expect(r.status).toBe(200);
          expect(backend.calls.length).toBe(before + 1);
        } else {
          expect(r.status).toBeGreaterThanOrEqual(400);
          expect(r.status).toBeLessThan(500);
          expect(JSON.parse(r.body)).toMatchObject({
            ok: false,
            error: { code: expect.any(String) },
          });
          expect(backend.calls.length).toBe(before);
        }
      },
      { runs: 300, examples: corpus("web-call") },
    );
  });
});
