/**
 * The state the app controller's handler groups (handlers/) share, built once per controller:
 * the settings (read, repaired, saved), the event fan-out, and the parts (engine, models,
 * downloads, conversations, chat, the OpenAI-compatible server, the live sampler) wired to each
 * other. Handlers get it as an explicit argument instead of closing over one big function.
 */
import { join, resolve } from "node:path";
import { DEMO_MODEL_NAME } from "../demo/demo.ts";
import type { RemoteTimeouts } from "../connections/client.ts";
import type { SecretBox } from "../connections/secrets.ts";
import type { EngineClientOptions } from "../engine/index.ts";
import type { IsolatedInstallOptions } from "../install/isolated.ts";
import { modelsDir as defaultModelsDir } from "../paths.ts";
import type { AppEvent, EngineSettings, Settings } from "./api.ts";
import { ChatManager } from "./chat.ts";
import { ConnectionsManager } from "./connections.ts";
import { ConversationStore } from "./conversations.ts";
import { DownloadManager } from "./downloads.ts";
import { defaultPowerMeter, type PowerMeter } from "./energy.ts";
import { EngineManager } from "./engine.ts";
import { AppFailure, toAppError } from "./errors.ts";
import { inOrderAnnouncer } from "./in-order.ts";
import { LiveSampler } from "./live.ts";
import { HitRateBook } from "./memory.ts";
import { ModelsManager } from "./models.ts";
import { remoteReplySource } from "./remote-reply.ts";
import { ServerManager } from "./server.ts";
import {
  APP_VERSION,
  installedModelDefaults,
  openSettingsStore,
  readSettings,
  saveChanged,
  type SettingsStore,
} from "./settings.ts";

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
  /**
   * Writes an export where the user picks (Electron's save dialog): the path, or null when they
   * cancel. Absent in web mode, where the renderer downloads the text.
   */
  saveFile?: (suggestedName: string, content: string) => Promise<string | null>;
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
  /**
   * Seals connections' API keys with the OS keychain (Electron's safeStorage); absent or null:
   * keys are kept in `<dataDir>/connections.json`, readable only by the user (docs/remote.md).
   */
  secretBox?: SecretBox | null;
  /** Remote endpoints' timeouts (tests: short ones). */
  remoteTimeouts?: RemoteTimeouts;
}

export interface AppContext {
  readonly options: AppControllerOptions;
  readonly dataDir: string;
  readonly modelsDir: string;
  readonly log: (line: string) => void;
  /** `closing` is set by close(): from then on only `chat.done` events go out, start-up stops. */
  readonly lifecycle: { closing: boolean };
  /** Messages for the user about what start-up had to repair (shown once, in app.info). */
  readonly notices: string[];
  /** Records a notice and logs it. */
  notice(text: string): void;
  /** Sends an event to every subscriber. */
  emit(event: AppEvent): void;
  readonly listeners: Set<(event: AppEvent) => void>;

  settings(): Settings;
  /** Saves what changed and announces the new settings. */
  updateSettings(next: Settings): void;
  /** The model to load when none is named: the active one, else the demo model. */
  activeName(): string;
  /** Announces the model list (after installs, removals, loads, engine settings changes). */
  emitModels(): void;
  /** Announces the conversation list. */
  emitConversations(): void;

  readonly engine: EngineManager;
  readonly models: ModelsManager;
  readonly downloads: DownloadManager;
  readonly conversations: ConversationStore;
  readonly chat: ChatManager;
  readonly server: ServerManager;
  readonly connections: ConnectionsManager;
  readonly live: LiveSampler;
  /** Expert-cache hit rates measured this session, for the memory plan. */
  readonly hitRates: HitRateBook;
  /** The live panel's power source, or null where none is readable. */
  readonly power: PowerMeter | null;
}

