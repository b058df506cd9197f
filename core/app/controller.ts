/**
 * The app's main-process logic, the same for Electron and web mode: `createAppController`
 * wires settings, conversations, the one engine, chat, downloads, installed models, the live
 * sampler and the OpenAI-compatible server behind `AppBackend` (api.ts). Every call answers
 * data that matches its result schema, or rejects with an AppCallError carrying an AppError
 * (`toAppError` turns anything into one); events go to every subscriber.
 *
 * At start the demo model is made if missing and the active model (the demo when none) is
 * loaded in the background; `ready` settles when that is done.
 */
import { arch, availableParallelism, platform, totalmem } from "node:os";
import { join, resolve } from "node:path";
import { DEMO_MODEL_NAME, ensureDemoModel } from "../demo/demo.ts";
import type { EngineClientOptions } from "../engine/index.ts";
import type { IsolatedInstallOptions } from "../install/isolated.ts";
import { modelsDir as defaultModelsDir } from "../paths.ts";
import type { z } from "zod";
import {
  API,
  AppCallError,
  DEFAULT_SETTINGS,
  type AppBackend,
  type AppEvent,
  type AppInfo,
  type Method,
  type Result,
  type Settings,
} from "./api.ts";
import { ChatManager } from "./chat.ts";
import { ConversationStore } from "./conversations.ts";
import { DownloadManager } from "./downloads.ts";
import { defaultPowerMeter, type PowerMeter } from "./energy.ts";
import { EngineManager } from "./engine.ts";
import { AppFailure, toAppError } from "./errors.ts";
import { freeMemoryBytes, LiveSampler } from "./live.ts";
import { HitRateBook, memoryPlan } from "./memory.ts";
import { ModelsManager } from "./models.ts";
import { ServerManager } from "./server.ts";
import {
  APP_VERSION,
  applyPatch,
  openSettingsStore,
  readSettings,
  saveChanged,
  type SettingsStore,
} from "./settings.ts";
import { exists } from "../fs.ts";

export interface AppControllerOptions {
  shell: "electron" | "web";
  /** Settings (unless `settingsStore` is given), conversations/ and verify.json live here. */
  dataDir: string;
  /** Installed models; default: core/paths' modelsDir (shared with the CLI). */
  modelsDir?: string;
  /** Default: a conf store `<dataDir>/settings.json` built from settingsStoreOptions(). */
  settingsStore?: SettingsStore;
  /** Shows a path in the file manager (Electron's shell.showItemInFolder); absent in web mode. */
  reveal?: (path: string) => Promise<boolean | void> | boolean | void;
  /** The macOS thermal state ("nominal", "fair", "serious", "critical"), or null. */
  thermal?: () => string | null;
  /** Environment for HF_ENDPOINT / HF_TOKEN and the models directory; default process.env. */
  env?: Record<string, string | undefined>;
  /** Engine client options (binary, env, onLog); the controller handles restarts itself. */
  engine?: EngineClientOptions;
  /** Live sample interval (default 500 ms). */
  liveIntervalMs?: number;
  /** Power source for the live panel; default RAPL or nvidia-smi when readable; null: none. */
  power?: PowerMeter | null;
  /** Extra installer options (tests: small ranges, no fsync, fast retries). */
  install?: Partial<IsolatedInstallOptions>;
  /** Make the demo and load the active model at start (default true). */
  autoLoad?: boolean;
  /** Where diagnostics go (default: stderr). */
  log?: (line: string) => void;
}

export interface AppController extends AppBackend {
  /** Settles when the start-up work (demo model, first load, server) is done. */
  readonly ready: Promise<void>;
  /** Stops replies, the server, downloads (keeping partials), the sampler, then the engine. */
  close(): Promise<void>;
}

type Handlers = {
  [M in Method]: (params: z.infer<(typeof API)[M]["params"]>) => Promise<Result<M>>;
};

