/**
 * The download phase of an install: fetches the plan's ranges, several at a time, places their
 * bytes in the model files, keeps the resume journal and the whole-file hashes.
 *
 * Ordering: ranges are taken in plan order. A range of a shard whose whole-file hash is
 * computed must be hashed in file order, so once placed it waits (holding its bytes and its
 * slot) until the ranges before it are hashed; at most `concurrency + 1` ranges are held at
 * once, which bounds memory. Its journal entry, written after the data files are fsynced,
 * carries the hash state after it, so a resume continues the hash.
 */
import { createHash } from "node:crypto";
import { type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { UserError } from "../errors.ts";
import { produceUnit } from "../import/importer.ts";
import { type QuantVariant } from "../import/quantize.ts";
import { writeFully } from "../fs.ts";
import { mapWriteError } from "./files.ts";
import { type HashWorker } from "./hasher.ts";
import { type HubClient } from "./hub.ts";
import { type Journal, type JournalEntry } from "./journal.ts";
import { unitExtents, unitStart, type InstallPlan, type RangePlan } from "./plan.ts";
import { type ProgressReporter } from "./progress.ts";
import { RetryableError, withRetry, type RetryInfo, type RetryPolicy } from "./retry.ts";

/** A shard whose whole-file hash fails is fetched this many times before giving up. */
export const SHARD_ATTEMPTS = 2;

export class PausedError extends Error {
  constructor() {
    super("paused");
    this.name = "PausedError";
  }
}

export class CancelledError extends Error {
  constructor() {
    super("cancelled");
    this.name = "CancelledError";
  }
}

export interface RangeState {
  placed: boolean;
  /** Its bytes are in the shard's whole-file hash. */
  hashed: boolean;
  /** SHA-256 of the fetched bytes and of the placed bytes (null until placed once). */
  src: string | null;
  out: string | null;
}

export interface ShardState {
  /** The whole-file hash is computed (the ranges cover the file). */
  hashing: boolean;
  /** Also a git blob SHA-1 (files stored in git have no LFS SHA-256 to compare with). */
  sha1: boolean;
  attempt: number;
  /** Index into the shard's ranges of the next one to hand to the hasher. */
  next: number;
  /** Ranges hashed and journaled (a prefix of the shard's ranges). */
  hashedCount: number;
  /** Hash states after the last hashed range (null: fresh). */
  state256: Uint8Array | null;
  state1: Uint8Array | null;
  verified: boolean;
  computedSha256: string | null;
  waiting: Map<number, { bytes: Buffer; src: string; out: string; touched: Set<string> }>;
}

/** Progress of every range and shard, rebuilt from the journal on resume. */
export class InstallState {
  readonly ranges: RangeState[];
  readonly shards: ShardState[];

  constructor(private readonly plan: InstallPlan) {
    this.ranges = plan.ranges.map(() => ({ placed: false, hashed: false, src: null, out: null }));
    this.shards = plan.shards.map((s) => ({
      hashing: s.complete,
      sha1: s.complete && s.file.lfsSha256 === null,
      attempt: 0,
      next: 0,
      hashedCount: 0,
      state256: null,
      state1: null,
      verified: false,
      computedSha256: null,
      waiting: new Map(),
    }));
  }

  /** Forgets everything about shard `index` (its hash failed). */
  reset(index: number): void {
    const st = this.shards[index]!;
    st.next = 0;
    st.hashedCount = 0;
    st.state256 = null;
    st.state1 = null;
    st.verified = false;
    st.computedSha256 = null;
    for (const id of this.plan.shards[index]!.ranges) {
      this.ranges[id] = { placed: false, hashed: false, src: null, out: null };
    }
  }

  apply(e: JournalEntry): void {
    if ("reset" in e) {
      if (!this.plan.shards[e.reset]) return;
      this.reset(e.reset);
      this.shards[e.reset]!.attempt = e.attempt;
      return;
    }
    const r = this.plan.ranges[e.r];
    const st = this.ranges[e.r];
    if (!r || !st) return;
    st.placed = true;
    st.src = e.src;
    st.out = e.out;
    const sh = this.shards[r.shard]!;
    if (e.h !== undefined && sh.hashing) {
      st.hashed = true;
      sh.state256 = Buffer.from(e.h, "base64");
      if (e.h1 !== undefined) sh.state1 = Buffer.from(e.h1, "base64");
      sh.next = this.plan.shards[r.shard]!.ranges.indexOf(e.r) + 1;
      sh.hashedCount = sh.next;
    }
  }

  /** Bytes a range places in the model files. */
  outBytes(r: RangePlan): number {
    return r.units.reduce(
      (a, u) => a + unitExtents(this.plan.units[u]!).reduce((b, x) => b + x.length, 0),
      0,
    );
  }

  complete(): boolean {
    return this.ranges.every((r) => r.placed) && this.shards.every((s) => !s.hashing || s.verified);
  }
}

/** What the downloader needs from the install around it. */
export interface DownloadContext {
  plan: InstallPlan;
  state: InstallState;
  hub: HubClient;
  retry: RetryPolicy;
  journal: Journal;
  hasher: HashWorker | null;
  handles: Map<string, FileHandle>;
  progress: ProgressReporter;
  control: {
    readonly cancelled: boolean;
    readonly paused: boolean;
    readonly cancelSignal: AbortSignal;
    readonly requestSignal: AbortSignal;
    waitWhilePaused(): Promise<void>;
    wake(): void;
  };
  concurrency: number;
  durable: boolean;
  quantVariant?: QuantVariant;
  beforeWrite?: (file: string, offset: number, length: number) => void;
  modelDir: string;
  stagingDir: string;
  note(text: string): void;
  onRetry(what: string): (info: RetryInfo) => void;
  finalError(error: unknown, what: string): unknown;
}

/** A serial section (journal appends and hash sequencing). */
class Mutex {
  private tail: Promise<void> = Promise.resolve();
  run<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.tail.then(fn);
    this.tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }
}

