/**
 * The model installer: downloads a checkpoint from a Hugging Face hub (or a mirror) straight
 * into a Redwing model directory, resumably and verified. docs/install.md has the long version.
 *
 * 1. Resolve the revision to a commit and pin every request to it. Fetch the small metadata
 *    files whole (config, index, tokenizer...) and each shard's safetensors header with a range
 *    request; plan the import with the importer's own code (planImport, layoutImport,
 *    importUnits) and group its units into ranges of at most `maxRangeBytes` (plan.ts).
 * 2. Fetch ranges, several at a time, and place their bytes at their final offsets in the model
 *    files (created sparse at their final sizes), quantizing float rows on the way
 *    (produceUnit). The layout is known before the first byte arrives, so data goes straight
 *    into the runtime format in any order: no copy of the checkpoint, no staging area, and the
 *    disk never holds more than the install size (download.ts).
 * 3. After each range: fsync the data files, then append to the journal the SHA-256 of the
 *    fetched and of the placed bytes, and the running whole-file hash state. A resume re-reads
 *    and rehashes every placed range and fetches only what is missing or wrong.
 * 4. Hash the finished data files, write manifest.json, check the directory with the
 *    reference reader and rename it into place.
 *
 * What is verified:
 * - metadata files: SHA-256 (LFS) or git blob id against the hub's listing, on every fetch;
 * - shards, in "full" mode (the default; in "ranges" mode only shards fetched completely): the
 *   SHA-256 of the whole file against the hub's LFS SHA-256 (git blob id for files kept in
 *   git), computed in file order across restarts. On a mismatch the shard is fetched once more
 *   (its ranges are placed again), then the install fails;
 * - every response: the commit (X-Repo-Commit), the file's ETag and size as planned,
 *   Content-Range, a constant data-server ETag, the safetensors header bytes equal to those
 *   planned, and on a re-fetch the bytes equal to those hashed the first time (journal);
 * - on resume: every placed range is re-read and compared with its journaled digest;
 * - the manifest's file hashes are computed from the finished files; the directory is checked
 *   with readModelDir before and after the rename.
 * In "ranges" mode a shard that also holds skipped (vision/audio) tensors is not fetched whole,
 * so its bytes are only checked structurally; damage in transit there goes undetected.
 */
import { createHash } from "node:crypto";
import { mkdir, open, readFile, rm, statfs, writeFile, type FileHandle } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { METADATA_FILES } from "../catalog/catalog.ts";
import { UserError } from "../errors.ts";
import {
  EXPERTS_DIR,
  EXPERT_ALIGNMENT,
  FORMAT_NAME,
  FORMAT_VERSION,
  MANIFEST_FILE,
  ManifestSchema,
  checkManifestLayout,
  type FileEntry,
  type Manifest,
} from "../format/manifest.ts";
import { readModelDir } from "../format/read.ts";
import { checkDestination, moveIntoPlace } from "../format/writer.ts";
import { type QuantVariant } from "../import/quantize.ts";
import { safetensorsHeaderLength } from "../import/safetensors.ts";
import { CancelledError, Downloader, InstallState, PausedError } from "./download.ts";
import { exists, fsyncDir } from "../fs.ts";
import { mapWriteError, readFully } from "./files.ts";
import { HashWorker } from "./hasher.ts";
import {
  HubClient,
  SourceChangedError,
  defaultHubOptions,
  gitBlobId,
  isNetworkFailure,
  type FileIdentity,
  type HubOptions,
  type RepoFile,
} from "./hub.ts";
import { Journal, readJournal, type JournalHeader } from "./journal.ts";
import { acquireLock } from "./lock.ts";
import {
  buildInstallPlan,
  planArchitecture,
  shardNames,
  unitExtents,
  type InstallPlan,
  type PlanSources,
  type VerifyMode,
} from "./plan.ts";
import { ProgressReporter, type InstallPhase, type InstallProgress } from "./progress.ts";
import { RetryableError, withRetry, type RetryInfo } from "./retry.ts";
import { formatBytes } from "../units.ts";

export type { InstallPhase, InstallProgress };

export interface InstallRequest {
  repo: string;
  /** Branch, tag or commit; null or absent: `main`, resolved to a commit. */
  revision?: string | null;
  /** The model directory to create. */
  dest: string;
}