export async function createAppController(options: AppControllerOptions): Promise<AppController> {
  const env = options.env ?? process.env;
  const dataDir = resolve(options.dataDir);
  const modelsDir = resolve(options.modelsDir ?? defaultModelsDir(env));
  const log =
    options.log ?? ((line: string) => void process.stderr.write(`redwing app: ${line}\n`));
  const notices: string[] = [];
  const listeners = new Set<(event: AppEvent) => void>();
  let closing = false;

  const emit = (event: AppEvent): void => {
    if (closing && event.type !== "chat.done") return;
    for (const l of listeners) {
      try {
        l(event);
      } catch (error) {
        log(`an event listener failed: ${(error as Error).message}`);
      }
    }
  };

  // ---- settings ----
  let store: SettingsStore;
  if (options.settingsStore) {
    store = options.settingsStore;
  } else {
    const opened = openSettingsStore(dataDir);
    store = opened.store;
    if (opened.recoveredFrom) {
      const text = `The settings file could not be read (${opened.problem?.split("\n")[0]}); it was kept as ${opened.recoveredFrom} and the default settings are used.`;
      notices.push(text);
      log(text);
    }
  }
  const read = readSettings(store);
  let settings: Settings = read.settings;
  if (read.repaired.length > 0) {
    const text = `Some settings were invalid and were reset to their defaults: ${read.repaired.join(", ")}.`;
    notices.push(text);
    log(text);
    for (const key of read.repaired) store.set(key, structuredClone(settings[key]));
  }
  const getSettings = (): Settings => settings;
  const updateSettings = (next: Settings): void => {
    saveChanged(store, settings, next);
    settings = next;
    emit({ type: "settings", settings, reloadNeeded: engine.status().reloadNeeded });
  };

  // ---- parts ----
  const hitRates = new HitRateBook();
  const conversations = new ConversationStore(join(dataDir, "conversations"), log);
  const emitConversations = (): void => {
    void conversations.list().then(
      (list) => emit({ type: "conversations", conversations: list }),
      (error: unknown) => log(`cannot list conversations: ${(error as Error).message}`),
    );
  };
  const models = new ModelsManager({
    modelsDir,
    dataDir,
    onChange: () => emitModels(),
    log,
  });
  let lastServed: string | null = null;
  const engine = new EngineManager({
    modelsDir,
    client: options.engine,
    settings: getSettings,
    verifyState: (name) => models.knownState(name),
    log,
    onStatus: (status) => {
      emit({ type: "engine", status });
      // The loaded model changed: the model list's "loaded" flags and the server follow.
      const loaded = engine.loaded;
      const key = loaded ? `${loaded.dir}\0${loaded.settings.context}` : null;
      if (key !== lastServed && status.state !== "loading" && status.state !== "starting") {
        lastServed = key;
        emitModels();
        if (!closing && (settings.server.enabled || server.status().running)) {
          server
            .sync(settings.server.enabled, settings.server.port)
            .catch((error: unknown) => log(`server: ${toAppError(error).message}`));
        }
      }
    },
  });
  const emitModels = (): void => {
    void models.list(settings.engine, engine.loaded?.name ?? null).then(
      (list) => emit({ type: "models", models: list }),
      (error: unknown) => log(`cannot list models: ${(error as Error).message}`),
    );
  };
  const chat = new ChatManager({
    engine,
    store: conversations,
    settings: getSettings,
    emit,
    onConversations: emitConversations,
    hitRates,
  });
  const downloads = new DownloadManager({
    modelsDir,
    env,
    createdBy: `redwing ${APP_VERSION}`,
    install: options.install,
    log,
    onDownload: (download) => emit({ type: "download", download }),
    onInstalled: (name) => {
      engine.forget(join(modelsDir, name));
      void models.markVerified(name).then(emitModels);
    },
  });
  const server = new ServerManager(engine, (status) => emit({ type: "server", status }), log);
  const power = options.power === undefined ? defaultPowerMeter(env) : options.power;
  const live = new LiveSampler(
    {
      stats: () => engine.stats(),
      tracker: chat.tracker,
      generating: () => engine.queue.generating,
      budget: () =>
        engine.loaded
          ? (engine.loaded.settings.memoryBudgetBytes ?? engine.loaded.ready.memory.estimate_bytes)
          : null,
      expertCache: () => (engine.loaded?.manifest.architecture.moe ?? null) !== null,
      power,
      thermal: options.thermal,
    },
    (sample) => {
      engine.setRss(sample.rssBytes);
      emit({ type: "live", sample });
    },
    options.liveIntervalMs ?? 500,
  );

  const info = (): AppInfo => ({
    version: APP_VERSION,
    shell: options.shell,
    platform: platform(),
    arch: arch(),
    dataDir,
    modelsDir,
    hardwareThreads: availableParallelism(),
    totalMemoryBytes: totalmem(),
    features: {
      energy: power !== null,
      // Electron passes a reader everywhere; only macOS reports a state.
      thermal:
        options.thermal !== undefined && (platform() === "darwin" || options.thermal() !== null),
      reveal: options.reveal !== undefined,
    },
    ...(notices.length > 0 ? { notices: [...notices] } : {}),
  });

  const activeName = (): string => settings.activeModel ?? DEMO_MODEL_NAME;

  const handlers: Handlers = {
    "app.info": async () => info(),

    "settings.get": async () => settings,
    "settings.update": async (patch) => {
      updateSettings(applyPatch(settings, patch));
      engine.emit(); // reloadNeeded may have changed
      if (patch.engine) emitModels(); // memory estimates follow the engine settings
      return { settings, reloadNeeded: engine.status().reloadNeeded };
    },
    "settings.reset": async () => {
      // Back to the defaults, except which model is active and whether the server is on.
      updateSettings({
        ...structuredClone(DEFAULT_SETTINGS),
        activeModel: settings.activeModel,
        server: { ...DEFAULT_SETTINGS.server, enabled: settings.server.enabled },
      });
      engine.emit();
      emitModels();
      return settings;
    },
    "settings.memoryPlan": async (params) => {
      const name = params.model ?? engine.loaded?.name ?? activeName();
      const entry = await models.entry(name);
      const engineSettings = { ...settings.engine, ...params.engine };
      const loadedHere = engine.loaded?.name === name;
      return memoryPlan(
        name,
        entry.manifest,
        engineSettings,
        await freeMemoryBytes(),
        hitRates,
        loadedHere ? (live.history.at(-1)?.rssBytes ?? 0) : 0,
      );
    },

    "models.catalog": async () => models.catalog(settings.engine),
    "models.list": async () => models.list(settings.engine, engine.loaded?.name ?? null),
    "models.install": async ({ ref, name }) => downloads.install(ref, name),
    "models.downloads": async () => downloads.list(),
    "models.pause": async ({ taskId }) => downloads.pause(taskId),
    "models.resume": async ({ taskId }) => downloads.resume(taskId),
    "models.cancel": async ({ taskId }) => downloads.cancel(taskId),
    "models.dismiss": async ({ taskId }) => {
      downloads.dismiss(taskId);
      return { ok: true as const };
    },
    "models.verify": async ({ name }) => models.startVerify(name),
    "models.remove": async ({ name }) => {
      const entry = await models.entry(name);
      if (downloads.busyNames().has(name)) {
        throw new AppFailure(
          "download_active",
          `"${name}" is being downloaded; cancel the download first.`,
          null,
        );
      }
      if (engine.loaded?.name === name || engine.status().model === name) {
        await engine.unload();
      }
      await models.remove(name);
      engine.forget(entry.dir);
      if (settings.activeModel === name) updateSettings({ ...settings, activeModel: null });
      emitModels();
      return { ok: true as const };
    },
    "models.reveal": async ({ name }) => {
      const { dir } = await models.entry(name);
      if (!options.reveal) return { path: dir, shown: false };
      const shown = await options.reveal(dir);
      return { path: dir, shown: shown !== false };
    },

    "engine.status": async () => engine.status(),
    "engine.load": async ({ model }) => {
      const name = model ?? activeName();
      if (name !== DEMO_MODEL_NAME) await models.entry(name); // not installed: a clear error
      const status = await engine.load(name);
      if (
        settings.activeModel !== name &&
        !(name === DEMO_MODEL_NAME && settings.activeModel === null)
      ) {
        updateSettings({ ...settings, activeModel: name });
      }
      return status;
    },
    "engine.unload": async () => engine.unload(),
    "engine.reload": async () => engine.reload(activeName()),

    "chat.list": async () => conversations.list(),
    "chat.get": async ({ id }) => conversations.get(id),
    "chat.create": async ({ title, systemPrompt }) => {
      const c = await conversations.create(title, systemPrompt ?? settings.systemPrompt);
      emitConversations();
      return c;
    },
    "chat.rename": async ({ id, title }) => {
      const c = await conversations.get(id);
      c.title = title.trim() || c.title;
      const saved = await conversations.save(c);
      emitConversations();
      return saved;
    },
    "chat.setSystemPrompt": async ({ id, systemPrompt }) => {
      const c = await conversations.get(id);
      c.systemPrompt = systemPrompt;
      return conversations.save(c);
    },
    "chat.delete": async ({ id }) => {
      await conversations.get(id);
      await chat.stop(id);
      await conversations.delete(id);
      emitConversations();
      return { ok: true as const };
    },
    "chat.send": async ({ conversationId, content }) => chat.send(conversationId, content),
    "chat.regenerate": async ({ conversationId }) => chat.regenerate(conversationId),
    "chat.selectVersion": async ({ conversationId, messageId, index }) => {
      if (chat.replying(conversationId)) {
        throw new AppFailure("busy", "Wait for the reply being written, or stop it.", null);
      }
      return conversations.selectVersion(conversationId, messageId, index);
    },
    "chat.edit": async ({ conversationId, messageId, content }) =>
      chat.edit(conversationId, messageId, content),
    "chat.stop": async ({ conversationId }) => {
      await chat.stop(conversationId);
      return { ok: true as const };
    },

    "server.status": async () => server.status(),
    "server.set": async ({ enabled, port }) => {
      const wantedPort = port ?? settings.server.port;
      try {
        const status = await server.sync(enabled, wantedPort);
        updateSettings({ ...settings, server: { enabled, port: wantedPort } });
        return status;
      } catch (error) {
        updateSettings({ ...settings, server: { enabled: false, port: wantedPort } });
        throw error;
      }
    },

    "live.history": async () => [...live.history],
  };

  // Chat requests made meanwhile wait for this (engine.settled) instead of finding no model.
  const ready = engine.track(
    (async () => {
      if (options.autoLoad === false) return;
      try {
        await ensureDemoModel(join(modelsDir, DEMO_MODEL_NAME));
      } catch (error) {
        log(`cannot make the demo model: ${toAppError(error).message}`);
      }
      emitModels();
      let name = activeName();
      if (name !== DEMO_MODEL_NAME && !(await exists(join(modelsDir, name, "manifest.json")))) {
        const text = `The active model "${name}" is not installed any more; the demo model is loaded instead.`;
        notices.push(text);
        log(text);
        updateSettings({ ...settings, activeModel: null });
        name = DEMO_MODEL_NAME;
      }
      if (closing) return;
      try {
        await engine.load(name);
      } catch (error) {
        log(`cannot load ${name}: ${toAppError(error).message}`);
      }
    })(),
  );

  live.start();

  return {
    ready,
    async call<M extends Method>(
      method: M,
      params: z.infer<(typeof API)[M]["params"]>,
    ): Promise<Result<M>> {
      if (closing) {
        throw new AppCallError({ code: "closing", message: "The app is closing.", action: null });
      }
      let result: unknown;
      try {
        const handler = handlers[method] as (p: unknown) => Promise<unknown>;
        if (!handler) throw new AppFailure("unknown_method", `unknown call "${method}"`);
        result = await handler(params ?? {});
      } catch (error) {
        throw error instanceof AppCallError ? error : new AppCallError(toAppError(error));
      }
      const checked = API[method].result.safeParse(result);
      if (!checked.success) {
        // A bug here, not the caller's fault: say so rather than send a wrong shape.
        const issue = checked.error.issues[0];
        throw new AppCallError({
          code: "internal",
          message: `Something went wrong: the answer to ${method} is malformed.`,
          action: null,
          detail: `${issue?.path.join(".")}: ${issue?.message}`,
        });
      }
      return checked.data as Result<M>;
    },
    subscribe(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    async close() {
      if (closing) return;
      // No new calls from here; the stopped replies still announce themselves (chat.done).
      closing = true;
      live.stop();
      await chat.stopAll();
      await server.close().catch((e: unknown) => log(`closing the server: ${String(e)}`));
      await downloads.close().catch((e: unknown) => log(`stopping downloads: ${String(e)}`));
      models.close();
      await engine.close();
      await ready.catch(() => undefined);
      await conversations.flush();
      listeners.clear();
    },
  };
}
