/**
 * Model downloads for the app, on top of core/install:
 *
 * - `install(ref)`: a catalog id or `owner/repo[@revision]` into `<modelsDir>/<name>`; the
 *   demo is made locally instead. Installing over an installed model is refused.
 * - pause: the install is stopped and its partial download kept (the installer's journal);
 *   resume: the same request runs again, and the installer resumes from the journal, re-checking
 *   what was placed. cancel: stopped, and the partial download deleted.
 * - Progress events at most ~4 a second (a state change goes out at once).
 * - Each install runs on its own worker thread (core/install/isolated.ts) with its own heap limit.
 */
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { resolveModelRef } from "../catalog/catalog.ts";
import { DEMO_MODEL_NAME, ensureDemoModel } from "../demo/demo.ts";
import { discardPartial, type InstallProgress } from "../install/installer.ts";
import {
  startInstallInWorker,
  type IsolatedInstallOptions,
  type IsolatedInstallTask,
} from "../install/isolated.ts";
import type { Download } from "./api.ts";
import { AppFailure, toAppError } from "./errors.ts";
import { exists } from "../fs.ts";

/** Progress events per download at most this often. */
export const PROGRESS_INTERVAL_MS = 250;

export interface DownloadManagerOptions {
  modelsDir: string;
  /** HF_ENDPOINT / HF_TOKEN come from here. */
  env: Record<string, string | undefined>;
  createdBy: string;
  onDownload: (download: Download) => void;
  /** A model was installed (verified while downloading). */
  onInstalled: (name: string) => void;
  /** Extra installer options (tests: small ranges, no fsync). */
  install?: Partial<IsolatedInstallOptions>;
  log?: (line: string) => void;
}

interface Entry {
  download: Download;
  request: { repo: string; revision: string | null; dest: string } | null;
  task: IsolatedInstallTask | null;
  /** Settles when the running task has finished (whatever the outcome). */
  settled: Promise<void>;
  /** Why the running task is being stopped. */
  stopping: "pause" | "cancel" | null;
  lastEmit: number;
  timer: NodeJS.Timeout | null;
  /**
   * The download's bytes (placed and of all) as last reported while downloading: a resume
   * first resolves, plans and re-checks again, phases with no byte count of their own, and the
   * bar keeps showing what is already here meanwhile instead of dropping to 0 of 0.
   */
  known: { done: number; total: number } | null;
}

export class DownloadManager {
  private readonly entries = new Map<string, Entry>();
  private closing = false;

  constructor(private readonly opts: DownloadManagerOptions) {}

  list(): Download[] {
    return [...this.entries.values()].map((e) => structuredClone(e.download));
  }

  private entry(taskId: string): Entry {
    const e = this.entries.get(taskId);
    if (!e) {
      throw new AppFailure("download_not_found", "There is no such download.", null, taskId);
    }
    return e;
  }

  /** A name is being downloaded to now (not finished, not cancelled). */
  busyNames(): Set<string> {
    const out = new Set<string>();
    for (const e of this.entries.values()) {
      if (e.download.state === "running" || e.download.state === "paused") out.add(e.download.name);
    }
    return out;
  }

  private emit(e: Entry, force: boolean): void {
    if (e.timer) {
      clearTimeout(e.timer);
      e.timer = null;
    }
    const now = Date.now();
    if (!force && now - e.lastEmit < PROGRESS_INTERVAL_MS) {
      e.timer = setTimeout(() => this.emit(e, true), PROGRESS_INTERVAL_MS - (now - e.lastEmit));
      return;
    }
    e.lastEmit = now;
    if (!this.closing) this.opts.onDownload(structuredClone(e.download));
  }

  async install(ref: string, name?: string): Promise<Download> {
    if (this.closing) throw new AppFailure("closing", "The app is closing.");
    const resolved = resolveModelRef(ref.trim());
    const dirName = name ?? resolved.dirName;
    const dest = join(this.opts.modelsDir, dirName);
    if (this.busyNames().has(dirName)) {
      throw new AppFailure(
        "download_exists",
        `"${dirName}" is already being downloaded; resume or cancel that download.`,
        null,
      );
    }
    if (await exists(join(dest, "manifest.json"))) {
      throw new AppFailure(
        "model_exists",
        `A model named "${dirName}" is already installed. Remove it first, or install under another name.`,
        null,
        dest,
      );
    }
    const isDemo = resolved.entry?.kind === "demo";
    if (!isDemo && resolved.repo === null) {
      throw new AppFailure("bad_model_ref", `"${ref}" names no Hugging Face repository.`, null);
    }
    const e: Entry = {
      download: {
        taskId: randomUUID(),
        ref,
        name: dirName,
        state: "running",
        phase: "resolving",
        bytesDone: 0,
        bytesTotal: 0,
        rate: null,
        etaSeconds: null,
        file: null,
        note: null,
        error: null,
      },
      request: isDemo ? null : { repo: resolved.repo!, revision: resolved.revision, dest },
      task: null,
      settled: Promise.resolve(),
      stopping: null,
      lastEmit: 0,
      timer: null,
      known: null,
    };
    // A finished card of the same name (done, then removed; cancelled; failed) gives way to this
    // one: one card per model.
    for (const [taskId, old] of this.entries) {
      const s = old.download.state;
      if (old.download.name === dirName && (s === "done" || s === "cancelled" || s === "failed")) {
        this.entries.delete(taskId);
      }
    }
    this.entries.set(e.download.taskId, e);
    this.run(e);
    return structuredClone(e.download);
  }

