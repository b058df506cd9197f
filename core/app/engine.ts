/**
 * The app's one engine: a single EngineClient (the decode service as a child process), the model
 * loaded in it with its text side (tokenizer, chat template), and the status the UI shows.
 *
 * - Loads take the engine queue exclusively, so they never overlap a chat reply or a server
 *   request; the saved engine settings become the load parameters.
 * - The client does not restart the service by itself (restart: false): when the service dies,
 *   the status turns "crashed" with an AppError whose action is restart_engine, requests in
 *   flight fail with EngineCrashError, and `reload()` starts a fresh service and loads the model
 *   again.
 */
import { stat } from "node:fs/promises";
import { join } from "node:path";
import { formatBytes } from "../chat/stats.ts";
import { loadChatTemplate } from "../chat/template.ts";
import { loadTokenizer, type ChatTokenizer } from "../chat/tokenizer.ts";
import { SERVER_DEFAULTS } from "../defaults.ts";
import { DEMO_MODEL_NAME, ensureDemoModel, isDemoCreatedBy } from "../demo/demo.ts";
import {
  EngineClient,
  type EngineClientOptions,
  type EngineCrashError,
  type LoadParams,
  type PlanEvent,
  type ReadyEvent,
  type StatsEvent,
} from "../engine/index.ts";
import type { Manifest } from "../format/manifest.ts";
import { readModelDir } from "../format/read.ts";
import { toProtocolLoad } from "../generation/settings.ts";
import {
  effectiveGpuMisses,
  effectiveVramBudget,
  type AppError,
  type EngineSettings,
  type EngineStatus,
  type Settings,
  type VerifyState,
} from "./api.ts";
import { AppFailure, toAppError } from "./errors.ts";
import { EngineQueue } from "../server/queue.ts";
import { engineSettingsDiffer } from "./settings.ts";

/** A loaded model and what the chat needs to talk to it. */
export interface LoadedModel {
  name: string;
  dir: string;
  manifest: Manifest;
  isDemo: boolean;
  tokenizer: ChatTokenizer;
  /** The chat template (Jinja source). */
  template: string;
  stopIds: number[];
  settings: EngineSettings;
  ready: ReadyEvent;
  /** The engine's plan for the settings it was loaded with (Live shows its parts). */
  plan: PlanEvent;
}

interface TextSide {
  tokenizer: ChatTokenizer;
  template: string;
}

export interface EngineManagerOptions {
  modelsDir: string;
  client?: EngineClientOptions;
  settings: () => Settings;
  /** Called on every status change. */
  onStatus: (status: EngineStatus) => void;
  /** The verify state of an installed model (a known-corrupt model is not loaded). */
  verifyState?: (name: string) => VerifyState | undefined;
  log?: (line: string) => void;
}

/** The load parameters for saved engine settings. */
export function loadParams(dir: string, s: EngineSettings): LoadParams {
  const budget = s.memoryBudgetBytes === null ? undefined : Math.floor(s.memoryBudgetBytes);
  const vramBudget = effectiveVramBudget(s);
  // With a budget the engine picks the slot count that fits: the saved count is not sent.
  const budgetPicksSlots = budget !== undefined || vramBudget !== undefined;
  const gpu = effectiveGpuMisses(s);
  return toProtocolLoad(dir, {
    ...s,
    expertCacheSlots: budgetPicksSlots ? undefined : s.expertCacheSlots,
    memoryBudget: budget,
    vramBudget,
    // Only where the GPU can have fewer expert slots than the host (the RAM tier): never on the
    // CPU, nor on a GPU without a GPU memory budget.
    gpuMisses: gpu?.gpuMisses,
    gpuExpertCopies: gpu?.gpuExpertCopies,
  });
}

/** The budget is rounded up to whole MiB: the figure the Tuning field shows. */
const MIB = 1024 ** 2;

/**
 * A budget too small for the model: the plan at the smallest expert cache, part by part, in one
 * unit family (formatBytes), and the budget that holds it as the fix.
 */
