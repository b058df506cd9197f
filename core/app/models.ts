/**
 * Installed models for the app: the listing (with each model's memory at its own settings,
 * its verify state and whether it is loaded), the catalog as the Models view shows it,
 * verification in the background, removal and "reveal in folder".
 *
 * Verify states live in memory and in `<dataDir>/verify.json`, keyed by model name and tied to
 * the manifest's modification time, so a reinstalled model starts unchecked again.
 */
import { readFile, rename, rm, stat } from "node:fs/promises";
import { totalmem } from "node:os";
import { join, resolve, sep } from "node:path";
import { CATALOG } from "../catalog/catalog.ts";
import { DEMO_MODEL_NAME, isDemoCreatedBy } from "../demo/demo.ts";
import type { Manifest } from "../format/manifest.ts";
import { modelDirNames, readManifest, verifyModelFiles } from "../format/read.ts";
import type { CatalogItem, EngineSettings, InstalledModel, VerifyState } from "./api.ts";
import { writeFileAtomic } from "./conversations.ts";
import { AppFailure } from "./errors.ts";

interface StoredVerify extends VerifyState {
  /** The manifest's mtime when checked. */
  manifestMtimeMs: number;
}

export interface ModelsManagerOptions {
  modelsDir: string;
  dataDir: string;
  /** The engine's memory plan total for a model directory at engine settings. */
  planBytes: (dir: string, engine: EngineSettings) => Promise<number>;
  /**
   * A model's own engine settings (settings are kept per model): the current ones for the
   * active model, its saved ones or its defaults for the others. Its memory figure is the plan
   * at these, the figure the Tuning view shows once it is the active model.
   */
  engineSettingsOf: (entry: ModelEntry) => Promise<EngineSettings>;
  /** Called when the listing or a verify state changed. */
  onChange: () => void;
  log?: (line: string) => void;
}

export interface ModelEntry {
  name: string;
  dir: string;
  manifest: Manifest;
  manifestMtimeMs: number;
}

const VERIFY_EMIT_MS = 250;

export class ModelsManager {
  private readonly verify = new Map<string, StoredVerify>();
  private readonly checking = new Map<string, { fraction: number; done: Promise<VerifyState> }>();
  private loadedVerify: Promise<void> | null = null;
  private readonly manifests = new Map<string, ModelEntry>();
  private closing = false;

  constructor(private readonly opts: ModelsManagerOptions) {}

  private get verifyPath(): string {
    return join(this.opts.dataDir, "verify.json");
  }

  private loadVerify(): Promise<void> {
    this.loadedVerify ??= (async () => {
      try {
        const json = JSON.parse(await readFile(this.verifyPath, "utf8")) as Record<
          string,
          StoredVerify
        >;
        for (const [name, v] of Object.entries(json)) {
          if (v && typeof v === "object" && typeof v.manifestMtimeMs === "number")
            this.verify.set(name, v);
        }
      } catch {
        // none yet, or unreadable: every model starts unchecked
      }
    })();
    return this.loadedVerify;
  }

  private async saveVerify(): Promise<void> {
    const out: Record<string, StoredVerify> = {};
    for (const [name, v] of this.verify)
      if (v.state === "ok" || v.state === "corrupt") out[name] = v;
    try {
      await writeFileAtomic(this.verifyPath, JSON.stringify(out, null, 1) + "\n");
    } catch (error) {
      this.opts.log?.(`cannot save verify states: ${(error as Error).message}`);
    }
  }

  /** The directory of a model name inside the models directory (never outside it). */
  dirOf(name: string): string {
    const root = resolve(this.opts.modelsDir);
    const dir = resolve(root, name);
    if (
      name === "" ||
      name === "." ||
      name === ".." ||
      name.includes("/") ||
      name.includes("\\") ||
      !dir.startsWith(root + sep)
    ) {
      throw new AppFailure("bad_model_name", `"${name}" is not a model name.`, null);
    }
    return dir;
  }