  /** Starts (or restarts) the entry's install in the background. */
  private run(e: Entry): void {
    const d = e.download;
    d.state = "running";
    d.phase = "resolving";
    d.error = null;
    d.rate = null;
    d.etaSeconds = null;
    e.stopping = null;
    this.emit(e, true);
    if (e.request === null) {
      // The demo: made here, in seconds.
      e.settled = ensureDemoModel(join(this.opts.modelsDir, DEMO_MODEL_NAME)).then(
        () => this.done(e),
        (error: unknown) => this.failed(e, error),
      );
      return;
    }
    // On a worker thread: a hostile checkpoint that exhausts the importer ends this install, not
    // the app.
    const task = startInstallInWorker(e.request, {
      createdBy: this.opts.createdBy,
      env: this.opts.env,
      ...this.opts.install,
      onProgress: (p) => this.progress(e, p),
    });
    e.task = task;
    e.settled = task.result.then(
      () => this.done(e),
      (error: unknown) => this.stopped(e, error),
    );
  }

  private progress(e: Entry, p: InstallProgress): void {
    const d = e.download;
    if (d.state !== "running") return;
    const phaseChanged = d.phase !== p.phase;
    d.phase = p.phase;
    if (p.phase === "downloading" || p.phase === "paused") {
      e.known = { done: p.bytesDone, total: p.bytesTotal };
    }
    const before = p.phase === "resolving" || p.phase === "planning" || p.phase === "verifying";
    if (before && e.known) {
      d.bytesDone = e.known.done;
      d.bytesTotal = e.known.total;
    } else {
      d.bytesDone = p.bytesDone;
      d.bytesTotal = p.bytesTotal;
    }
    d.rate = p.rate;
    d.etaSeconds = p.etaSeconds;
    d.file = p.file;
    if (p.note !== undefined) d.note = p.note;
    this.emit(e, phaseChanged || p.note !== undefined);
  }

  private done(e: Entry): void {
    e.task = null;
    const d = e.download;
    d.state = "done";
    d.phase = "done";
    d.bytesDone = d.bytesTotal;
    d.rate = null;
    d.etaSeconds = null;
    this.emit(e, true);
    this.opts.onInstalled(d.name);
  }

  private failed(e: Entry, error: unknown): void {
    e.task = null;
    e.download.state = "failed";
    e.download.error = toAppError(error);
    this.emit(e, true);
  }

  /** The task ended early: paused or cancelled on request, or failed. */
  private async stopped(e: Entry, error: unknown): Promise<void> {
    e.task = null;
    const d = e.download;
    if (e.stopping === "pause") {
      d.state = "paused";
      d.phase = "paused";
      d.rate = null;
      d.etaSeconds = null;
      this.emit(e, true);
    } else if (e.stopping === "cancel") {
      await this.discard(e);
    } else {
      this.failed(e, error);
    }
  }

  private async discard(e: Entry): Promise<void> {
    const d = e.download;
    try {
      if (e.request) await discardPartial(e.request.dest);
    } catch (error) {
      this.opts.log?.(`could not remove the partial download of ${d.name}: ${String(error)}`);
    }
    d.state = "cancelled";
    d.rate = null;
    d.etaSeconds = null;
    this.emit(e, true);
  }

  async pause(taskId: string): Promise<Download> {
    const e = this.entry(taskId);
    if (e.download.state !== "running" || !e.task) {
      throw new AppFailure("not_running", "This download is not running.", null);
    }
    e.stopping = "pause";
    e.task.cancel(); // stops; the partial download is kept for the resume
    await e.settled;
    return structuredClone(e.download);
  }

  async resume(taskId: string): Promise<Download> {
    const e = this.entry(taskId);
    const state = e.download.state;
    if (state !== "paused" && state !== "failed") {
      throw new AppFailure("not_paused", "Only a paused or failed download can be resumed.", null);
    }
    await e.settled;
    this.run(e);
    return structuredClone(e.download);
  }

  async cancel(taskId: string): Promise<Download> {
    const e = this.entry(taskId);
    const state = e.download.state;
    if (state === "done" || state === "cancelled") {
      throw new AppFailure("not_running", `This download is already ${state}.`, null);
    }
    if (state === "running" && e.task) {
      e.stopping = "cancel";
      e.task.cancel();
      await e.settled;
    } else {
      await e.settled;
      await this.discard(e);
    }
    return structuredClone(e.download);
  }

  dismiss(taskId: string): void {
    const e = this.entry(taskId);
    const state = e.download.state;
    if (state === "running" || state === "paused") {
      throw new AppFailure(
        "download_active",
        "Cancel this download first (or let it finish).",
        null,
      );
    }
    this.entries.delete(taskId);
  }

  /** Stops every running download, keeping what was fetched. */
  async close(): Promise<void> {
    for (const e of this.entries.values()) {
      if (e.download.state === "running" && e.task) {
        e.stopping = "pause";
        e.task.cancel();
      }
    }
    await Promise.all([...this.entries.values()].map((e) => e.settled.catch(() => undefined)));
    this.closing = true;
    for (const e of this.entries.values()) if (e.timer) clearTimeout(e.timer);
  }
}