class Semaphore {
  private waiters: (() => void)[] = [];
  private closed = false;
  constructor(private free: number) {}
  /** Resolves true with a slot, or false once the semaphore is closed. */
  async acquire(): Promise<boolean> {
    if (this.closed) return false;
    if (this.free > 0) {
      this.free--;
      return true;
    }
    await new Promise<void>((r) => this.waiters.push(r));
    return !this.closed;
  }
  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.free++;
  }
  /** Wakes every waiter without a slot (the run is ending). */
  close(): void {
    this.closed = true;
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }
}

function sha256Hex(data: Uint8Array): string {
  return createHash("sha256").update(data).digest("hex");
}

const key256 = (shard: number): string => `s${shard}`;
const key1 = (shard: number): string => `s${shard}.sha1`;

export class Downloader {
  private readonly queue: RangePlan[];
  private readonly mutex = new Mutex();
  private readonly slots: Semaphore;
  private readonly failCtl = new AbortController();
  private inflight = 0;
  private fatal: unknown = null;
  private wakeWaiters: () => void = () => undefined;
  private changed = new Promise<void>((r) => (this.wakeWaiters = r));

  constructor(private readonly ctx: DownloadContext) {
    this.queue = ctx.plan.ranges.filter((r) => !ctx.state.ranges[r.id]!.placed);
    this.slots = new Semaphore(ctx.concurrency + 1);
  }

  async run(): Promise<void> {
    const { ctx } = this;
    for (let i = 0; i < ctx.plan.shards.length; i++) await this.initHash(i);
    const onCancel = (): void => this.stop(new CancelledError());
    ctx.control.cancelSignal.addEventListener("abort", onCancel, { once: true });
    try {
      await Promise.all(Array.from({ length: ctx.concurrency }, () => this.worker()));
    } finally {
      ctx.control.cancelSignal.removeEventListener("abort", onCancel);
    }
    if (this.fatal !== null) throw ctx.finalError(this.fatal, "the checkpoint");
    if (ctx.control.cancelled) throw ctx.finalError(new CancelledError(), "the checkpoint");
  }

  private async initHash(index: number): Promise<void> {
    const sh = this.ctx.state.shards[index]!;
    if (!sh.hashing) return;
    const hasher = this.ctx.hasher!;
    await hasher.init(key256(index), "sha256", sh.state256);
    if (sh.sha1) {
      const size = this.ctx.plan.shards[index]!.file.size;
      await hasher.init(key1(index), "sha1", sh.state1, `blob ${size}\0`);
    }
  }

  private notify(): void {
    const w = this.wakeWaiters;
    this.changed = new Promise<void>((r) => (this.wakeWaiters = r));
    w();
  }