  /** Installed models (a readable manifest), sorted by name. */
  async entries(): Promise<ModelEntry[]> {
    const out: ModelEntry[] = [];
    for (const name of await modelDirNames(this.opts.modelsDir)) {
      const dir = join(this.opts.modelsDir, name);
      try {
        out.push(await this.read(name, dir));
      } catch {
        // not an installed model (no manifest, or an unreadable one)
      }
    }
    return out;
  }

  /** A model's manifest, parsed again only when the file changed (listings come often). */
  private async read(name: string, dir: string): Promise<ModelEntry> {
    const manifestMtimeMs = (await stat(join(dir, "manifest.json"))).mtimeMs;
    const cached = this.manifests.get(dir);
    if (cached && cached.manifestMtimeMs === manifestMtimeMs) return cached;
    const entry = { name, dir, manifest: await readManifest(dir), manifestMtimeMs };
    this.manifests.set(dir, entry);
    return entry;
  }

  async entry(name: string): Promise<ModelEntry> {
    const dir = this.dirOf(name);
    try {
      return await this.read(name, dir);
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code === "ENOENT" || code === "ENOTDIR" || code === "model_not_installed") {
        throw new AppFailure(
          "model_not_found",
          `No model named "${name}" is installed.`,
          null,
          dir,
        );
      }
      throw error;
    }
  }

  /** The verify state of a model (unchecked when its manifest changed since). */
  async verifyState(entry: ModelEntry): Promise<VerifyState> {
    await this.loadVerify();
    return this.stateOf(entry.name, entry.manifestMtimeMs);
  }

  private stateOf(name: string, mtime: number | null): VerifyState {
    const running = this.checking.get(name);
    if (running) return { state: "checking", fraction: running.fraction };
    const v = this.verify.get(name);
    if (!v || (mtime !== null && v.manifestMtimeMs !== mtime)) return { state: "unchecked" };
    return {
      state: v.state,
      ...(v.message !== undefined ? { message: v.message } : {}),
      ...(v.checkedAt !== undefined ? { checkedAt: v.checkedAt } : {}),
    };
  }

  /** The known state without touching the disk (for the engine's load check). */
  knownState(name: string): VerifyState | undefined {
    const v = this.verify.get(name);
    return v ? this.stateOf(name, null) : undefined;
  }

  async list(loadedName: string | null): Promise<InstalledModel[]> {
    const out: InstalledModel[] = [];
    for (const e of await this.entries()) {
      const a = e.manifest.architecture;
      out.push({
        name: e.name,
        dir: e.dir,
        sizeBytes: installedBytes(e.manifest),
        memoryEstimateBytes: await this.opts.planBytes(e.dir, await this.opts.engineSettingsOf(e)),
        family: a.family,
        moe: a.moe !== null,
        isDemo: isDemoCreatedBy(e.manifest.created_by),
        verify: await this.verifyState(e),
        loaded: e.name === loadedName,
      });
    }
    return out;
  }

  /**
   * The catalog; an installed entry shows the installed model's own figures (its size on disk
   * and the plan at its settings, as the Installed card, Tuning and `redwing models` show them),
   * not the catalog's estimates.
   */
  async catalog(): Promise<CatalogItem[]> {
    const installed = await this.entries();
    const total = totalmem();
    const items: CatalogItem[] = [];
    for (const c of CATALOG) {
      const match =
        c.kind === "demo"
          ? installed.find(
              (m) => m.name === DEMO_MODEL_NAME && isDemoCreatedBy(m.manifest.created_by),
            )
          : installed.find((m) => m.manifest.source.repo?.toLowerCase() === c.repo.toLowerCase());
      const engine = match ? await this.opts.engineSettingsOf(match) : null;
      const memoryBytes =
        match && engine ? await this.opts.planBytes(match.dir, engine) : c.memory.bytes;
      const memoryNote =
        match && engine
          ? `at its settings (context ${engine.context}${match.manifest.architecture.moe ? `, ${engine.memoryBudgetBytes !== null ? "memory budget" : `${engine.expertCacheSlots} expert slots`}` : ""})`
          : `${c.memory.approx ? "about: " : ""}${c.memoryNote}`;
      items.push({
        id: c.id,
        title: c.title,
        description: c.description,
        kind: c.kind,
        repo: c.kind === "hub" ? c.repo : null,
        downloadBytes: c.kind === "hub" ? c.download.bytes : null,
        installBytes: match ? installedBytes(match.manifest) : c.install.bytes,
        memoryBytes,
        memoryNote,
        fits: memoryBytes <= total,
        licence: { ...c.licence },
        installedAs: match?.name ?? null,
      });
    }
    return items;
  }

  /** Starts rehashing every file; answers at once (progress in onChange). */
  async startVerify(name: string): Promise<VerifyState> {
    const e = await this.entry(name);
    await this.loadVerify();
    if (this.checking.has(name)) return this.stateOf(name, e.manifestMtimeMs);
    const totalBytes = installedBytes(e.manifest);
    let hashed = 0;
    let lastEmit = 0;
    const slot = { fraction: 0, done: Promise.resolve<VerifyState>({ state: "checking" }) };
    this.checking.set(name, slot);
    slot.done = (async (): Promise<VerifyState> => {
      let state: VerifyState;
      try {
        const { checks } = await verifyModelFiles(e.dir, undefined, (n) => {
          hashed += n;
          slot.fraction = totalBytes > 0 ? Math.min(1, hashed / totalBytes) : 1;
          const now = Date.now();
          if (now - lastEmit >= VERIFY_EMIT_MS) {
            lastEmit = now;
            if (!this.closing) this.opts.onChange();
          }
        });
        const bad = checks.filter((c) => c.status !== "ok");
        const checkedAt = new Date().toISOString();
        state =
          bad.length === 0
            ? { state: "ok", checkedAt }
            : {
                state: "corrupt",
                checkedAt,
                message: bad
                  .slice(0, 3)
                  .map((c) => `${c.path} ${describe(c.status)}`)
                  .concat(bad.length > 3 ? [`and ${bad.length - 3} more`] : [])
                  .join("; "),
              };
      } catch (error) {
        state = {
          state: "corrupt",
          checkedAt: new Date().toISOString(),
          message: (error as Error).message,
        };
      }
      this.checking.delete(name);
      this.verify.set(name, { ...state, manifestMtimeMs: e.manifestMtimeMs });
      await this.saveVerify();
      if (!this.closing) this.opts.onChange();
      return state;
    })();
    this.opts.onChange();
    return { state: "checking", fraction: 0 };
  }

  /** Resolves when the verification of `name` under way (if any) ends. */
  async verifyDone(name: string): Promise<VerifyState | undefined> {
    return this.checking.get(name)?.done;
  }

  /** Records a model verified by other means (the installer hashed every file it wrote). */
  async markVerified(name: string): Promise<void> {
    try {
      const e = await this.entry(name);
      await this.loadVerify();
      this.verify.set(name, {
        state: "ok",
        checkedAt: new Date().toISOString(),
        manifestMtimeMs: e.manifestMtimeMs,
      });
      await this.saveVerify();
    } catch (error) {
      this.opts.log?.(`cannot record the verify state of ${name}: ${(error as Error).message}`);
    }
  }

  /** Deletes a model directory (the caller made sure it is not loaded or downloading). */
  async remove(name: string): Promise<void> {
    const e = await this.entry(name);
    if (this.checking.has(name)) await this.checking.get(name)!.done.catch(() => undefined);
    // Renamed first, so a half-deleted model never looks installed.
    const aside = join(this.opts.modelsDir, `.${name}.removing-${process.pid}-${Date.now()}`);
    await rename(e.dir, aside);
    await rm(aside, { recursive: true, force: true });
    this.verify.delete(name);
    await this.saveVerify();
  }

  /** Verifications under way finish on their own (they only read); nothing is announced. */
  close(): void {
    this.closing = true;
  }
}

/** An installed model's size: every file its manifest lists (what `redwing models` prints). */
export function installedBytes(manifest: Manifest): number {
  return manifest.files.reduce((s, f) => s + f.size, 0);
}

function describe(status: string): string {
  switch (status) {
    case "missing":
      return "is missing";
    case "size":
      return "has the wrong size";
    case "sha256":
      return "does not match its checksum";
    case "not_regular":
      return "is not a regular file";
    case "unexpected":
      return "should not be there";
    default:
      return status;
  }
}