export function budgetTooSmall(
  name: string,
  budgetBytes: number,
  plan: PlanEvent,
  kept = "",
): AppFailure {
  const need = Math.ceil(plan.total_bytes / MIB) * MIB;
  const parts = [
    `weights ${formatBytes(plan.core_bytes)}`,
    `KV cache ${formatBytes(plan.kv_bytes)}`,
    ...(plan.expert_bytes > 0 ? [`expert cache ${formatBytes(plan.expert_bytes)}`] : []),
    `working memory ${formatBytes(plan.work_bytes)}`,
  ];
  if (plan.over_budget?.startsWith("GPU memory budget")) {
    const deviceNeed = Math.ceil(plan.device_bytes / MIB) * MIB;
    return new AppFailure(
      "budget_too_small",
      `The GPU memory budget of ${formatBytes(plan.vram_budget ?? 0)} is too small for "${name}": it needs at least ${formatBytes(deviceNeed)} of GPU memory.${kept}`,
      "apply_fix",
      plan.over_budget,
      {
        label: `Load with ${formatBytes(deviceNeed)} of GPU memory`,
        model: name,
        engine: { vramBudgetBytes: deviceNeed },
      },
    );
  }
  return new AppFailure(
    "budget_too_small",
    `The memory budget of ${formatBytes(budgetBytes)} is too small for "${name}": it needs at least ${formatBytes(need)} (${parts.join(", ")}).${kept}`,
    "apply_fix",
    plan.over_budget ?? undefined,
    {
      label: `Load with a ${formatBytes(need)} budget`,
      model: name,
      engine: { memoryBudgetBytes: need },
    },
  );
}

export class EngineManager {
  readonly queue = new EngineQueue(SERVER_DEFAULTS.queueLimit);
  private client: EngineClient | null = null;
  private clientStarting: Promise<EngineClient> | null = null;
  /** Shown as "crashed" until a reload starts. */
  private crashed = false;
  /** The client's service died: the next load starts a fresh one. */
  private clientDead = false;
  private state: "stopped" | "starting" | "loading" | "ready" = "stopped";
  private modelName: string | null = null;
  private loadFraction: number | null = null;
  private error: AppError | null = null;
  private rssBytes: number | null = null;
  private closing = false;
  /** The model to load again after a crash. */
  private lastModel: string | null = null;
  private textSides = new Map<string, Promise<TextSide>>();
  /** Loads under way (the chat waits for them before it decides there is no model). */
  private pendingLoads = new Set<Promise<unknown>>();
  loaded: LoadedModel | null = null;

  constructor(private readonly opts: EngineManagerOptions) {
    this.queue.onChange = () => this.emit();
  }

  private log(line: string): void {
    this.opts.log?.(line);
  }

  status(): EngineStatus {
    const loaded = this.loaded;
    let state: EngineStatus["state"] = this.crashed ? "crashed" : this.state;
    if (state === "ready" && this.queue.generating) state = "generating";
    return {
      state,
      model: this.modelName,
      pid: this.clientDead ? null : (this.client?.pid ?? null),
      loadFraction: this.state === "loading" ? (this.loadFraction ?? 0) : null,
      loadedWith: loaded?.settings ?? null,
      expertCacheSlots: loaded ? loaded.ready.expert_cache_slots : null,
      gpuMisses: loaded ? (loaded.ready.gpu_misses ?? null) : null,
      reloadNeeded: loaded
        ? engineSettingsDiffer(this.opts.settings().engine, loaded.settings)
        : false,
      memory: loaded
        ? {
            modelBytes: loaded.ready.memory.model_bytes,
            weightsBytes: loaded.plan.core_bytes,
            kvBytes: loaded.ready.memory.kv_bytes,
            expertCacheBytes: loaded.plan.expert_bytes,
            workBytes: loaded.plan.work_bytes,
            estimateBytes: loaded.ready.memory.estimate_bytes,
            rssBytes: this.rssBytes ?? loaded.ready.memory.rss_bytes,
            deviceBytes: loaded.plan.device_bytes,
          }
        : null,
      error: this.error,
    };
  }