export interface InstallOptions {
  /** Replace a model already installed at `dest`. */
  force?: boolean;
  /** Cancels the install (the partial download is kept for a resume). */
  signal?: AbortSignal;
  onProgress?: (progress: InstallProgress) => void;
  /** Hub endpoint, token, retry policy, stall timeout (defaults from HF_ENDPOINT / HF_TOKEN). */
  hub?: Partial<HubOptions>;
  /** Environment to read HF_ENDPOINT / HF_TOKEN from (default process.env). */
  env?: Record<string, string | undefined>;
  /** Ranges fetched at once (default 4). */
  concurrency?: number;
  /** Largest range (default 16 MiB). */
  maxRangeBytes?: number;
  /** Largest unit processed at once (default 8 MiB). */
  unitBytes?: number;
  /** Whole-file verification of shards (default "full"; see plan.ts). */
  verify?: VerifyMode;
  /** Free space kept beyond the install size (default 1 GiB). */
  reserveBytes?: number;
  /** Recorded as the manifest's `created_by`. */
  createdBy?: string;
  /** fsync data and journal (default true; tests may turn it off). */
  durable?: boolean;
  quantVariant?: QuantVariant;
  /** Fault injection for tests. */
  testHooks?: {
    /** Called before each data write; may throw (e.g. an ENOSPC error). */
    beforeWrite?: (file: string, offset: number, length: number) => void;
    /** Overrides the free-space probe (bytes available). */
    freeBytes?: () => number;
  };
}

export interface InstallResult {
  dir: string;
  manifest: Manifest;
  repo: string;
  commit: string;
  /** Bytes of tensor data fetched in this run (not counting failed attempts). */
  fetchedBytes: number;
  /** Bytes of tensor data kept from an earlier, interrupted run. */
  reusedBytes: number;
  /** Bytes of tensor data the install needs in all (the ranges of the plan). */
  rangeBytes: number;
  /** Bytes of metadata files and header probes fetched. */
  metadataBytes: number;
  /** Requests retried. */
  retries: number;
  seconds: number;
  notes: string[];
  /** Shards whose whole-file hash was checked, and those only checked structurally. */
  verifiedShards: string[];
  uncheckedShards: string[];
}

const MiB = 1024 * 1024;
const HEADER_PROBE_BYTES = 256 * 1024;

/** Where an install of `dest` keeps its state: all of it next to `dest`, on the same disk. */
export function installPaths(dest: string): {
  dest: string;
  parent: string;
  name: string;
  /** `.<name>.install/`: journal.jsonl, src/ (metadata files), model/ (the model being built). */
  staging: string;
  lock: string;
  model: string;
  journal: string;
  src: string;
} {
  const abs = resolve(dest);
  const parent = dirname(abs);
  const name = basename(abs);
  const staging = join(parent, `.${name}.install`);
  return {
    dest: abs,
    parent,
    name,
    staging,
    lock: join(parent, `.${name}.install.lock`),
    model: join(staging, "model"),
    journal: join(staging, "journal.jsonl"),
    src: join(staging, "src"),
  };
}

/** Pause, resume and cancel of one install. */
class Control {
  private readonly cancelCtl = new AbortController();
  private pauseCtl = new AbortController();
  private pausedFlag = false;
  private waiters: (() => void)[] = [];
  onPauseChange: (paused: boolean) => void = () => undefined;

  constructor(external?: AbortSignal) {
    if (external?.aborted) this.cancel();
    else external?.addEventListener("abort", () => this.cancel(), { once: true });
  }

  get cancelled(): boolean {
    return this.cancelCtl.signal.aborted;
  }

  get paused(): boolean {
    return this.pausedFlag;
  }

  /** Aborts on cancel only (planning, verifying and finishing are not paused). */
  get cancelSignal(): AbortSignal {
    return this.cancelCtl.signal;
  }

  /** Aborts on cancel or pause (range downloads). */
  get requestSignal(): AbortSignal {
    return AbortSignal.any([this.cancelCtl.signal, this.pauseCtl.signal]);
  }

  cancel(): void {
    if (!this.cancelCtl.signal.aborted) this.cancelCtl.abort(new CancelledError());
    this.wake();
  }

