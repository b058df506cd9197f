/**
 * The engine client: runs the decode service (`redwing-service`, docs/protocol.md) as a child
 * process and speaks its protocol.
 *
 * - Every event is validated (protocol.ts); a line that does not parse fails the request it
 *   names, or is logged when it names none.
 * - Supervision: when the service dies unexpectedly, every request in flight fails with an
 *   EngineCrashError (exit code or signal, stderr tail); the service is restarted with
 *   exponential backoff and the last loaded model is loaded again, so the next request works.
 * - No orphans: live services are killed when this process exits or gets SIGINT/SIGTERM/SIGHUP;
 *   the service itself also exits when its parent dies (kill -9 included).
 */
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { statSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { UserError } from "../errors.ts";
import { nativeBinary } from "../native.ts";
import {
  type ErrorEvent,
  type Event,
  EventSchema,
  type FinishedEvent,
  type GenerateEvent,
  type GenerateParams,
  GenerateParamsSchema,
  type HelloEvent,
  type LoadParams,
  LoadParamsSchema,
  type LoadProgressEvent,
  type PlanEvent,
  type PlanParams,
  PlanParamsSchema,
  PROTOCOL_VERSION,
  type ReadyEvent,
  type RequestId,
  type StatsEvent,
} from "./protocol.ts";

export const SERVICE_BINARY = "redwing-service";

/** An error the service reported (error event), or a failure to talk to it. */
export class EngineError extends UserError {
  /** Set for model_locked: the pid of the process that holds the model. */
  readonly ownerPid: number | undefined;
  constructor(message: string, code: string, ownerPid?: number) {
    super(message, code);
    this.name = "EngineError";
    this.ownerPid = ownerPid;
  }
  static fromEvent(event: ErrorEvent): EngineError {
    return new EngineError(event.message, event.code, event.owner_pid);
  }
}

/** The service process died while requests were in flight (or could not start). */
export class EngineCrashError extends EngineError {
  constructor(
    message: string,
    readonly exitCode: number | null,
    readonly signal: NodeJS.Signals | null,
    /** The last lines the service wrote to stderr. */
    readonly stderrTail: string,
  ) {
    super(message, "engine_crashed");
    this.name = "EngineCrashError";
  }
}

export interface RestartPolicy {
  /** Crashes in a row (without a stable minute between) before giving up (default 5). */
  maxRestarts?: number;
  /** First delay; doubled after each crash in a row (default 200 ms). */
  initialDelayMs?: number;
  maxDelayMs?: number;
}

export interface EngineClientOptions {
  /** The service executable; default: findServiceBinary(). */
  binary?: string;
  args?: string[];
  env?: NodeJS.ProcessEnv;
  restart?: RestartPolicy | false;
  /** Called after each crash (before the restart). */
  onCrash?: (error: EngineCrashError) => void;
  /** The service's stderr, line by line (default: dropped; the tail is kept for crash reports). */
  onLog?: (line: string) => void;
}

/**
 * The service binary: $REDWING_SERVICE_BINARY; else `redwing-service` next to this process's
 * resources (`process.resourcesPath`, set in the packaged app); else the native build directory
 * of a checkout (core/native.ts: native/build or $REDWING_NATIVE_BUILD).
 */
export function findServiceBinary(): string {
  const override = process.env.REDWING_SERVICE_BINARY;
  if (override) return override;
  const resources = (process as { resourcesPath?: string }).resourcesPath;
  if (resources) {
    const packaged = join(
      resources,
      process.platform === "win32" ? `${SERVICE_BINARY}.exe` : SERVICE_BINARY,
    );
    try {
      if (statSync(packaged).isFile()) return packaged;
    } catch {
      // not packaged: fall through to the checkout's build
    }
  }
  return nativeBinary(SERVICE_BINARY);
}

// ---- orphan prevention ------------------------------------------------------------------------

const liveChildren = new Set<ChildProcessWithoutNullStreams>();
let hooksInstalled = false;

function killAll(): void {
  for (const child of liveChildren) child.kill("SIGKILL");
  liveChildren.clear();
}

function installExitHooks(): void {
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on("exit", killAll);
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    const handler = (): void => {
      // Someone else handles the signal (e.g. Ctrl-C cancels a generation): leave the services
      // alone; the exit hook and the services' parent-death watch cover the process ending.
      if (process.listenerCount(signal) > 1) return;
      killAll();
      process.removeListener(signal, handler);
      process.kill(process.pid, signal); // the default action: exit by the signal
    };
    process.on(signal, handler);
  }
}