  emit(): void {
    if (!this.closing) this.opts.onStatus(this.status());
  }

  get isCrashed(): boolean {
    return this.crashed;
  }

  /**
   * The engine's memory plan for the model in `dir` at `settings`, without loading it: asked of
   * the running service, or of a short-lived one when none is running (the status stays as it
   * is).
   */
  async plan(dir: string, settings: EngineSettings): Promise<PlanEvent> {
    const params = loadParams(dir, settings);
    const running = this.client;
    if (running && !this.clientDead && !this.clientStarting) return running.plan(params);
    const client = await EngineClient.start({ ...this.opts.client, restart: false });
    try {
      return await client.plan(params);
    } finally {
      await client.close();
    }
  }

  /** The client for the server (may be a crashed one: its requests then fail with the crash). */
  currentClient(): EngineClient {
    if (!this.client)
      throw new AppFailure("engine_down", "The engine is not running.", "restart_engine");
    return this.client;
  }

  /** The running client and loaded model, or an AppError saying what to do. */
  requireLoaded(): { client: EngineClient; model: LoadedModel } {
    if (this.crashed) {
      throw new AppFailure(
        this.error?.code ?? "engine_crashed",
        this.error?.message ?? "The engine stopped unexpectedly. Restart it to go on.",
        "restart_engine",
        this.error?.detail,
      );
    }
    if (!this.client || !this.loaded) {
      throw new AppFailure("no_model", "No model is loaded. Load a model to chat.", "load_model");
    }
    return { client: this.client, model: this.loaded };
  }

  /** A load (or the start-up load) is under way: chat requests made now wait for it. */
  get loadPending(): boolean {
    return this.pendingLoads.size > 0;
  }

  /** Waits until no load is under way. */
  async settled(): Promise<void> {
    while (this.pendingLoads.size > 0) {
      await Promise.allSettled([...this.pendingLoads]);
    }
  }

  /** Latest engine memory from a stats reading (the live sampler). */
  setRss(rss: number | null): void {
    this.rssBytes = rss;
  }

  /** Service statistics, or null while no healthy service runs. */
  async stats(): Promise<StatsEvent | null> {
    if (!this.client || this.clientDead || this.clientStarting) return null;
    try {
      return await this.client.stats();
    } catch {
      return null;
    }
  }

  /** Counts `p` as a load under way (start-up work before the first load, too). */
  track<T>(p: Promise<T>): Promise<T> {
    this.pendingLoads.add(p);
    void p.then(
      () => this.pendingLoads.delete(p),
      () => this.pendingLoads.delete(p),
    );
    return p;
  }

  private async ensureClient(): Promise<EngineClient> {
    if (this.client && !this.clientDead) return this.client;
    if (this.clientStarting) return this.clientStarting;
    const old = this.client;
    this.client = null;
    this.state = "starting";
    this.emit();
    // onCrash may fire before start() returns (a service that dies during hello): it then
    // finds no client here and start() itself rejects.
    const ref: { client: EngineClient | null } = { client: null };
    this.clientStarting = (async () => {
      await old?.close().catch(() => undefined);
      const client = await EngineClient.start({
        ...this.opts.client,
        restart: false,
        onCrash: (error) => {
          if (ref.client) this.onCrash(ref.client, error);
        },
      });
      ref.client = client;
      return client;
    })();
    try {
      const client = await this.clientStarting;
      this.client = client;
      this.clientDead = false;
      return client;
    } finally {
      this.clientStarting = null;
    }
  }

  private onCrash(client: EngineClient, error: EngineCrashError): void {
    if (this.closing || client !== this.client) return;
    this.log(`engine crashed: ${error.message.split("\n")[0]}`);
    this.crashed = true;
    this.clientDead = true;
    this.lastModel = this.loaded?.name ?? this.modelName ?? this.lastModel;
    this.loaded = null;
    this.rssBytes = null;
    this.loadFraction = null;
    this.error = toAppError(error);
    this.emit();
  }

