/**
 * Redwing's OpenAI-compatible HTTP server (`redwing serve`): GET /health, GET /v1/models,
 * POST /v1/chat/completions, POST /v1/completions, on fastify. This module wires the parts:
 * access checks (access.ts), the routes (routes/), one request's generation and answer
 * (completion.ts, on core/generation's loop).
 *
 * - One engine (the decode service, through core/engine's EngineClient, which restarts it after
 *   a crash), many clients: requests take turns through a bounded queue (429 beyond it); a client
 *   that disconnects cancels its generation or leaves the queue. Consecutive requests that share
 *   a prefix reuse the service's KV cache (usage.prompt_tokens_details.cached_tokens).
 * - Loopback only unless `allowRemote`, which also needs an API key (Bearer, every request).
 *   No CORS headers unless `corsOrigin` is set.
 * - Errors use OpenAI's error object; a prompt that does not fit the context is refused (400),
 *   never truncated.
 */
import type { AddressInfo } from "node:net";
import { modelFamily } from "../models/index.ts";
import { basename } from "node:path";
import Fastify, { type FastifyInstance } from "fastify";
import { resolveModel, type ResolvedModel } from "../chat/model.ts";
import { ChatTemplate, loadChatTemplate } from "../chat/template.ts";
import { loadTokenizer, type ChatTokenizer } from "../chat/tokenizer.ts";
import { ENGINE_DEFAULTS, OPENAI_SAMPLING_DEFAULTS, SERVER_DEFAULTS } from "../defaults.ts";
import { DEMO_MODEL_NAME } from "../demo/demo.ts";
import { EngineClient, type EngineClientOptions } from "../engine/index.ts";
import { UserError } from "../errors.ts";
import { toProtocolLoad, type EngineFlags } from "../generation/settings.ts";
import { accessHook, checkBinding, type AccessOptions } from "./access.ts";
import type { AdmissionQueue, RequestDefaults, ServerContext, ServerMetrics } from "./context.ts";
import { ApiError, toApiError } from "./errors.ts";
import { EngineQueue } from "./queue.ts";
import { RequestBook } from "./requests.ts";
import { registerChatCompletionsRoute } from "./routes/chat-completions.ts";
import { registerCompletionsRoute } from "./routes/completions.ts";
import { registerHealthRoute } from "./routes/health.ts";
import { registerModelRoutes } from "./routes/models.ts";

export { checkBinding, hostAllowed, isLoopbackHost, originAllowed } from "./access.ts";
export {
  parseBody,
  type AdmissionQueue,
  type RequestDefaults,
  type ServerMetrics,
} from "./context.ts";

/** The engine options (EngineFlags, settings.ts) go to the engine's load request. */
export interface ServerOptions extends AccessOptions, EngineFlags {
  host?: string;
  /** 0: an ephemeral port. */
  port?: number;
  /** Needed to bind to anything but loopback (and then an API key is required too). */
  allowRemote?: boolean;
  apiKey?: string;
  /** The one origin allowed by CORS ("*": any); default none (no CORS headers). */
  corsOrigin?: string;
  /**
   * On loopback, Host header names accepted besides localhost, 127.0.0.1 and [::1] at the
   * server's port (`--allow-host`): a name, or name:port. Everything else is refused (421), so
   * that a web page cannot reach the server through DNS rebinding.
   */
  allowedHosts?: string[];
  /**
   * On loopback, browser origins accepted besides the server's own loopback origins and
   * `corsOrigin` (`--allow-origin`), e.g. "http://localhost:3000". Others are refused (403).
   */
  allowedOrigins?: string[];
  /** Requests that may wait behind the running one (SERVER_DEFAULTS). */
  queueLimit?: number;
  /** Bytes (SERVER_DEFAULTS). */
  bodyLimit?: number;
  /** Model name or directory (default: the demo model). */
  model?: string;
  /** KV positions (prompt plus output), ENGINE_DEFAULTS by default. */
  context?: number;
  engine?: EngineClientOptions;
  /**
   * An engine that someone else owns (the desktop app's): the server neither starts, loads nor
   * closes it, and takes turns with the owner's own generations through `queue`. The model must
   * be loaded already (`model` names its directory, `context` its KV size).
   */
  shared?: SharedEngine;
  /** Called with one line per request (method, path, status, ms). */
  log?: (line: string) => void;
}

export interface SharedEngine {
  /** The engine client to use now (the owner may replace it, e.g. after a crash). */
  client: () => EngineClient;
  /** Turns shared with the owner's generations (and loads); `acquire(signal)` is one request. */
  queue: AdmissionQueue;
  /** The loaded model's tokenizer and chat template, when the owner has them already. */
  text?: { tokenizer: ChatTokenizer; template: string };
  /**
   * Why the owner's engine cannot serve now (crashed and restarting, loading), or null: requests
   * then get 503 with Retry-After.
   */
  unavailable?: () => string | null;
  /** The owner's settings for fields a request leaves out, read per request. */
  defaults?: () => RequestDefaults;
}

/** `redwing serve`: what OpenAI's clients expect, with no cap but the context. */
const STANDALONE_DEFAULTS: RequestDefaults = { ...OPENAI_SAMPLING_DEFAULTS, maxTokens: null };

