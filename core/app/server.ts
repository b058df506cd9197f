/**
 * The OpenAI-compatible server inside the app: core/server's startServer on 127.0.0.1, sharing
 * the app's engine client and its queue (a chat reply and an API request take turns). It serves
 * the loaded model; when another model (or context) is loaded it is restarted for it, and it
 * stops while no model is loaded (coming back with the next load while `server.enabled`).
 */
import { createServer } from "node:net";
import { startServer, type RedwingServer } from "../server/server.ts";
import {
  curlExample,
  SERVER_OFF,
  type AppError,
  type SamplingSettings,
  type ServerStatus,
} from "./api.ts";
import type { EngineManager } from "./engine.ts";
import { AppFailure, toAppError } from "./errors.ts";

export const SERVER_HOST = "127.0.0.1";
/** Least time between two automatic engine restarts. */
const AUTO_RESTART_GAP_MS = 30_000;
/** How often token progress of server requests is announced. */
const PROGRESS_MS = 250;

/** Rejects with the listen error when `port` cannot be bound now (checked before the slow start). */
function probePort(host: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(port, host, () => probe.close(() => resolve()));
  });
}

export class ServerManager {
  private server: RedwingServer | null = null;
  /** The model directory and context it serves. */
  private serving: { dir: string; context: number } | null = null;
  private error: AppError | null = null;
  private chain: Promise<unknown> = Promise.resolve();
  private lastUnavailable: string | null = null;
  private lastAutoRestart = 0;
  private restarting = false;
  /** A pending status for token progress (published at most every PROGRESS_MS). */
  private progressTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly engine: EngineManager,
    private readonly onStatus: (status: ServerStatus) => void,
    /** The app's current Tuning values: what a request that leaves a field out gets. */
    private readonly sampling: () => SamplingSettings,
    private readonly log: (line: string) => void = () => undefined,
  ) {}

  status(): ServerStatus {
    const s = this.server;
    if (!s) return { ...SERVER_OFF, requests: [], error: this.error };
    const url = `${s.url}/v1`;
    return {
      running: true,
      url,
      modelId: s.modelId,
      example: curlExample(url, s.modelId),
      error: this.error,
      requests: s.requests.list(),
      unavailable: this.unavailable(),
    };
  }

  /**
   * Why the running server cannot serve now, or null: it stays up (answering 503 with
   * Retry-After) while the engine restarts after a crash or a model loads, so that clients see a
   * reason to retry rather than a refused connection.
   */
  private unavailable(): string | null {
    const loaded = this.engine.loaded;
    const serving = this.serving;
    if (this.engine.isCrashed) return "the engine stopped unexpectedly and is restarting";
    if (loaded && serving && loaded.dir === serving.dir) return null;
    const state = this.engine.status().state;
    if (state === "loading" || state === "starting") return "the model is loading";
    return "no model is loaded";
  }

  /** Ends one server request; false when it is no longer in flight. */
  cancel(id: string): boolean {
    return this.server?.requests.cancel(id) ?? false;
  }

  /**
   * Follows the engine: announces when the server stops or starts serving, and restarts an
   * engine that crashed while the server is on (at most once per AUTO_RESTART_GAP_MS, so that a
   * model that crashes on load does not loop), since its clients cannot press "Restart engine".
   */
  engineChanged(wanted: boolean, restart: () => Promise<unknown>): void {
    if (!this.server) return;
    const unavailable = this.unavailable();
    if (unavailable !== this.lastUnavailable) {
      this.lastUnavailable = unavailable;
      this.publish();
    }
    if (wanted && this.engine.isCrashed && !this.restarting) {
      const now = Date.now();
      if (now - this.lastAutoRestart < AUTO_RESTART_GAP_MS) return;
      this.lastAutoRestart = now;
      this.restarting = true;
      this.log("server: the engine crashed; restarting it");
      void restart()
        .catch((error: unknown) =>
          this.log(`server: engine restart failed: ${toAppError(error).message}`),
        )
        .finally(() => {
          this.restarting = false;
        });
    }
  }

  /** Runs server changes one at a time. */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.chain.then(fn, fn);
    this.chain = next.catch(() => undefined);
    return next;
  }

  /**
   * Makes the server match `wanted` (on/off) and the loaded model. Starting without a model
   * fails with load_model; a port in use fails with a message saying so.
   */
  sync(wanted: boolean, port: number): Promise<ServerStatus> {
    return this.serial(async () => {
      const loaded = this.engine.loaded;
      const target =
        wanted && loaded ? { dir: loaded.dir, context: loaded.settings.context } : null;
      const same =
        this.server &&
        target &&
        this.serving?.dir === target.dir &&
        this.serving.context === target.context &&
        Number(new URL(this.server.url).port) === port;
      if (same) return this.publish();
      // The engine crashed or is loading the model again: the server stays up and answers 503.
      const restarting =
        wanted &&
        !loaded &&
        this.server &&
        Number(new URL(this.server.url).port) === port &&
        this.unavailable() !== "no model is loaded";
      if (restarting) return this.publish();
      await this.stopServer();
      if (!wanted) {
        this.error = null;
        return this.publish();
      }
      if (!loaded || !target) {
        this.error = {
          code: "no_model",
          message: "Load a model first: the server serves the loaded model.",
          action: "load_model",
        };
        this.publish();
        throw new AppFailure(this.error.code, this.error.message, this.error.action);
      }
      try {
        await probePort(SERVER_HOST, port);
        this.server = await startServer({
          host: SERVER_HOST,
          port,
          model: loaded.dir,
          context: loaded.settings.context,
          shared: {
            client: () => this.engine.currentClient(),
            queue: this.engine.queue,
            text: { tokenizer: loaded.tokenizer, template: loaded.template },
            unavailable: () => this.unavailable(),
            defaults: () => {
              const s = this.sampling();
              return {
                temperature: s.temperature,
                topK: s.topK,
                topP: s.topP,
                repetitionPenalty: s.repetitionPenalty,
                maxTokens: s.maxNewTokens,
              };
            },
          },
          log: (line) => this.log(`server: ${line}`),
        });
        this.serving = target;
        this.error = null;
        this.server.requests.onChange = (progress) => this.requestsChanged(progress);
      } catch (error) {
        const text = (error as Error).message ?? String(error);
        this.error =
          /EADDRINUSE/.test(text) || (error as { code?: string }).code === "EADDRINUSE"
            ? {
                code: "port_in_use",
                message: `Port ${port} is already in use by another program. Choose another port, then switch the server on again.`,
                action: null,
                detail: text,
              }
            : toAppError(error);
        this.publish();
        throw new AppFailure(this.error.code, this.error.message, this.error.action, text);
      }
      return this.publish();
    });
  }

  private requestsChanged(progress: boolean): void {
    if (!progress) {
      if (this.progressTimer) clearTimeout(this.progressTimer);
      this.progressTimer = null;
      this.publish();
    } else if (!this.progressTimer) {
      this.progressTimer = setTimeout(() => {
        this.progressTimer = null;
        this.publish();
      }, PROGRESS_MS);
    }
  }

  private publish(): ServerStatus {
    const s = this.status();
    this.onStatus(s);
    return s;
  }

  private async stopServer(): Promise<void> {
    const s = this.server;
    this.server = null;
    this.serving = null;
    if (this.progressTimer) clearTimeout(this.progressTimer);
    this.progressTimer = null;
    if (s) await s.close();
  }

  async close(): Promise<void> {
    await this.serial(() => this.stopServer());
  }
}