// ---- a small async queue for generate() ------------------------------------------------------

class EventQueue<T> {
  private items: T[] = [];
  private waiter: ((v: void) => void) | null = null;
  private failure: Error | null = null;
  private ended = false;
  push(item: T): void {
    this.items.push(item);
    this.wake();
  }
  fail(error: Error): void {
    this.failure = error;
    this.wake();
  }
  end(): void {
    this.ended = true;
    this.wake();
  }
  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }
  async next(): Promise<T | undefined> {
    for (;;) {
      if (this.items.length > 0) return this.items.shift();
      if (this.failure) throw this.failure;
      if (this.ended) return undefined;
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }
}

interface Pending {
  onEvent(event: Event): void;
  onFail(error: Error): void;
}

const STDERR_TAIL_BYTES = 8192;

export class EngineClient {
  private child: ChildProcessWithoutNullStreams | null = null;
  private pending = new Map<string, Pending>();
  private nextId = 1;
  private stderrTail = "";
  private closing = false;
  private crashesInARow = 0;
  private startedAt = 0;
  private lastLoad: LoadParams | null = null;
  private failed: EngineCrashError | null = null;
  /** Resolves when a (re)started service has said hello (and reloaded the last model). */
  private ready: Promise<void> = Promise.resolve();
  private helloEvent: HelloEvent | null = null;

  private constructor(
    private readonly binary: string,
    private readonly options: EngineClientOptions,
  ) {}

  /** Starts the service and exchanges hello. */
  static async start(options: EngineClientOptions = {}): Promise<EngineClient> {
    const client = new EngineClient(options.binary ?? findServiceBinary(), options);
    installExitHooks();
    client.ready = client.launch();
    await client.ready;
    return client;
  }

  /** The service's hello (versions, backends, CPU features, pid). */
  get hello(): HelloEvent {
    if (!this.helloEvent) throw new EngineError("the engine service is not running", "engine_down");
    return this.helloEvent;
  }

  /** The service's pid (undefined while it is restarting). */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Loads a model; onProgress sees the load_progress events. Resolves with the ready event. */
  async load(
    params: LoadParams,
    onProgress?: (event: LoadProgressEvent) => void,
  ): Promise<ReadyEvent> {
    const checked = LoadParamsSchema.parse(params);
    const ready = await this.request<ReadyEvent>("load", checked, "ready", (e) => {
      if (e.type === "load_progress") onProgress?.(e);
    });
    this.lastLoad = checked;
    return ready;
  }

  /**
   * The memory plan for a model at these load settings, without loading it (answered at once,
   * also while a generation runs).
   */
  async plan(params: PlanParams): Promise<PlanEvent> {
    return this.request<PlanEvent>("plan", PlanParamsSchema.parse(params), "plan");
  }

  async unload(): Promise<void> {
    await this.request("unload", {}, "unloaded");
    this.lastLoad = null;
  }

  async stats(): Promise<StatsEvent> {
    return this.request<StatsEvent>("stats", {}, "stats");
  }

