/**
 * The one line in front of the engine: the decode service runs one thing at a time, so its users
 * take turns. Server requests are bounded: at most `limit` of them wait behind the running turn,
 * beyond that the caller is told to come back later (HTTP 429), so a burst cannot pile up
 * unbounded work and memory. In the app the chat and model loads share the same line with the
 * server; their turns always wait and do not count towards the limit. Whoever holds the engine is
 * known, so the app's status can say "generating" for chat and server alike.
 */
export class QueueFullError extends Error {
  constructor(readonly limit: number) {
    super(`the server is busy: ${limit} request(s) are already waiting; retry shortly`);
    this.name = "QueueFullError";
  }
}

export class QueueAbortedError extends Error {
  constructor() {
    super("the request was cancelled while it waited");
    this.name = "QueueAbortedError";
  }
}

export type TurnKind = "generate" | "exclusive";

interface Waiter {
  kind: TurnKind;
  /** A server request: counts towards `limit`. */
  bounded: boolean;
  grant: () => void;
}

export class EngineQueue {
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