  pause(): void {
    if (this.pausedFlag || this.cancelled) return;
    this.pausedFlag = true;
    this.pauseCtl.abort(new PausedError());
    this.onPauseChange(true);
  }

  resume(): void {
    if (!this.pausedFlag) return;
    this.pausedFlag = false;
    this.pauseCtl = new AbortController();
    this.onPauseChange(false);
    this.wake();
  }

  /** Wakes everything waiting for a resume. */
  wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  async waitWhilePaused(): Promise<void> {
    while (this.pausedFlag && !this.cancelled) {
      await new Promise<void>((r) => this.waiters.push(r));
    }
  }
}

/** A running install: `result` settles when it ends; pause, resume and cancel steer it. */
export class InstallTask {
  readonly result: Promise<InstallResult>;
  private readonly control: Control;

  constructor(request: InstallRequest, options: InstallOptions = {}) {
    this.control = new Control(options.signal);
    this.result = new Installation(request, options, this.control).run();
  }

  /** Stops fetching; ranges in flight are abandoned and fetched again after `resume`. */
  pause(): void {
    this.control.pause();
  }

  resume(): void {
    this.control.resume();
  }

  /** Stops the install; the partial download is kept for a later resume. */
  cancel(): void {
    this.control.cancel();
  }

  get paused(): boolean {
    return this.control.paused;
  }
}

export function startInstall(request: InstallRequest, options: InstallOptions = {}): InstallTask {
  return new InstallTask(request, options);
}

/** Installs and returns when done; `options.signal` cancels. */
export function installModel(
  request: InstallRequest,
  options: InstallOptions = {},
): Promise<InstallResult> {
  return startInstall(request, options).result;
}

/**
 * Removes the partial install of `dest` (journal, metadata, data) if there is one. Refuses
 * while an installer is working on it. Returns the paths removed.
 */
export async function discardPartial(dest: string): Promise<string[]> {
  const p = installPaths(dest);
  if (!(await exists(p.staging)) && !(await exists(p.lock))) return [];
  const lock = await acquireLock(p.lock, p.dest);
  const removed: string[] = [];
  try {
    if (await exists(p.staging)) {
      await rm(p.staging, { recursive: true, force: true });
      removed.push(p.staging);
    }
  } finally {
    await lock.release();
  }
  return removed;
}

/** True when `dest` has an unfinished install that a rerun would resume. */
export async function hasPartial(dest: string): Promise<boolean> {
  return exists(installPaths(dest).journal);
}

function sha256Hex(data: Uint8Array): string {
  return createHash("sha256").update(data).digest("hex");
}

/** True when a whole file matches the hub's listing (size and LFS SHA-256 or git blob id). */
function matchesListing(f: RepoFile, bytes: Buffer): boolean {
  if (bytes.length !== f.size) return false;
  if (f.lfsSha256) return sha256Hex(bytes) === f.lfsSha256;
  if (f.blobId) return gitBlobId(bytes) === f.blobId;
  return false;
}

/** One install from start to finish. */
class Installation {
  private readonly paths: ReturnType<typeof installPaths>;
  private readonly env: Record<string, string | undefined>;
  private readonly hubOptions: HubOptions;
  private readonly hub: HubClient;
  private readonly progress: ProgressReporter;
  private readonly durable: boolean;
  private readonly notes: string[] = [];
  private readonly handles = new Map<string, FileHandle>();
  private journal: Journal | null = null;
  private hasher: HashWorker | null = null;
  private retries = 0;
  private metadataBytes = 0;

  constructor(
    private readonly req: InstallRequest,
    private readonly opts: InstallOptions,
    private readonly control: Control,
  ) {
    this.paths = installPaths(req.dest);
    this.env = opts.env ?? process.env;
    this.hubOptions = { ...defaultHubOptions(this.env), ...opts.hub };
    this.durable = opts.durable ?? true;
    this.progress = new ProgressReporter(opts.onProgress);
    this.hub = new HubClient(this.hubOptions, (text) => this.note(text));
  }

  private note(text: string): void {
    this.notes.push(text);
    this.progress.note(text);
  }

  private onRetry(what: string): (info: RetryInfo) => void {
    return (info) => {
      this.retries++;
      this.progress.note(
        `${what}: ${info.error.message}; retry ${info.attempt} in ${(info.delayMs / 1000).toFixed(1)} s`,
      );
    };
  }