  /**
   * Generates from `params.tokens`. Yields prefill, tokens and stats events and ends with the
   * finished event. Aborting `signal` (or leaving the loop early) cancels the generation; the
   * iterator then ends with finished { reason: "cancelled" }. Service errors throw EngineError,
   * a crash throws EngineCrashError.
   */
  async *generate(
    params: GenerateParams,
    options: { signal?: AbortSignal } = {},
  ): AsyncGenerator<GenerateEvent, void, undefined> {
    const checked = GenerateParamsSchema.parse(params);
    await this.ensureRunning();
    const id = this.newId();
    const queue = new EventQueue<Event>();
    this.pending.set(id, {
      onEvent: (event) => {
        queue.push(event);
        if (event.type === "finished" || event.type === "error") queue.end();
      },
      onFail: (error) => queue.fail(error),
    });
    let finished = false;
    const cancel = (): void => {
      if (!finished) this.send({ type: "cancel", target: id });
    };
    const signal = options.signal;
    signal?.addEventListener("abort", cancel, { once: true });
    try {
      this.send({ type: "generate", id, ...checked });
      if (signal?.aborted) cancel();
      for (;;) {
        const event = await queue.next();
        if (event === undefined)
          throw new EngineError("the generation ended without a result", "protocol");
        if (event.type === "error") throw EngineError.fromEvent(event);
        if (event.type === "finished") {
          finished = true;
          yield event;
          return;
        }
        if (event.type === "prefill" || event.type === "tokens" || event.type === "stats")
          yield event;
      }
    } finally {
      signal?.removeEventListener("abort", cancel);
      if (!finished && this.pending.has(id)) {
        // The consumer stopped early: cancel, and drop the remaining events.
        cancel();
        this.pending.delete(id);
      }
    }
  }

  /** Runs a generation to the end and returns its finished event. */
  async generateAll(
    params: GenerateParams,
    options: { signal?: AbortSignal } = {},
  ): Promise<FinishedEvent> {
    for await (const event of this.generate({ ...params, stream: false }, options)) {
      if (event.type === "finished") return event;
    }
    throw new EngineError("the generation ended without a result", "protocol");
  }

