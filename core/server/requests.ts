/**
 * The server's requests in flight, so that an owner can show and cancel them: each one waiting
 * for its turn ("queued") or generating ("running", with the tokens so far), who sent it, and the
 * abort that ends it as if its client had gone away.
 */
import { randomUUID } from "node:crypto";

export interface ServerRequestInfo {
  id: string;
  /** "chat" (/v1/chat/completions) or "completion" (/v1/completions). */
  endpoint: "chat" | "completion";
  /** The client's address and port. */
  client: string;
  state: "queued" | "running";
  /** Tokens generated so far. */
  tokens: number;
  /** The most it may generate. */
  maxTokens: number;
  /** ms since the epoch. */
  receivedAt: number;
}

interface Entry {
  info: ServerRequestInfo;
  abort: AbortController;
  /** Cancelled here (by the owner), not by its client going away: the client gets an answer. */
  cancelled: boolean;
}

export class RequestBook {
  private readonly entries = new Map<string, Entry>();
  /** Called after every change; `progress` is true when only a token count moved. */
  onChange: (progress: boolean) => void = () => undefined;

  /** Records a request; `abort` ends it (it leaves the queue, or its generation stops). */
  add(
    info: Omit<ServerRequestInfo, "id" | "state" | "tokens" | "receivedAt">,
    abort: AbortController,
  ): string {
    const id = randomUUID();
    this.entries.set(id, {
      info: { ...info, id, state: "queued", tokens: 0, receivedAt: Date.now() },
      abort,
      cancelled: false,
    });
    this.onChange(false);
    return id;
  }

  running(id: string): void {
    const entry = this.entries.get(id);
    if (!entry) return;
    entry.info = { ...entry.info, state: "running" };
    this.onChange(false);
  }

  progress(id: string, tokens: number): void {
    const entry = this.entries.get(id);
    if (!entry) return;
    entry.info = { ...entry.info, tokens: entry.info.tokens + tokens };
    this.onChange(true);
  }

  remove(id: string): void {
    if (this.entries.delete(id)) this.onChange(false);
  }

  /** Oldest first. */
  list(): ServerRequestInfo[] {
    return [...this.entries.values()].map((e) => e.info);
  }

  /** Ends a request; false when it is not (or no longer) in flight. */
  cancel(id: string): boolean {
    const entry = this.entries.get(id);
    if (!entry) return false;
    entry.cancelled = true;
    entry.abort.abort();
    return true;
  }

  /** Whether `cancel` ended the request (its client is still there and is told so). */
  cancelled(id: string): boolean {
    return this.entries.get(id)?.cancelled ?? false;
  }
}