export interface RedwingServer {
  url: string;
  modelId: string;
  app: FastifyInstance;
  engine: EngineClient;
  queue: AdmissionQueue;
  metrics: ServerMetrics;
  /** The requests in flight: listed, watched (`onChange`) and cancelled here. */
  requests: RequestBook;
  close(): Promise<void>;
}

function modelIdOf(arg: string | undefined, model: ResolvedModel): string {
  if (arg === undefined || arg === DEMO_MODEL_NAME) return DEMO_MODEL_NAME;
  if (arg.includes("/") || arg.includes("\\")) return basename(model.dir);
  return arg;
}

/**
 * Starts the server: the model's text side, the engine (its own, or the shared one), the queue,
 * the access checks on every request, and the routes (core/server/routes/).
 */
export async function startServer(options: ServerOptions = {}): Promise<RedwingServer> {
  checkBinding(options);
  const host = options.host ?? SERVER_DEFAULTS.host;
  const port = options.port ?? SERVER_DEFAULTS.port;
  const context = options.context ?? ENGINE_DEFAULTS.context;
  const model = await resolveModel(options.model);
  const shared = options.shared;
  const tokenizer: ChatTokenizer = shared?.text?.tokenizer ?? (await loadTokenizer(model.dir));
  const template = new ChatTemplate(
    shared?.text?.template ??
      (await loadChatTemplate(
        model.dir,
        tokenizer.configTemplate,
        model.manifest.architecture.family,
      )),
  );
  const owned = shared ? null : await startOwnEngine(options, model.dir, context);
  const closeOwned = async (): Promise<void> => {
    await owned?.close();
  };
  const toolSyntax = modelFamily(model.manifest.architecture.family).tools;
  const ctx: ServerContext = {
    modelId: modelIdOf(options.model, model),
    created: Math.floor(Date.now() / 1000),
    context,
    tokenizer,
    template,
    stopIds: model.manifest.architecture.eos_token_ids,
    tools: toolSyntax,
    // The family's hand-over to the tool (Gemma 4's `<|tool_response>`) ends a tool-calling turn.
    toolStopIds: (toolSyntax?.handOverTokens ?? [])
      .map((t) => tokenizer.tokenId(t))
      .filter((id) => id !== null),
    engine: () => (shared ? shared.client() : owned!),
    queue: shared?.queue ?? new EngineQueue(options.queueLimit ?? SERVER_DEFAULTS.queueLimit),
    metrics: {
      requests: 0,
      completed: 0,
      cancelled: 0,
      rejected: 0,
      completionTokens: 0,
      queueWaitMsTotal: 0,
      queueWaitMsMax: 0,
    },
    defaults: shared?.defaults ?? (() => STANDALONE_DEFAULTS),
    requests: new RequestBook(),
    unavailable: shared?.unavailable ?? (() => null),
  };

  const app = Fastify({
    logger: false,
    bodyLimit: options.bodyLimit ?? SERVER_DEFAULTS.bodyLimitBytes,
  });
  app.setErrorHandler((error, _request, reply) => {
    const api = toApiError(error);
    void reply.code(api.status).headers(api.headers).send(api.body());
  });
  app.setNotFoundHandler((request, reply) => {
    void reply
      .code(404)
      .send(
        new ApiError(
          404,
          `no route ${request.method} ${request.url}`,
          "not_found_error",
          "unknown_url",
        ).body(),
      );
  });

  // Set once listening (port 0 picks one).
  let listeningPort = port;
  app.addHook(
    "onRequest",
    accessHook(options, () => listeningPort),
  );
  if (options.log) {
    const log = options.log;
    app.addHook("onResponse", async (request, reply) => {
      log(
        `${request.method} ${request.url} ${reply.statusCode} ${reply.elapsedTime.toFixed(0)} ms`,
      );
    });
  }
  registerHealthRoute(app, ctx);
  registerModelRoutes(app, ctx);
  registerChatCompletionsRoute(app, ctx);
  registerCompletionsRoute(app, ctx);

  let address: AddressInfo;
  try {
    await app.listen({ host, port });
    address = app.server.address() as AddressInfo;
    listeningPort = address.port;
  } catch (error) {
    await closeOwned();
    throw new UserError(
      `cannot listen on ${host}:${port}: ${(error as Error).message}`,
      "listen_failed",
    );
  }
  const shownHost = address.family === "IPv6" ? `[${address.address}]` : address.address;
  return {
    url: `http://${shownHost}:${address.port}`,
    modelId: ctx.modelId,
    app,
    get engine() {
      return ctx.engine();
    },
    queue: ctx.queue,
    metrics: ctx.metrics,
    requests: ctx.requests,
    async close() {
      await app.close();
      await closeOwned();
      if (!shared?.text) await tokenizer.close();
    },
  };
}

/** The server's own engine (`redwing serve`): started, restarted after crashes, loaded. */
async function startOwnEngine(
  options: ServerOptions,
  modelDir: string,
  context: number,
): Promise<EngineClient> {
  const engine = await EngineClient.start({
    restart: { initialDelayMs: 100, maxDelayMs: 2000 },
    ...options.engine,
  });
  try {
    await engine.load(toProtocolLoad(modelDir, { ...options, context }));
  } catch (error) {
    await engine.close();
    throw error;
  }
  return engine;
}
