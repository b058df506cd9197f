/**
 * Web mode's transport (`redwing ui`): the renderer in a browser talks to the same `AppBackend`
 * the Electron main process uses, over HTTP and server-sent events, on loopback only.
 *
 * - `GET /` and the static files of `renderer/dist/` need no token (they hold no data); every
 *   response carries a strict Content-Security-Policy and `X-Content-Type-Options: nosniff`.
 * - `POST /api/call/<method>` with `Authorization: Bearer <token>` and the params as a JSON body
 *   answers `{ok: true, result}` or `{ok: false, error: AppError}`; params are validated with
 *   `parseCall`, the same check the Electron IPC handler makes.
 * - `GET /api/events?token=<token>` is an event stream (EventSource cannot send headers): first
 *   the current state (settings, models, engine, server, conversations, downloads), then every
 *   event the backend publishes; a `: ping` comment every 15 s keeps proxies and idle timers off.
 *
 * The token is random per launch and travels in the URL's fragment (never sent to the server by
 * the browser, never in logs). Host and Origin headers are checked on every request so a page on
 * another site cannot reach the server through DNS rebinding or a cross-site form.
 */
import { randomBytes, timingSafeEqual } from "node:crypto";
import { existsSync } from "node:fs";
import type { ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import fastifyStatic from "@fastify/static";
import Fastify, { type FastifyReply, type FastifyRequest } from "fastify";
import { UserError } from "../errors.ts";
import { parseCall, type AppBackend, type AppError, type AppEvent, type Method } from "./api.ts";
import { toAppError } from "./errors.ts";
import { CONTENT_SECURITY_POLICY } from "./csp.ts";

export const DEFAULT_UI_HOST = "127.0.0.1";
/** 0: any free port (the URL carries a fresh token each launch, so a fixed port buys nothing). */
export const DEFAULT_UI_PORT = 0;
/** Largest request body; the biggest params are a chat message or a system prompt. */
export const DEFAULT_BODY_LIMIT = 4 * 1024 * 1024;
/** Interval of the SSE keep-alive comment. */
export const PING_INTERVAL_MS = 15_000;
/** A client that lets this much event data pile up unread is dropped (it reconnects). */
const MAX_SSE_BACKLOG_BYTES = 8 * 1024 * 1024;

/** Where `npm run setup` builds the renderer. */
export const RENDERER_DIST = fileURLToPath(new URL("../../renderer/dist", import.meta.url));

const SECURITY_HEADERS: Record<string, string> = {
  "content-security-policy": CONTENT_SECURITY_POLICY,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
};

export interface WebServerOptions {
  backend: AppBackend;
  /** A loopback address: 127.0.0.1 (default), ::1 or localhost. */
  host?: string;
  /** 0 (default): any free port. */
  port?: number;
  /** The built renderer (default renderer/dist of this checkout). */
  staticDir?: string;
  /** The secret the renderer must present (default: 16 random bytes, hex). */
  token?: string;
  bodyLimit?: number;
  pingIntervalMs?: number;
  /** Called with problems that have nowhere else to go (a snapshot call that failed). */
  log?: (line: string) => void;
}

export interface WebServer {
  /** The address to open: `http://127.0.0.1:<port>/#token=<token>`. */
  url: string;
  /** `http://127.0.0.1:<port>` */
  origin: string;
  token: string;
  port: number;
  close(): Promise<void>;
}

const LOOPBACK_HOSTS = new Set(["127.0.0.1", "::1", "localhost"]);

/** Refuses anything but loopback: web mode has no user accounts, only a token in the URL. */
export function checkUiHost(host: string): void {
  if (!LOOPBACK_HOSTS.has(host)) {
    throw new UserError(
      `redwing ui only listens on this machine (127.0.0.1, ::1 or localhost), not on ${host}: ` +
        "the app has no login, so anyone who can reach the port could use it",
      "remote_not_allowed",
    );
  }
}

function sameSecret(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  // timingSafeEqual needs equal lengths; comparing b with itself keeps the time independent of
  // where a wrong token differs.
  return a.length === b.length ? timingSafeEqual(a, b) : (timingSafeEqual(b, b), false);
}

function appError(code: string, message: string): AppError {
  return { code, message, action: null };
}

/** The HTTP status that fits an AppError answered by the backend. */
export function statusOf(error: AppError): number {
  switch (error.code) {
    case "bad_request":
    case "unknown_method":
    case "invalid_json":
      return 400;
    case "unauthorized":
      return 401;
    case "forbidden":
      return 403;
    case "body_too_large":
      return 413;
    case "internal":
    case "internal_error":
      return 500;
  }
  if (error.code.endsWith("not_found")) return 404;
  if (error.code.startsWith("bad_")) return 400;
  // Everything else is a request the app understood but cannot do now (engine crashed, model
  // corrupt, disk full, a download already running): the renderer reads the AppError anyway.
  return 409;
}

/** Fastify's own errors (bad JSON, body too large, wrong content type) as AppErrors. */
function requestError(error: unknown): { status: number; error: AppError } {
  const e = error as { code?: unknown; statusCode?: unknown; message?: unknown };
  const message = typeof e.message === "string" ? e.message : String(error);
  if (e.code === "FST_ERR_CTP_BODY_TOO_LARGE") {
    return { status: 413, error: appError("body_too_large", "the request body is too large") };
  }
  if (typeof e.statusCode === "number" && e.statusCode >= 400 && e.statusCode < 500) {
    const json = error instanceof SyntaxError || String(e.code).includes("JSON");
    return {
      status: e.statusCode,
      error: json
        ? appError("invalid_json", `the request body is not valid JSON: ${message}`)
        : appError("bad_request", message),
    };
  }
  const mapped = toAppError(error);
  return { status: statusOf(mapped), error: mapped };
}

const MISSING_UI_PAGE = (dir: string): string => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Redwing: the UI is not built</title></head>
<body><h1>The Redwing UI is not built</h1>
<p>There is no <code>${dir.replace(/[<>&"]/g, "")}/index.html</code>. Run <code>npm run setup</code>
in the Redwing checkout (it builds the renderer), then start <code>redwing ui</code> again.</p>
</body></html>
`;

/**
 * How a route authenticates: `public` (static files), `bearer-token` (the Authorization header),
 * `query-token` (the event stream: EventSource cannot send headers). A route without one (and the
 * not-found handler) needs the bearer token: deny by default.
 */
type Access = "public" | "bearer-token" | "query-token";
interface RouteConfig {
  access?: Access;
}

function routeAccess(req: FastifyRequest): Access {
  const access = (req.routeOptions.config as RouteConfig | undefined)?.access;
  return access === "public" || access === "query-token" ? access : "bearer-token";
}

/** Starts web mode's HTTP server on loopback; the URL it answers carries the token. */
export async function startWebServer(options: WebServerOptions): Promise<WebServer> {
  const { backend } = options;
  const host = options.host ?? DEFAULT_UI_HOST;
  checkUiHost(host);
  const token = options.token ?? randomBytes(16).toString("hex");
  if (token.length < 16) throw new Error("the web token must have at least 16 characters");
  const staticDir = options.staticDir ?? RENDERER_DIST;
  const pingMs = options.pingIntervalMs ?? PING_INTERVAL_MS;
  const log = options.log ?? ((line: string) => void process.stderr.write(`redwing ui: ${line}\n`));

  const app = Fastify({ bodyLimit: options.bodyLimit ?? DEFAULT_BODY_LIMIT, logger: false });
  /** Host header values that name this server (DNS rebinding protection). */
  let allowedHosts = new Set<string>();
  const streams = new Set<ServerResponse>();

  // An empty body is a call without params; fastify's own JSON parser refuses it.
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser(
    "application/json",
    { parseAs: "string" },
    (_req: FastifyRequest, body: string | Buffer, done: (e: Error | null, v?: unknown) => void) => {
      const text = body.toString();
      if (text.trim() === "") return done(null, undefined);
      try {
        done(null, JSON.parse(text) as unknown);
      } catch (error) {
        const e = error as Error & { statusCode?: number; code?: string };
        e.statusCode = 400;
        e.code = "FST_ERR_CTP_INVALID_JSON_BODY";
        done(e);
      }
    },
  );

  const refuse = (reply: FastifyReply, status: number, error: AppError): FastifyReply =>
    reply.code(status).header("cache-control", "no-store").send({ ok: false, error });

  // Every request: Host and Origin first (before any body is read), then the token. The token
  // check runs after routing and looks at the route that was matched, not at the raw URL: the
  // router decodes percent-escapes and dot segments, so a check on the spelling of the URL
  // (`/%61pi/call/...`) can be walked around. Deny by default: only routes registered as public
  // (the static files) go without a token; an API route, or any route added later, needs one.
  app.addHook("onRequest", async (req, reply) => {
    for (const [k, v] of Object.entries(SECURITY_HEADERS)) reply.header(k, v);
    const hostHeader = req.headers.host ?? "";
    if (!allowedHosts.has(hostHeader.toLowerCase())) {
      return refuse(
        reply,
        403,
        appError("forbidden", `this server only answers requests for ${[...allowedHosts][0]}`),
      );
    }
    const origin = req.headers.origin;
    if (origin !== undefined && origin !== `http://${hostHeader.toLowerCase()}`) {
      return refuse(reply, 403, appError("forbidden", `requests from ${origin} are not allowed`));
    }
    const access = routeAccess(req);
    if (access === "public") return;
    let given: string | undefined;
    if (access === "query-token") {
      const q = req.query as Record<string, unknown> | undefined;
      given = typeof q?.token === "string" ? q.token : undefined;
    } else {
      const auth = req.headers.authorization;
      given = auth?.startsWith("Bearer ") ? auth.slice("Bearer ".length).trim() : undefined;
    }
    if (given === undefined || !sameSecret(given, token)) {
      return refuse(
        reply,
        401,
        appError(
          "unauthorized",
          given === undefined
            ? "this call needs the token from the address redwing ui printed"
            : "wrong token: open the address redwing ui printed (it changes every launch)",
        ),
      );
    }
  });

  app.setErrorHandler((error, _req, reply) => {
    const { status, error: e } = requestError(error);
    if (status >= 500) log(`internal error: ${(error as Error).stack ?? String(error)}`);
    return refuse(reply, status, e);
  });

  app.post<{ Params: { method: string } }>(
    "/api/call/:method",
    { config: { access: "bearer-token" } satisfies RouteConfig },
    async (req, reply) => {
      const parsed = parseCall(req.params.method, req.body);
      if (!parsed.ok) return refuse(reply, 400, parsed.error);
      try {
        const result = await backend.call(parsed.method, parsed.params as never);
        return reply.header("cache-control", "no-store").send({ ok: true, result });
      } catch (error) {
        const e = toAppError(error);
        const status = statusOf(e);
        if (status >= 500)
          log(`${parsed.method} failed: ${(error as Error).stack ?? String(error)}`);
        return refuse(reply, status, e);
      }
    },
  );

  app.get(
    "/api/events",
    { config: { access: "query-token" } satisfies RouteConfig },
    (req, reply) => {
      reply.hijack();
      const res = reply.raw;
      res.writeHead(200, {
        ...SECURITY_HEADERS,
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-store",
        connection: "keep-alive",
        "x-accel-buffering": "no",
      });
      streams.add(res);
      let closed = false;
      // Events published while the snapshot is gathered wait here, so none is lost in between.
      let pending: AppEvent[] | null = [];
      const write = (chunk: string): void => {
        if (closed) return;
        res.write(chunk);
        if (res.writableLength > MAX_SSE_BACKLOG_BYTES) {
          log("an event stream client stopped reading; dropping it (it reconnects)");
          cleanup();
          res.destroy();
        }
      };
      const send = (event: AppEvent): void => write(`data: ${JSON.stringify(event)}\n\n`);
      const unsubscribe = backend.subscribe((event) => {
        if (pending) pending.push(event);
        else send(event);
      });
      const ping = setInterval(() => write(": ping\n\n"), pingMs);
      const cleanup = (): void => {
        if (closed) return;
        closed = true;
        clearInterval(ping);
        unsubscribe();
        streams.delete(res);
      };
      req.raw.on("close", cleanup);
      res.on("close", cleanup);
      res.on("error", cleanup);
      write(": connected\n\n");
      void snapshot(backend, log).then((events) => {
        for (const e of events) send(e);
        const queued = pending ?? [];
        pending = null;
        for (const e of queued) send(e);
      });
    },
  );

  // The static files hold no data: the routes registered in this scope are the only public ones.
  await app.register(async (scope) => {
    scope.addHook("onRoute", (route) => {
      route.config = { ...(route.config as object), access: "public" } satisfies RouteConfig;
    });
    if (existsSync(join(staticDir, "index.html"))) {
      await scope.register(fastifyStatic, {
        root: staticDir,
        index: "index.html",
        dotfiles: "ignore",
        wildcard: true,
        // The page names hashed assets; the page itself must always be fresh.
        setHeaders: (res, path) => {
          if (path.endsWith(".html")) res.header("cache-control", "no-cache");
        },
      });
    } else {
      scope.get("/*", (req, reply) => {
        if (req.url.startsWith("/api/")) {
          return refuse(reply, 404, appError("not_found", `no such endpoint: ${req.url}`));
        }
        return reply
          .code(500)
          .type("text/html; charset=utf-8")
          .header("cache-control", "no-store")
          .send(MISSING_UI_PAGE(staticDir));
      });
    }
  });

  app.setNotFoundHandler((req, reply) =>
    refuse(reply, 404, appError("not_found", `no such endpoint: ${req.method} ${req.url}`)),
  );

  await app.listen({ host, port: options.port ?? DEFAULT_UI_PORT });
  const address = app.server.address() as AddressInfo;
  const port = address.port;
  allowedHosts = new Set([`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`]);
  const urlHost = address.family === "IPv6" ? `[${address.address}]` : address.address;
  const origin = `http://${urlHost}:${port}`;
  let closing: Promise<void> | null = null;
  return {
    url: `${origin}/#token=${token}`,
    origin,
    token,
    port,
    close() {
      closing ??= (async () => {
        // Event streams never end on their own: end them so close() does not wait forever.
        for (const res of [...streams]) res.end();
        streams.clear();
        await app.close();
      })();
      return closing;
    },
  };
}

/** What a new window needs before live events make sense, in the order the contract gives. */
async function snapshot(backend: AppBackend, log: (line: string) => void): Promise<AppEvent[]> {
  const ask = async <M extends Method>(method: M) => {
    try {
      return await backend.call(method, {} as never);
    } catch (error) {
      log(`event stream snapshot: ${method} failed: ${(error as Error).message}`);
      return null;
    }
  };
  const [settings, models, engine, server, conversations, downloads] = await Promise.all([
    ask("settings.get"),
    ask("models.list"),
    ask("engine.status"),
    ask("server.status"),
    ask("chat.list"),
    ask("models.downloads"),
  ]);
  const events: AppEvent[] = [];
  if (settings) {
    events.push({ type: "settings", settings, reloadNeeded: engine?.reloadNeeded ?? false });
  }
  if (models) events.push({ type: "models", models });
  if (engine) events.push({ type: "engine", status: engine });
  if (server) events.push({ type: "server", status: server });
  if (conversations) events.push({ type: "conversations", conversations });
  for (const download of downloads ?? []) events.push({ type: "download", download });
  return events;
}
