/**
 * The OpenAI-compatible server inside the app: core/server's startServer on 127.0.0.1, sharing
 * the app's engine client and its queue (a chat reply and an API request take turns). It serves
 * the loaded model; when another model (or context) is loaded it is restarted for it, and it
 * stops while no model is loaded (coming back with the next load while `server.enabled`).
 */
import { createServer } from "node:net";
import { startServer, type RedwingServer } from "../server/server.ts";
import type { AppError, SamplingSettings, ServerStatus } from "./api.ts";
import type { EngineManager } from "./engine.ts";
import { AppFailure, toAppError } from "./errors.ts";

export const SERVER_HOST = "127.0.0.1";

/** What the example asks for at most: a short answer, so that trying it costs seconds. */
export const EXAMPLE_MAX_TOKENS = 128;

/** A ready-to-paste request against the running server, with a bounded answer. */
export function curlExample(baseUrl: string, modelId: string): string {
  const body = JSON.stringify({
    model: modelId,
    messages: [{ role: "user", content: "Hello!" }],
    max_tokens: EXAMPLE_MAX_TOKENS,
  });
  return [
    `curl ${baseUrl}/chat/completions \\`,
    `  -H "Content-Type: application/json" \\`,
    `  -d '${body}'`,
  ].join("\n");
}

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

  constructor(
    private readonly engine: EngineManager,
    private readonly onStatus: (status: ServerStatus) => void,
    /** The app's current Tuning values: what a request that leaves a field out gets. */
    private readonly sampling: () => SamplingSettings,
    private readonly log: (line: string) => void = () => undefined,
  ) {}

  status(): ServerStatus {
    const s = this.server;
    if (!s) return { running: false, url: null, modelId: null, example: null, error: this.error };
    const url = `${s.url}/v1`;
    return {
      running: true,
      url,
      modelId: s.modelId,
      example: curlExample(url, s.modelId),
      error: this.error,
    };
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

  private publish(): ServerStatus {
    const s = this.status();
    this.onStatus(s);
    return s;
  }

  private async stopServer(): Promise<void> {
    const s = this.server;
    this.server = null;
    this.serving = null;
    if (s) await s.close();
  }

  async close(): Promise<void> {
    await this.serial(() => this.stopServer());
  }
}