  /** The text side of a model directory, read once per manifest version. */
  private async textSide(dir: string, manifest: Manifest): Promise<TextSide> {
    const key = `${dir}\0${(await stat(join(dir, "manifest.json"))).mtimeMs}`;
    let side = this.textSides.get(key);
    if (!side) {
      side = (async () => {
        const tokenizer = await loadTokenizer(dir);
        const template = await loadChatTemplate(
          dir,
          tokenizer.configTemplate,
          manifest.architecture.family,
        );
        return { tokenizer, template };
      })();
      this.textSides.set(key, side);
      side.catch(() => this.textSides.delete(key));
    }
    return side;
  }

  /** Forgets what was read of a model directory (removed or reinstalled). */
  forget(dir: string): void {
    for (const key of this.textSides.keys())
      if (key.startsWith(`${dir}\0`)) this.textSides.delete(key);
  }

  /** The directory of an installed model name; the demo is made when missing. */
  async modelDir(name: string): Promise<string> {
    const dir = join(this.opts.modelsDir, name);
    if (name === DEMO_MODEL_NAME) await ensureDemoModel(dir);
    return dir;
  }

  /** Loads `name` (null: the demo) with the saved engine settings. */
  load(name: string | null): Promise<EngineStatus> {
    return this.track(this.doLoad(name ?? DEMO_MODEL_NAME));
  }

  private async doLoad(name: string): Promise<EngineStatus> {
    const release = await this.queue.acquire(undefined, { kind: "exclusive", unbounded: true });
    try {
      // Refusals first: they leave the loaded model (and the status) as they are.
      if (this.closing) throw new AppFailure("closing", "The app is closing.");
      const known = this.opts.verifyState?.(name);
      if (known?.state === "corrupt") {
        throw new AppFailure(
          "model_corrupt",
          `The model "${name}" has damaged files (${known.message ?? "see Verify"}). Reinstall it.`,
          "reinstall_model",
        );
      }
      const dir = await this.modelDir(name);
      // Structure, sizes and names of every file: a damaged directory is refused before the
      // engine maps it (UserErrors that name the file).
      const { manifest } = await readModelDir(dir);
      const settings = structuredClone(this.opts.settings().engine);
      const plan = await this.refuseUnfit(name, dir, manifest, settings);
      return await this.loadChecked(name, dir, manifest, settings, plan);
    } finally {
      release();
    }
  }

  /**
   * Refuses a load that cannot work, before anything is unloaded: a context beyond the model's
   * maximum, or a memory budget smaller than the engine's plan needs. Each refusal carries the
   * fix (the settings that work) for the error's button. Answers the plan when it asked for one
   * (a budget is set). The caller holds the queue.
   */
  private async refuseUnfit(
    name: string,
    dir: string,
    manifest: Manifest,
    settings: EngineSettings,
  ): Promise<PlanEvent | null> {
    const kept = this.loaded ? ` "${this.loaded.name}" stays loaded.` : "";
    const maxContext = manifest.architecture.max_position_embeddings;
    if (settings.context > maxContext) {
      throw new AppFailure(
        "context_too_long",
        `"${name}" supports a context of at most ${maxContext} tokens, but the context length is set to ${settings.context}.${kept}`,
        "apply_fix",
        undefined,
        { label: `Load with ${maxContext}`, model: name, engine: { context: maxContext } },
      );
    }
    if (settings.memoryBudgetBytes === null && effectiveVramBudget(settings) === undefined) {
      return null;
    }
    // The plan is asked of the running service (one is started when none runs: the load needs
    // it anyway); a refusal puts the status back as it was.
    const before = { state: this.state };
    let plan: PlanEvent;
    try {
      const client = await this.ensureClient();
      plan = await client.plan(loadParams(dir, settings));
    } finally {
      if (!this.crashed) this.state = before.state;
      this.emit();
    }
    if (plan.over_budget !== null)
      throw budgetTooSmall(name, settings.memoryBudgetBytes ?? 0, plan, kept);
    return plan;
  }