  /** Ends the run: the first error wins; everything waiting wakes up and returns. */
  private stop(error: unknown): void {
    if (this.fatal === null) {
      this.fatal =
        error instanceof CancelledError || this.ctx.control.cancelled
          ? new CancelledError()
          : error;
    }
    this.failCtl.abort(new CancelledError());
    this.slots.close();
    this.ctx.control.wake();
    this.notify();
  }

  private async worker(): Promise<void> {
    const { ctx } = this;
    for (;;) {
      if (this.fatal !== null) return;
      if (this.queue.length === 0) {
        if (ctx.state.complete()) return;
        if (this.inflight === 0) {
          // Nothing queued or running: a shard fully hashed by an earlier run needs its check.
          await this.mutex
            .run(async () => {
              for (let i = 0; i < ctx.plan.shards.length; i++) await this.finishShard(i);
            })
            .catch((error: unknown) => this.stop(error));
          if (this.fatal !== null) return;
          if (this.queue.length === 0 && !ctx.state.complete()) {
            this.stop(new Error("internal error: the install stalled"));
          }
          continue;
        }
        await this.changed;
        continue;
      }
      await ctx.control.waitWhilePaused();
      if (ctx.control.cancelled) this.stop(new CancelledError());
      if (this.fatal !== null) return;
      if (!(await this.slots.acquire())) return;
      if (ctx.control.paused) {
        this.slots.release();
        continue;
      }
      const r = this.queue.shift();
      if (!r) {
        this.slots.release();
        continue;
      }
      this.inflight++;
      let holdsSlot = true;
      try {
        await this.processRange(r);
        holdsSlot = false; // released by processRange, or by sequence once hashed
      } catch (error) {
        if (error instanceof PausedError || (ctx.control.paused && !ctx.control.cancelled)) {
          this.queue.unshift(r);
        } else this.stop(error);
      } finally {
        if (holdsSlot) this.slots.release();
        this.inflight--;
        this.notify();
      }
    }
  }

  /** Fetches one range with retries and the checks that need the plan. */
  private async fetch(r: RangePlan, known: string | null, signal: AbortSignal): Promise<Buffer> {
    const { ctx } = this;
    const sp = ctx.plan.shards[r.shard]!;
    try {
      return await withRetry(
        async () => {
          const b = await ctx.hub.getRange({
            repo: ctx.plan.repo,
            commit: ctx.plan.commit,
            file: sp.file,
            identity: sp.identity,
            start: r.start,
            length: r.length,
            signal,
            onBytes: (n) => ctx.progress.add(n),
          });
          const headerEnd = Math.min(sp.header.length, r.start + r.length);
          if (
            r.start < headerEnd &&
            !b.subarray(0, headerEnd - r.start).equals(sp.header.subarray(r.start, headerEnd))
          ) {
            ctx.progress.add(-b.length);
            throw new RetryableError(
              `the safetensors header of ${sp.path} arrived different from before`,
            );
          }
          if (known !== null && sha256Hex(b) !== known) {
            ctx.progress.add(-b.length);
            throw new RetryableError(
              `bytes ${r.start}-${r.start + r.length - 1} of ${sp.path} arrived different from the first time`,
            );
          }
          return b;
        },
        ctx.retry,
        signal,
        ctx.onRetry(sp.path),
      );
    } catch (error) {
      throw ctx.finalError(error, sp.path);
    }
  }

  private async processRange(r: RangePlan): Promise<void> {
    const { ctx } = this;
    const sp = ctx.plan.shards[r.shard]!;
    const st = ctx.state.ranges[r.id]!;
    const sh = ctx.state.shards[r.shard]!;
    const feedsHash = sh.hashing && !st.hashed;
    ctx.progress.file = sp.path;
    const known = st.src;
    const signal = AbortSignal.any([ctx.control.requestSignal, this.failCtl.signal]);
    const bytes = await this.fetch(r, known, signal);
    const src = known ?? sha256Hex(bytes);
    const out = createHash("sha256");
    const touched = new Set<string>();
    for (const id of r.units) {
      const u = ctx.plan.units[id]!;
      const off = unitStart(u) - r.start;
      for (const p of produceUnit(u, bytes.subarray(off, off + u.length), ctx.quantVariant)) {
        out.update(p.data);
        await this.write(p.file, p.offset, p.data);
        touched.add(p.file);
      }
    }
    const outDigest = out.digest("hex");
    st.src = src;
    st.out = outDigest;
    if (feedsHash) {
      sh.waiting.set(r.id, { bytes, src, out: outDigest, touched });
      this.sequence(r.shard);
    } else {
      await this.mutex.run(async () => {
        await this.sync(touched);
        await ctx.journal.add({ r: r.id, src, out: outDigest });
        st.placed = true;
      });
      this.slots.release();
    }
  }