  /** Turns what ended a request or the run into the error the user sees. */
  private finalError(error: unknown, what: string): unknown {
    if (error instanceof CancelledError) {
      return new UserError(
        `the install was cancelled; run the same command again to resume (the partial download is kept in ${this.paths.staging}), or pass --discard-partial to remove it`,
        "interrupted",
      );
    }
    if (!(error instanceof RetryableError)) return error;
    const attempts = this.hubOptions.retry.attempts;
    if (isNetworkFailure(error)) {
      const mirror = this.env.HF_ENDPOINT ? ` and HF_ENDPOINT=${this.env.HF_ENDPOINT}` : "";
      return new UserError(
        `cannot reach ${this.hubOptions.endpoint} (${error.code}) while fetching ${what}, after ${attempts} attempts: check the network connection${mirror}, then run the same command again to resume`,
        "network",
      );
    }
    return new UserError(
      `fetching ${what} failed after ${attempts} attempts: ${error.message}; run the same command again to resume`,
      "download_failed",
    );
  }

  private async retry<T>(what: string, fn: () => Promise<T>): Promise<T> {
    const signal = this.control.cancelSignal;
    try {
      return await withRetry(fn, this.hubOptions.retry, signal, this.onRetry(what));
    } catch (error) {
      throw this.finalError(error, what);
    }
  }

  async run(): Promise<InstallResult> {
    const started = Date.now();
    await mkdir(this.paths.parent, { recursive: true });
    const lock = await acquireLock(this.paths.lock, this.paths.dest);
    try {
      await checkDestination(this.paths.dest, this.opts.force ?? false);
      const previous = await readJournal(this.paths.journal);
      const sources = await this.resolve(previous?.header ?? null);
      const plan = buildInstallPlan(sources, {
        verify: this.opts.verify ?? "full",
        maxRangeBytes: this.opts.maxRangeBytes ?? 16 * MiB,
        unitBytes: this.opts.unitBytes ?? 8 * MiB,
        maxGapBytes: MiB,
      });
      const state = new InstallState(plan);
      const valid = previous !== null && previous.header.plan === plan.digest;
      if (previous && !valid) {
        this.note("the earlier partial install was for other files or options; starting over");
      }
      if (valid) for (const e of previous.entries) state.apply(e);
      await this.checkSpace(plan, state);
      await this.openFiles(plan, valid);
      await this.verifyPlaced(plan, state);
      const reusedBytes = plan.ranges.reduce(
        (a, r) => a + (state.ranges[r.id]!.placed ? r.length : 0),
        0,
      );
      if (reusedBytes > 0) {
        this.note(
          `resuming: ${formatBytes(reusedBytes)} of ${formatBytes(plan.rangeBytes)} already downloaded and verified`,
        );
      }
      await this.download(plan, state, reusedBytes);
      const fetchedBytes = this.progress.received;
      const manifest = await this.finish(plan, state);
      return {
        dir: this.paths.dest,
        manifest,
        repo: plan.repo,
        commit: plan.commit,
        fetchedBytes,
        reusedBytes,
        rangeBytes: plan.rangeBytes,
        metadataBytes: this.metadataBytes,
        retries: this.retries,
        seconds: (Date.now() - started) / 1000,
        notes: this.notes,
        verifiedShards: plan.shards.filter((_, i) => state.shards[i]!.verified).map((s) => s.path),
        uncheckedShards: plan.shards.filter((_, i) => !state.shards[i]!.hashing).map((s) => s.path),
      };
    } catch (error) {
      // Nothing to resume before the journal exists: leave no staging area behind.
      if (this.journal === null && !(await exists(this.paths.journal))) {
        await rm(this.paths.staging, { recursive: true, force: true });
      }
      if (error instanceof CancelledError || this.control.cancelled) {
        throw this.finalError(new CancelledError(), "");
      }
      throw error;
    } finally {
      for (const h of this.handles.values()) await h.close().catch(() => undefined);
      await this.journal?.close();
      await this.hasher?.close();
      await lock.release();
    }
  }

