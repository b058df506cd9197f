/**
 * The server's admission queue: the engine runs one generation at a time, so requests take
 * turns. At most `limit` requests wait behind the running one; beyond that the caller is told to
 * come back later (HTTP 429), so a burst cannot pile up unbounded work and memory.
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

interface Waiter {
  grant: () => void;
  fail: (error: Error) => void;
}

export class RequestQueue {
  private busy = false;
  private readonly waiters: Waiter[] = [];

  constructor(readonly limit: number) {}

  /** Requests waiting behind the running one. */
  get waiting(): number {
    return this.waiters.length;
  }

  /** True while a request holds the engine. */
  get active(): boolean {
    return this.busy;
  }

  /**
   * Waits for the engine; resolves with a release function that must be called exactly once.
   * Throws QueueFullError at once when `limit` requests already wait, QueueAbortedError when
   * `signal` aborts while waiting (the request leaves the queue).
   */
  async acquire(signal?: AbortSignal): Promise<() => void> {
    if (signal?.aborted) throw new QueueAbortedError();
    if (this.busy) {
      if (this.waiters.length >= this.limit) throw new QueueFullError(this.limit);
      await new Promise<void>((resolve, reject) => {
        const waiter: Waiter = {
          grant: () => {
            signal?.removeEventListener("abort", onAbort);
            resolve();
          },
          fail: reject,
        };
        const onAbort = (): void => {
          const i = this.waiters.indexOf(waiter);
          if (i !== -1) this.waiters.splice(i, 1);
          reject(new QueueAbortedError());
        };
        signal?.addEventListener("abort", onAbort, { once: true });
        this.waiters.push(waiter);
      });
    }
    this.busy = true;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiters.shift();
      if (next) next.grant();
      else this.busy = false;
    };
  }
}