  private async write(file: string, offset: number, data: Uint8Array): Promise<void> {
    try {
      this.ctx.beforeWrite?.(file, offset, data.byteLength);
      await writeFully(this.ctx.handles.get(file)!, data, offset);
    } catch (error) {
      throw mapWriteError(error, join(this.ctx.modelDir, file), this.ctx.stagingDir);
    }
  }

  private async sync(touched: Set<string>): Promise<void> {
    if (!this.ctx.durable) return;
    for (const f of touched) await this.ctx.handles.get(f)!.datasync();
  }

  /**
   * Hands the shard's waiting ranges that are next in file order to the hash worker (which
   * works through them in order, beside the downloads), then journals each with the state the
   * worker returns. Journal appends are serialized; a failure there ends the run.
   */
  private sequence(index: number): void {
    const { ctx } = this;
    const sh = ctx.state.shards[index]!;
    const sp = ctx.plan.shards[index]!;
    const attempt = sh.attempt;
    for (;;) {
      const id = sp.ranges[sh.next];
      if (id === undefined) break;
      const w = sh.waiting.get(id);
      if (!w) break;
      sh.waiting.delete(id);
      sh.next++;
      const keys = sh.sha1 ? [key256(index), key1(index)] : [key256(index)];
      const states = ctx.hasher!.update(keys, w.bytes);
      this.mutex
        .run(async () => {
          const [s256, s1] = await states;
          if (sh.attempt !== attempt) return; // the shard was reset meanwhile
          sh.state256 = s256!;
          sh.state1 = s1 ?? null;
          await this.sync(w.touched);
          await ctx.journal.add({
            r: id,
            src: w.src,
            out: w.out,
            h: Buffer.from(sh.state256).toString("base64"),
            ...(sh.state1 ? { h1: Buffer.from(sh.state1).toString("base64") } : {}),
          });
          const st = ctx.state.ranges[id]!;
          st.placed = true;
          st.hashed = true;
          sh.hashedCount++;
          await this.finishShard(index);
        })
        .catch((error: unknown) => this.stop(error))
        .finally(() => {
          this.slots.release();
          this.notify();
        });
    }
  }

  /** Once a shard is fully hashed: compare with the hub; on a mismatch fetch it once more. */
  private async finishShard(index: number): Promise<void> {
    const { ctx } = this;
    const sh = ctx.state.shards[index]!;
    const sp = ctx.plan.shards[index]!;
    if (this.fatal !== null) return;
    if (!sh.hashing || sh.verified || sh.hashedCount < sp.ranges.length) return;
    const sha256 = await ctx.hasher!.digest(key256(index));
    const got = sh.sha1 ? await ctx.hasher!.digest(key1(index)) : sha256;
    const expected = sp.file.lfsSha256 ?? sp.file.blobId;
    if (expected === null || got === expected) {
      sh.verified = true;
      sh.computedSha256 = sha256;
      return;
    }
    const attempt = sh.attempt + 1;
    if (attempt >= SHARD_ATTEMPTS) {
      throw new UserError(
        `${sp.path} of ${ctx.plan.repo} does not match the hub's ${sh.sha1 ? "git blob id" : "SHA-256"} (${expected}) after ${attempt} downloads (got ${got}): the server or something between it and you alters data. The partial install is kept; try again later or use another HF_ENDPOINT`,
        "source_corrupt",
      );
    }
    ctx.note(`${sp.path} did not match its SHA-256 (damaged in transit?); fetching it again`);
    await ctx.journal.add({ reset: index, attempt });
    for (const id of sp.ranges) {
      if (ctx.state.ranges[id]!.placed) ctx.progress.done -= ctx.plan.ranges[id]!.length;
    }
    ctx.state.reset(index);
    sh.attempt = attempt;
    await this.initHash(index);
    this.queue.unshift(...sp.ranges.map((id) => ctx.plan.ranges[id]!));
  }
}