/** Reads the settings and builds the parts; nothing runs until the controller starts it. */
export function createAppContext(options: AppControllerOptions): AppContext {
  const env = options.env ?? process.env;
  const dataDir = resolve(options.dataDir);
  const modelsDir = resolve(options.modelsDir ?? defaultModelsDir(env));
  const log =
    options.log ?? ((line: string) => void process.stderr.write(`redwing app: ${line}\n`));
  const notices: string[] = [];
  const notice = (text: string): void => {
    notices.push(text);
    log(text);
  };
  const listeners = new Set<(event: AppEvent) => void>();
  const lifecycle = { closing: false };

  const emit = (event: AppEvent): void => {
    if (lifecycle.closing && event.type !== "chat.done") return;
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
      notice(
        `The settings file could not be read (${opened.problem?.split("\n")[0]}); it was kept as ${opened.recoveredFrom} and the default settings are used.`,
      );
    }
  }
  const read = readSettings(store);
  let settings: Settings = read.settings;
  if (read.repaired.length > 0) {
    notice(
      `Some settings were invalid and were reset to their defaults: ${read.repaired.join(", ")}.`,
    );
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
  const emitConversations = inOrderAnnouncer(
    () => conversations.list(),
    (list) => emit({ type: "conversations", conversations: list }),
    (error) => log(`cannot list conversations: ${(error as Error).message}`),
  );
  const models = new ModelsManager({
    modelsDir,
    dataDir,
    // The engine's plan, the figures the Tuning view shows (the engine is made below).
    planBytes: async (dir, engineSettings): Promise<number> =>
      (await engine.plan(dir, engineSettings)).total_bytes,
    engineSettingsOf: async (entry): Promise<EngineSettings> =>
      entry.name === (settings.activeModel ?? DEMO_MODEL_NAME)
        ? settings.engine
        : (settings.models[entry.name]?.engine ??
          (await installedModelDefaults(entry.name, entry.dir, entry.manifest)).engine),
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
      if (!lifecycle.closing) {
        server.engineChanged(settings.server.enabled, () =>
          engine.reload(settings.activeModel ?? DEMO_MODEL_NAME),
        );
      }
      // The loaded model changed: the model list's "loaded" flags and the server follow.
      const loaded = engine.loaded;
      const key = loaded ? `${loaded.dir}\0${loaded.settings.context}` : null;
      if (key !== lastServed && status.state !== "loading" && status.state !== "starting") {
        lastServed = key;
        emitModels();
        if (!lifecycle.closing && (settings.server.enabled || server.status().running)) {
          server
            .sync(settings.server.enabled, settings.server.port)
            .catch((error: unknown) => log(`server: ${toAppError(error).message}`));
        }
      }
    },
  });
  const emitModels = inOrderAnnouncer(
    () => models.list(engine.loaded?.name ?? null),
    (list) => emit({ type: "models", models: list }),
    (error) => log(`cannot list models: ${(error as Error).message}`),
  );
  const connections = new ConnectionsManager({
    dataDir,
    secretBox: options.secretBox ?? null,
    notice,
    onChange: (list) => emit({ type: "connections", connections: list }),
  });
  const chat = new ChatManager({
    engine,
    store: conversations,
    settings: getSettings,
    emit,
    onConversations: emitConversations,
    hitRates,
    // A model on a connection, when one is chosen in the picker.
    replySource: async () => {
      const target = settings.remote;
      if (!target) return null;
      const connection = await connections.get(target.connectionId).catch(() => null);
      if (!connection) {
        throw new AppFailure(
          "remote_missing",
          "The connection of the chosen model no longer exists. Pick another model.",
          "open_connections",
        );
      }
      return remoteReplySource(
        await connections.endpoint(target.connectionId),
        connection.name,
        target.model,
        settings.sampling,
        options.remoteTimeouts,
      );
    },
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
  const server = new ServerManager(
    engine,
    (status) => emit({ type: "server", status }),
    () => settings.sampling,
    log,
  );
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

  return {
    options,
    dataDir,
    modelsDir,
    log,
    lifecycle,
    notices,
    notice,
    emit,
    listeners,
    settings: getSettings,
    updateSettings,
    activeName: () => settings.activeModel ?? DEMO_MODEL_NAME,
    emitModels,
    emitConversations,
    engine,
    models,
    downloads,
    conversations,
    chat,
    server,
    connections,
    live,
    hitRates,
    power,
  };
}