  /** The commit, its files, the metadata files and the shard headers. */
  private async resolve(previous: JournalHeader | null): Promise<PlanSources> {
    const { repo } = this.req;
    const revision = this.req.revision ?? "main";
    this.progress.setPhase("resolving", 0, 0, null);
    let info = await this.retry(`the file list of ${repo}@${revision}`, () =>
      this.hub.revisionInfo(repo, revision, this.control.cancelSignal),
    );
    // A branch that moved since the partial install began: finish what was started.
    if (
      previous?.repo === repo &&
      previous.commit !== info.commit &&
      !/^[0-9a-f]{40}$/.test(revision)
    ) {
      this.note(
        `resuming the partial install of commit ${previous.commit.slice(0, 12)}; ${revision} now points at ${info.commit.slice(0, 12)} (pass --discard-partial first to install that instead)`,
      );
      info = await this.retry(`the file list of ${repo}@${previous.commit}`, () =>
        this.hub.revisionInfo(repo, previous.commit, this.control.cancelSignal),
      );
    }
    const commit = info.commit;
    const files = new Map<string, RepoFile>();
    for (const f of info.files) if (!f.path.includes("/")) files.set(f.path, f);
    if (!files.has("config.json")) {
      throw new UserError(
        `${repo}@${commit.slice(0, 12)} has no config.json; it is not a Hugging Face or MLX model checkpoint`,
        "checkpoint_incomplete",
      );
    }
    const metadata = await this.fetchMetadata(repo, commit, files);
    // Unsupported architectures stop here, before any tensor data is fetched.
    planArchitecture(metadata);
    this.progress.setPhase("planning", 0, 0, null);
    const identities = new Map<string, FileIdentity>();
    const headers = new Map<string, Buffer>();
    for (const name of shardNames(files, metadata, repo)) {
      const f = files.get(name);
      if (!f) {
        throw new UserError(
          `${name} is listed in model.safetensors.index.json but ${repo}@${commit.slice(0, 12)} has no such file`,
          "checkpoint_incomplete",
        );
      }
      const identity = await this.retry(name, () =>
        this.hub.headFile(repo, commit, name, this.control.cancelSignal),
      );
      if (f.size < 0) f.size = identity.size;
      if (identity.size >= 0 && identity.size !== f.size) {
        throw new SourceChangedError(
          `${name} of ${repo} has ${identity.size} bytes on the server but the hub lists ${f.size}; try again later`,
        );
      }
      identities.set(name, identity);
      this.progress.setPhase("planning", 0, 0, name);
      headers.set(name, await this.fetchHeader(repo, commit, f, identity));
    }
    return { repo, commit, files, metadata, identities, headers };
  }

  /** The metadata files, fetched whole and checked, or taken from the staging cache. */
  private async fetchMetadata(
    repo: string,
    commit: string,
    files: Map<string, RepoFile>,
  ): Promise<Map<string, Buffer>> {
    await mkdir(this.paths.src, { recursive: true });
    const metadata = new Map<string, Buffer>();
    for (const name of METADATA_FILES) {
      const f = files.get(name);
      if (!f) continue;
      if (f.size < 0) {
        const id = await this.retry(name, () =>
          this.hub.headFile(repo, commit, name, this.control.cancelSignal),
        );
        if (id.size < 0) {
          throw new UserError(`the hub does not say how large ${name} is`, "hub_protocol");
        }
        f.size = id.size;
      }
      const cached = await readFile(join(this.paths.src, name)).catch(() => null);
      if (cached && matchesListing(f, cached)) {
        metadata.set(name, cached);
        continue;
      }
      this.progress.setPhase("resolving", 0, f.size, name);
      const bytes = await this.retry(name, () =>
        this.hub.getFile(repo, commit, f, this.control.cancelSignal),
      );
      this.metadataBytes += bytes.length;
      await writeFile(join(this.paths.src, name), bytes);
      metadata.set(name, bytes);
    }
    return metadata;
  }

  /** The 8-byte length and JSON header of a shard, with one or two range requests. */
  private async fetchHeader(
    repo: string,
    commit: string,
    file: RepoFile,
    identity: FileIdentity,
  ): Promise<Buffer> {
    const fetch = (start: number, length: number): Promise<Buffer> =>
      this.retry(`the header of ${file.path}`, () =>
        this.hub.getRange({
          repo,
          commit,
          file,
          identity,
          start,
          length,
          signal: this.control.cancelSignal,
        }),
      );
    const first = await fetch(0, Math.min(file.size, HEADER_PROBE_BYTES));
    this.metadataBytes += first.length;
    const n = safetensorsHeaderLength(file.path, first, file.size);
    if (8 + n <= first.length) return Buffer.from(first.subarray(0, 8 + n));
    const rest = await fetch(first.length, 8 + n - first.length);
    this.metadataBytes += rest.length;
    return Buffer.concat([first, rest]);
  }