  /**
   * Loads a checked model directory (the caller holds the queue). `knownPlan`: the engine's plan
   * for these settings when the checks already asked for it.
   */
  private async loadChecked(
    name: string,
    dir: string,
    manifest: Manifest,
    settings: EngineSettings,
    knownPlan: PlanEvent | null,
  ): Promise<EngineStatus> {
    const previous = this.loaded;
    try {
      this.crashed = false;
      this.modelName = name;
      this.state = "loading";
      this.loadFraction = 0;
      this.error = null;
      this.emit();
      const client = await this.ensureClient();
      this.state = "loading";
      this.emit();
      if (this.loaded) {
        this.loaded = null;
        await client.unload();
      }
      let lastEmit = 0;
      // The ready event names only the plan's total; the parts (Live, Tuning) come from the plan
      // the checks made, else from one asked for beside the load (the service answers it at once),
      // so "ready" waits for no request after the load.
      const planning = knownPlan
        ? Promise.resolve(knownPlan)
        : client.plan(loadParams(dir, settings));
      planning.catch(() => undefined); // awaited below, after the load
      const [ready, side] = await Promise.all([
        client.load(loadParams(dir, settings), (p) => {
          this.loadFraction = p.fraction;
          const now = Date.now();
          if (now - lastEmit > 100) {
            lastEmit = now;
            this.emit();
          }
        }),
        this.textSide(dir, manifest),
      ]);
      const plan = await planning;
      this.loaded = {
        name,
        dir,
        manifest,
        isDemo: isDemoCreatedBy(manifest.created_by),
        tokenizer: side.tokenizer,
        template: side.template,
        stopIds: manifest.architecture.eos_token_ids,
        settings,
        ready,
        plan,
      };
      this.lastModel = name;
      this.rssBytes = ready.memory.rss_bytes;
      this.state = "ready";
      this.loadFraction = null;
      this.emit();
      return this.status();
    } catch (error) {
      // The user is never left with nothing: the model loaded before comes back when it can.
      if (!this.crashed && previous && (await this.restore(previous))) {
        const failed = toAppError(error);
        throw new AppFailure(
          failed.code,
          `${failed.message} "${previous.name}" is loaded again.`,
          failed.action,
          failed.detail,
          failed.fix,
        );
      }
      if (!this.crashed) {
        this.state = "stopped";
        this.loaded = null;
        this.modelName = null;
        this.loadFraction = null;
        this.error = toAppError(error);
        this.emit();
      }
      throw error;
    }
  }

  /** Loads `previous` again after a failed load (true when it is back). */
  private async restore(previous: LoadedModel): Promise<boolean> {
    try {
      const client = await this.ensureClient();
      this.modelName = previous.name;
      this.state = "loading";
      this.emit();
      const ready = await client.load(loadParams(previous.dir, previous.settings));
      this.loaded = { ...previous, ready }; // the same settings: the same plan
      this.lastModel = previous.name;
      this.rssBytes = ready.memory.rss_bytes;
      this.state = "ready";
      this.loadFraction = null;
      this.error = null;
      this.emit();
      return true;
    } catch (error) {
      this.log(`could not load "${previous.name}" again: ${(error as Error).message}`);
      return false;
    }
  }

  async unload(): Promise<EngineStatus> {
    const release = await this.queue.acquire(undefined, { kind: "exclusive", unbounded: true });
    try {
      if (this.loaded && this.client && !this.clientDead) {
        this.loaded = null;
        await this.client.unload();
      }
      this.loaded = null;
      if (!this.crashed) {
        this.modelName = null;
        this.state = "stopped";
        this.error = null;
      }
      this.emit();
      return this.status();
    } finally {
      release();
    }
  }

  /**
   * Loads the loaded (else last, else `fallback`) model again with the saved settings; after a
   * crash this starts a fresh service first.
   */
  reload(fallback: string | null): Promise<EngineStatus> {
    const name = this.loaded?.name ?? this.lastModel ?? fallback;
    return this.load(name);
  }

  async close(): Promise<void> {
    this.closing = true;
    await this.clientStarting?.catch(() => undefined);
    const client = this.client;
    this.client = null;
    await client?.close().catch(() => undefined);
  }
}
