/**
 * Resumable whole-file hashes computed on a worker thread. Each shard's SHA-256 (or git blob
 * SHA-1) is fed the shard's bytes in file order; after every update the worker returns the
 * hash state, which the journal keeps so that a resumed install continues the hash where it
 * stopped instead of fetching the file again. hash-wasm provides states that can be saved and
 * loaded; it is slower than OpenSSL, hence the thread.
 */
import { Worker } from "node:worker_threads";

interface Reply {
  id: number;
  states?: Uint8Array[];
  hex?: string;
  error?: string;
}

export class HashWorker {
  private readonly worker: Worker;
  private next = 0;
  private readonly pending = new Map<
    number,
    { resolve: (r: Reply) => void; reject: (e: Error) => void }
  >();

  constructor() {
    this.worker = new Worker(new URL("./hash-worker.mjs", import.meta.url));
    this.worker.unref();
    this.worker.on("message", (r: Reply) => {
      const p = this.pending.get(r.id);
      if (!p) return;
      this.pending.delete(r.id);
      if (r.error !== undefined) p.reject(new Error(`hash worker: ${r.error}`));
      else p.resolve(r);
    });
    this.worker.on("error", (error) => {
      for (const p of this.pending.values()) p.reject(error);
      this.pending.clear();
    });
  }

  private call(message: Record<string, unknown>, transfer: ArrayBuffer[] = []): Promise<Reply> {
    const id = this.next++;
    return new Promise<Reply>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ ...message, id }, transfer);
    });
  }

  /** Starts hash `key` fresh (after `prefix`), or from a saved state. */
  async init(
    key: string,
    algo: "sha256" | "sha1",
    state: Uint8Array | null,
    prefix?: string,
  ): Promise<void> {
    await this.call({ op: "init", key, algo, state, prefix });
  }

  /**
   * Feeds `data` to the hashes `keys` and returns their states after it. The bytes are moved
   * to the worker when `data` owns its whole ArrayBuffer (the caller must not use them
   * afterwards), else copied.
   */
  async update(keys: string[], data: Buffer): Promise<Uint8Array[]> {
    const owns =
      data.byteOffset === 0 &&
      data.byteLength === data.buffer.byteLength &&
      data.buffer instanceof ArrayBuffer;
    const buf = owns ? (data.buffer as ArrayBuffer) : new Uint8Array(data).buffer;
    const r = await this.call(
      { op: "update", keys, data: buf, offset: 0, length: data.byteLength },
      [buf],
    );
    return r.states!;
  }

  async digest(key: string): Promise<string> {
    return (await this.call({ op: "digest", key })).hex!;
  }

  async close(): Promise<void> {
    await this.worker.terminate();
  }
}