  /** Free space for what is still to be written, plus the reserve. */
  private async checkSpace(plan: InstallPlan, state: InstallState): Promise<void> {
    const placed = plan.ranges.reduce(
      (a, r) => a + (state.ranges[r.id]!.placed ? state.outBytes(r) : 0),
      0,
    );
    const reserve = this.opts.reserveBytes ?? 1024 * MiB;
    const needed = Math.max(0, plan.installBytes - placed);
    const free = this.opts.testHooks?.freeBytes
      ? this.opts.testHooks.freeBytes()
      : await statfs(this.paths.parent).then((s) => s.bavail * s.bsize);
    if (free < needed + reserve) {
      throw new UserError(
        `not enough free space in ${this.paths.parent}: the install needs ${formatBytes(needed)} more plus a ${formatBytes(reserve)} reserve, and ${formatBytes(free)} is free; free some space or choose another --out`,
        "no_space",
      );
    }
  }

  /** The journal and the data files, created sparse at their final sizes. */
  private async openFiles(plan: InstallPlan, valid: boolean): Promise<void> {
    const header = { v: 1 as const, repo: plan.repo, commit: plan.commit, plan: plan.digest };
    if (valid) this.journal = await Journal.append(this.paths.journal, this.durable);
    else {
      await rm(this.paths.model, { recursive: true, force: true });
      this.journal = await Journal.create(this.paths.journal, header, this.durable);
    }
    await mkdir(join(this.paths.model, EXPERTS_DIR), { recursive: true });
    for (const f of plan.layout.files) {
      const path = join(this.paths.model, f.path);
      const h = await open(path, "r+").catch(() => open(path, "w+"));
      this.handles.set(f.path, h);
      if ((await h.stat()).size !== f.size) await h.truncate(f.size);
    }
  }

  /** Re-reads what an earlier run placed; ranges that changed on disk are fetched again. */
  private async verifyPlaced(plan: InstallPlan, state: InstallState): Promise<void> {
    const placed = plan.ranges.filter((r) => state.ranges[r.id]!.placed);
    if (placed.length === 0) return;
    const total = placed.reduce((a, r) => a + state.outBytes(r), 0);
    this.progress.setPhase("verifying", 0, total, null);
    let bad = 0;
    for (const r of placed) {
      if (this.control.cancelled) throw new CancelledError();
      const hash = createHash("sha256");
      for (const u of r.units) {
        for (const x of unitExtents(plan.units[u]!)) {
          const buf = Buffer.allocUnsafe(x.length);
          await readFully(this.handles.get(x.file)!, buf, x.offset);
          hash.update(buf);
        }
      }
      const st = state.ranges[r.id]!;
      if (hash.digest("hex") !== st.out) {
        st.placed = false;
        bad++;
      }
      this.progress.advance(state.outBytes(r), plan.shards[r.shard]!.path);
    }
    if (bad > 0) {
      this.note(
        `${bad} of ${placed.length} ranges from the earlier run were damaged on disk; fetching them again`,
      );
    }
  }

  private async download(plan: InstallPlan, state: InstallState, reused: number): Promise<void> {
    this.progress.setPhase(
      this.control.paused ? "paused" : "downloading",
      reused,
      plan.rangeBytes,
      null,
    );
    this.control.onPauseChange = (paused) =>
      this.progress.setPhase(
        paused ? "paused" : "downloading",
        this.progress.done,
        this.progress.total,
        this.progress.file,
      );
    if (state.shards.some((s) => s.hashing)) this.hasher = new HashWorker();
    await new Downloader({
      plan,
      state,
      hub: this.hub,
      retry: this.hubOptions.retry,
      journal: this.journal!,
      hasher: this.hasher,
      handles: this.handles,
      progress: this.progress,
      control: this.control,
      concurrency: Math.max(1, this.opts.concurrency ?? 4),
      durable: this.durable,
      quantVariant: this.opts.quantVariant,
      beforeWrite: this.opts.testHooks?.beforeWrite,
      modelDir: this.paths.model,
      stagingDir: this.paths.staging,
      note: (text) => this.note(text),
      onRetry: (what) => this.onRetry(what),
      finalError: (error, what) => this.finalError(error, what),
    }).run();
    this.control.onPauseChange = () => undefined;
  }