  /** Asks the service to shut down and waits for it to exit (killed after `timeoutMs`). */
  async close(timeoutMs = 5000): Promise<void> {
    this.closing = true;
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once("close", () => resolve()));
    try {
      child.stdin.end(`${JSON.stringify({ type: "shutdown", id: this.newId() })}\n`);
    } catch {
      // already gone
    }
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    await exited;
    clearTimeout(timer);
  }

  // ---- internals ------------------------------------------------------------------------------

  private newId(): string {
    return `r${this.nextId++}`;
  }

  private send(message: Record<string, unknown>): void {
    const child = this.child;
    if (!child || !child.stdin.writable) return;
    child.stdin.write(`${JSON.stringify(message)}\n`);
  }

  private async ensureRunning(): Promise<void> {
    if (this.closing) throw new EngineError("the engine client is closed", "engine_closed");
    if (this.failed) throw this.failed;
    await this.ready;
    if (this.failed) throw this.failed;
  }

  /** Sends one request and resolves with the event of type `until` (an error event rejects). */
  private async request<T extends Event>(
    type: string,
    params: Record<string, unknown>,
    until: T["type"],
    onOther?: (event: Event) => void,
  ): Promise<T> {
    await this.ensureRunning();
    return this.rawRequest<T>(type, params, until, onOther);
  }

  private rawRequest<T extends Event>(
    type: string,
    params: Record<string, unknown>,
    until: T["type"],
    onOther?: (event: Event) => void,
  ): Promise<T> {
    const id = this.newId();
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, {
        onEvent: (event) => {
          if (event.type === until) {
            this.pending.delete(id);
            resolve(event as T);
          } else if (event.type === "error") {
            this.pending.delete(id);
            reject(EngineError.fromEvent(event));
          } else {
            onOther?.(event);
          }
        },
        onFail: (error) => {
          this.pending.delete(id);
          reject(error);
        },
      });
      this.send({ type, id, ...params });
    });
  }

  /** Spawns the service and says hello; after a restart, loads the last model again. */
  private async launch(): Promise<void> {
    const child = spawn(this.binary, this.options.args ?? [], {
      stdio: ["pipe", "pipe", "pipe"],
      env: this.options.env ?? process.env,
    });
    this.child = child;
    this.stderrTail = "";
    this.startedAt = Date.now();
    liveChildren.add(child);
    child.stdin.on("error", () => {
      // EPIPE after the service died: the close handler reports it.
    });
    const spawnError = new Promise<never>((_, reject) =>
      child.once("error", (error) =>
        reject(
          new EngineCrashError(`cannot start ${this.binary}: ${error.message}`, null, null, ""),
        ),
      ),
    );
    createInterface({ input: child.stderr, crlfDelay: Infinity }).on("line", (line) => {
      this.stderrTail = (this.stderrTail + line + "\n").slice(-STDERR_TAIL_BYTES);
      this.options.onLog?.(line);
    });
    createInterface({ input: child.stdout, crlfDelay: Infinity }).on("line", (line) =>
      this.onLine(line),
    );
    child.once("close", (code, signal) => this.onClose(child, code, signal));

    const hello = await Promise.race([
      this.rawRequest<HelloEvent>("hello", { protocol: PROTOCOL_VERSION }, "hello"),
      spawnError,
    ]);
    this.helloEvent = hello;
    if (this.lastLoad) {
      try {
        await this.rawRequest<ReadyEvent>("load", this.lastLoad, "ready");
      } catch (error) {
        this.options.onLog?.(`reload after restart failed: ${(error as Error).message}`);
      }
    }
  }

  private onLine(line: string): void {
    let parsed: unknown;
    try {
      parsed = JSON.parse(line);
    } catch {
      this.options.onLog?.(`not JSON on the service's stdout: ${line.slice(0, 200)}`);
      return;
    }
    const result = EventSchema.safeParse(parsed);
    const rawId = (parsed as { id?: unknown } | null)?.id;
    const key = typeof rawId === "string" || typeof rawId === "number" ? String(rawId) : null;
    if (!result.success) {
      const error = new EngineError(
        `the service sent an invalid event: ${result.error.message} (${line.slice(0, 200)})`,
        "protocol",
      );
      const pending = key === null ? undefined : this.pending.get(key);
      if (pending) pending.onFail(error);
      else this.options.onLog?.(error.message);
      return;
    }
    const event = result.data;
    if (key !== null) {
      this.pending.get(key)?.onEvent(event);
    } else if (event.type === "error") {
      this.options.onLog?.(`service error ${event.code}: ${event.message}`);
    }
  }

  private onClose(
    child: ChildProcessWithoutNullStreams,
    code: number | null,
    signal: NodeJS.Signals | null,
  ): void {
    liveChildren.delete(child);
    if (this.child === child) this.child = null;
    this.helloEvent = null;
    const how = signal ? `was killed by ${signal}` : `exited with status ${code}`;
    const tail = this.stderrTail.trim();
    const crash = new EngineCrashError(
      `the engine service ${how}${tail ? `; its last output:\n${tail}` : ""}`,
      code,
      signal,
      this.stderrTail,
    );
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const p of pending)
      p.onFail(
        this.closing ? new EngineError("the engine client is closed", "engine_closed") : crash,
      );
    if (this.closing) return;

    this.options.onCrash?.(crash);
    const policy = this.options.restart === false ? null : (this.options.restart ?? {});
    if (Date.now() - this.startedAt > 60_000) this.crashesInARow = 0;
    this.crashesInARow++;
    if (!policy || this.crashesInARow > (policy.maxRestarts ?? 5)) {
      this.failed = crash;
      return;
    }
    const delay = Math.min(
      (policy.initialDelayMs ?? 200) * 2 ** (this.crashesInARow - 1),
      policy.maxDelayMs ?? 10_000,
    );
    this.ready = new Promise<void>((resolve) => setTimeout(resolve, delay)).then(() =>
      this.closing ? undefined : this.launch(),
    );
    // A failed restart fails the requests waiting on it; its own close event schedules the next.
    this.ready.catch(() => undefined);
  }
}

export type { RequestId };
