/**
 * The one line in front of the engine, shared by the chat, the OpenAI-compatible server and
 * model loads: the decode service runs one thing at a time. The server's requests are bounded
 * (at most `limit` of them wait, beyond that 429) like its own RequestQueue; the app's own turns
 * (a chat reply, a load) always wait and do not count towards the limit. Whoever holds the engine is known, so the status can say
 * "generating" for chat and server alike.
 */
import { QueueAbortedError, QueueFullError } from "../server/queue.ts";
import type { AdmissionQueue } from "../server/server.ts";

export type TurnKind = "generate" | "exclusive";

interface Waiter {
  kind: TurnKind;
  /** A server request: counts towards `limit`. */
  bounded: boolean;
  grant: () => void;
}

export class EngineQueue implements AdmissionQueue {
  private holder: TurnKind | null = null;
  private readonly waiters: Waiter[] = [];
  /** Called whenever the holder changes. */
  onChange: (holder: TurnKind | null) => void = () => undefined;

  constructor(readonly limit: number) {}

  get active(): boolean {
    return this.holder !== null;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  /** A generation (chat or server) holds the engine. */
  get generating(): boolean {
    return this.holder === "generate";
  }

  /**
   * Waits for the engine and resolves with a release function (call it once). Without options
   * this is one server request: bounded by `limit` (QueueFullError). A signal that aborts while
   * waiting leaves the line (QueueAbortedError).
   */
  async acquire(
    signal?: AbortSignal,
    options: { kind?: TurnKind; unbounded?: boolean } = {},
  ): Promise<() => void> {
    const kind = options.kind ?? "generate";
    if (signal?.aborted) throw new QueueAbortedError();
    if (this.holder !== null || this.waiters.length > 0) {
      const bounded = this.waiters.filter((w) => w.bounded).length;
      if (!options.unbounded && bounded >= this.limit) {
        throw new QueueFullError(this.limit);
      }
      await new Promise<void>((resolve, reject) => {
        const waiter: Waiter = {
          kind,
          bounded: !options.unbounded,
          grant: () => {
            signal?.removeEventListener("abort", onAbort);
            resolve();
          },
        };
        const onAbort = (): void => {
          const i = this.waiters.indexOf(waiter);
          if (i !== -1) this.waiters.splice(i, 1);
          reject(new QueueAbortedError());
        };
        signal?.addEventListener("abort", onAbort, { once: true });
        this.waiters.push(waiter);
      });
    } else {
      this.setHolder(kind);
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiters.shift();
      if (next) {
        this.setHolder(next.kind);
        next.grant();
      } else {
        this.setHolder(null);
      }
    };
  }

  private setHolder(kind: TurnKind | null): void {
    const changed = this.holder !== kind;
    this.holder = kind;
    if (changed) this.onChange(kind);
  }
}