  /** Auxiliary files, file hashes, manifest, checks, rename. */
  private async finish(plan: InstallPlan, state: InstallState): Promise<Manifest> {
    const dataTotal = plan.layout.files.reduce((a, f) => a + f.size, 0);
    this.progress.setPhase("finishing", 0, dataTotal, null);
    const files: FileEntry[] = [];
    const buf = Buffer.allocUnsafe(8 * MiB);
    for (const f of plan.layout.files) {
      if (this.control.cancelled) throw new CancelledError();
      const h = this.handles.get(f.path)!;
      if (this.durable) await h.sync();
      const hash = createHash("sha256");
      for (let pos = 0; pos < f.size;) {
        const n = Math.min(buf.length, f.size - pos);
        await readFully(h, buf.subarray(0, n), pos);
        hash.update(buf.subarray(0, n));
        pos += n;
        this.progress.advance(n, f.path);
      }
      files.push({ path: f.path, size: f.size, sha256: hash.digest("hex") });
    }
    const aux: FileEntry[] = [];
    for (const a of plan.auxFiles) {
      const data =
        a.template !== undefined ? Buffer.from(a.template, "utf8") : plan.metadata.get(a.from)!;
      await this.writeFile(join(this.paths.model, a.to), data);
      aux.push({ path: a.to, size: data.length, sha256: sha256Hex(data) });
    }
    files.push(...aux.sort((a, b) => a.path.localeCompare(b.path)));
    // Shards kept in git have no LFS SHA-256: record the one computed while fetching.
    const source = {
      ...plan.source,
      files: plan.source.files.map((f) => {
        const i = plan.shards.findIndex((s) => s.path === f.path);
        const computed = i >= 0 ? state.shards[i]!.computedSha256 : null;
        return computed && plan.shards[i]!.file.lfsSha256 === null ? { ...f, sha256: computed } : f;
      }),
    };
    // Field order and formatting as ModelWriter writes them, so the bytes match an import.
    const manifest: Manifest = {
      format: FORMAT_NAME,
      format_version: FORMAT_VERSION,
      created_by: this.opts.createdBy ?? "redwing",
      architecture: plan.architecture,
      source,
      quantization: plan.importPlan.defaultQuant,
      tensors: plan.layout.tensors,
      experts: plan.layout.expertLayers
        ? { alignment: EXPERT_ALIGNMENT, layers: plan.layout.expertLayers }
        : null,
      files,
    };
    const parsed = ManifestSchema.safeParse(manifest);
    if (!parsed.success) {
      throw new Error(`internal error: invalid manifest: ${parsed.error.message}`);
    }
    const problems = checkManifestLayout(manifest);
    if (problems.length > 0) {
      throw new Error(`internal error: inconsistent manifest: ${problems.slice(0, 5).join("; ")}`);
    }
    for (const h of this.handles.values()) await h.close();
    this.handles.clear();
    await this.writeFile(
      join(this.paths.model, MANIFEST_FILE),
      Buffer.from(JSON.stringify(manifest, null, 1) + "\n"),
    );
    if (this.durable) {
      await fsyncDir(join(this.paths.model, EXPERTS_DIR));
      await fsyncDir(this.paths.model);
    }
    await readModelDir(this.paths.model);
    await this.journal?.close();
    this.journal = null;
    await moveIntoPlace(this.paths.model, this.paths.dest, this.opts.force ?? false, this.durable);
    await rm(this.paths.staging, { recursive: true, force: true });
    const installed = await readModelDir(this.paths.dest);
    this.progress.setPhase("done", dataTotal, dataTotal, null);
    return installed.manifest;
  }

  private async writeFile(path: string, data: Buffer): Promise<void> {
    try {
      const h = await open(path, "w");
      try {
        await h.writeFile(data);
        if (this.durable) await h.sync();
      } finally {
        await h.close();
      }
    } catch (error) {
      throw mapWriteError(error, path, this.paths.staging);
    }
  }
}
