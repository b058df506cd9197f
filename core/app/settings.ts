/**
 * The app's settings: a JSON file (`settings.json`) kept by `conf` in web mode and by
 * electron-store (conf underneath) in Electron, both built from `settingsStoreOptions()`: a JSON
 * schema derived from the zod schema, DEFAULT_SETTINGS as defaults, and migrations from older
 * shapes keyed by app version.
 *
 * The controller keeps the settings in memory (validated with zod) and writes each changed
 * section through the store; a file that cannot be read or fails the schema is kept aside as
 * `settings.json.corrupt-<time>` and the app starts from the defaults instead of failing.
 */
import { existsSync, readFileSync, renameSync, unlinkSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import Conf, { type Schema } from "conf";
import { z } from "zod";
import pkg from "../../package.json" with { type: "json" };
import { catalogEntryFor, type CatalogSampling } from "../catalog/catalog.ts";
import { isDemoCreatedBy } from "../demo/demo.ts";
import type { Manifest } from "../format/manifest.ts";
import {
  DEFAULT_SETTINGS,
  effectiveGpuMisses,
  effectiveVramBudget,
  type EngineSettings,
  type SamplingSettings,
  SamplingSettingsSchema,
  type Settings,
  type SettingsPatch,
  SettingsSchema,
} from "./api.ts";

/** The app version: conf runs the migrations up to it. */
export const APP_VERSION: string = pkg.version;

export const SETTINGS_CONFIG_NAME = "settings";

/** What the controller needs of a store: conf and electron-store both fit. */
export interface SettingsStore {
  get(key: keyof Settings): unknown;
  set(key: keyof Settings, value: unknown): void;
}

/** The store the app uses through `settingsStoreOptions()` (a subset of conf's own type). */
interface MigrationStore {
  get(key: string): unknown;
  set(key: string, value: unknown): void;
  has(key: string): boolean;
  delete(key: string): void;
}

/**
 * The settings before versioned migrations (call it v0): flat sampling keys, `contextLength`
 * for the KV size and `model` for the active model. Moved into their sections by the 0.1.0
 * migration.
 */
const V0_MOVES: readonly [from: string, to: string][] = [
  ["temperature", "sampling.temperature"],
  ["topK", "sampling.topK"],
  ["topP", "sampling.topP"],
  ["repetitionPenalty", "sampling.repetitionPenalty"],
  ["seed", "sampling.seed"],
  ["maxNewTokens", "sampling.maxNewTokens"],
  ["contextLength", "engine.context"],
  ["model", "activeModel"],
];

function migrateFromV0(store: MigrationStore): void {
  for (const [from, to] of V0_MOVES) {
    if (!store.has(from)) continue;
    const value = store.get(from);
    store.delete(from);
    // The section was filled from the defaults before migrations run (conf merges shallowly):
    // the old flat value is the user's, so it replaces the default.
    store.set(to, value);
  }
}

/** Puts DEFAULT_SETTINGS' values into the JSON schema, so ajv fills missing nested fields. */
function withDefaults(schema: Record<string, unknown>, defaults: unknown): Record<string, unknown> {
  const out: Record<string, unknown> = { ...schema, default: defaults };
  const props = schema.properties as Record<string, Record<string, unknown>> | undefined;
  if (props && defaults && typeof defaults === "object") {
    const d = defaults as Record<string, unknown>;
    out.properties = Object.fromEntries(
      Object.entries(props).map(([k, v]) => [k, withDefaults(v, d[k])]),
    );
    // Every field has a default: a file written by an older version may lack some.
    delete out.required;
  }
  return out;
}

/** The options conf and electron-store are built with (plus `cwd` / `configName` or `name`). */
export function settingsStoreOptions(): {
  schema: Schema<Settings>;
  defaults: Settings;
  migrations: Record<string, (store: Conf<Settings>) => void>;
  projectVersion: string;
  clearInvalidConfig: false;
} {
  const json = z.toJSONSchema(SettingsSchema, { io: "input" }) as Record<string, unknown>;
  const root = withDefaults(json, DEFAULT_SETTINGS);
  return {
    schema: root.properties as Schema<Settings>,
    defaults: structuredClone(DEFAULT_SETTINGS),
    migrations: { "0.1.0": (store) => migrateFromV0(store as unknown as MigrationStore) },
    projectVersion: APP_VERSION,
    // A bad file is moved aside by openSettingsStore (kept for the user), never silently wiped.
    clearInvalidConfig: false,
  };
}

export type StoreFactory = (
  options: ReturnType<typeof settingsStoreOptions> & { cwd: string; configName: string },
) => SettingsStore;

const confFactory: StoreFactory = (options) =>
  new Conf<Settings>(options as unknown as ConstructorParameters<typeof Conf<Settings>>[0]);

/**
 * Opens `<dir>/settings.json` (conf by default). When the file is unreadable, invalid JSON or
 * fails the schema, it is renamed to `settings.json.corrupt-<time>` and a fresh store starts
 * from the defaults; `recoveredFrom` names the copy.
 */
export function openSettingsStore(
  dir: string,
  create: StoreFactory = confFactory,
): { store: SettingsStore; path: string; recoveredFrom: string | null; problem: string | null } {
  const path = join(dir, `${SETTINGS_CONFIG_NAME}.json`);
  const options = { ...settingsStoreOptions(), cwd: dir, configName: SETTINGS_CONFIG_NAME };
  // conf rewrites the file (defaults merged in) before it validates: keep the bytes as found.
  let original: Buffer | null = null;
  try {
    original = readFileSync(path);
  } catch {
    // no file yet (or unreadable: conf reports that below)
  }
  try {
    return { store: create(options), path, recoveredFrom: null, problem: null };
  } catch (error) {
    if (!existsSync(path)) throw error;
    const aside = `${path}.corrupt-${new Date().toISOString().replace(/[:.]/g, "-")}`;
    if (original) {
      writeFileSync(aside, original);
      unlinkSync(path);
    } else {
      renameSync(path, aside);
    }
    return {
      store: create(options),
      path,
      recoveredFrom: aside,
      problem: (error as Error).message,
    };
  }
}

const SECTIONS = Object.keys(SettingsSchema.shape) as (keyof Settings)[];

/**
 * The settings in a store, checked with zod section by section: a section that fails (edited
 * by hand, written by a newer version) is replaced by its default and named in `repaired`.
 */
export function readSettings(store: SettingsStore): {
  settings: Settings;
  repaired: (keyof Settings)[];
} {
  const repaired: (keyof Settings)[] = [];
  const out: Record<string, unknown> = {};
  for (const key of SECTIONS) {
    let value: unknown;
    try {
      value = store.get(key);
    } catch {
      value = undefined;
    }
    const parsed = SettingsSchema.shape[key].safeParse(value);
    if (parsed.success) out[key] = parsed.data;
    else {
      out[key] = structuredClone(DEFAULT_SETTINGS[key]);
      repaired.push(key);
    }
  }
  return { settings: out as Settings, repaired };
}

/** A patch applied over `current`, nested sections merged; the result is checked. */
export function applyPatch(current: Settings, patch: SettingsPatch): Settings {
  const next: Settings = {
    sampling: { ...current.sampling, ...patch.sampling },
    engine: { ...current.engine, ...patch.engine },
    systemPrompt: patch.systemPrompt ?? current.systemPrompt,
    activeModel: patch.activeModel === undefined ? current.activeModel : patch.activeModel,
    server: { ...current.server, ...patch.server },
    models: current.models,
    remote: patch.remote === undefined ? current.remote : patch.remote,
  };
  return SettingsSchema.parse(next);
}

/** Writes the sections that differ from `before`. */
export function saveChanged(store: SettingsStore, before: Settings, after: Settings): void {
  for (const key of SECTIONS) {
    if (JSON.stringify(before[key]) !== JSON.stringify(after[key])) {
      store.set(key, structuredClone(after[key]));
    }
  }
}

/** True when a reload would load the engine differently from `loaded`. */
export function engineSettingsDiffer(saved: EngineSettings, loaded: EngineSettings): boolean {
  const budgetChanged = saved.memoryBudgetBytes !== loaded.memoryBudgetBytes;
  // The GPU memory budget matters only on a GPU backend (the CPU ignores it; a backend change is
  // a difference of its own).
  const vramBudgetChanged = effectiveVramBudget(saved) !== effectiveVramBudget(loaded);
  // Where the GPU's misses run matters only where a load sends it (a GPU memory budget on a GPU);
  // the number of copies only with "cpu" and "split".
  const gpuMissesChanged =
    JSON.stringify(effectiveGpuMisses(saved)) !== JSON.stringify(effectiveGpuMisses(loaded));
  // Slots do not matter while a budget picks them.
  const slotsMatter = saved.memoryBudgetBytes === null && effectiveVramBudget(saved) === undefined;
  return (
    saved.context !== loaded.context ||
    budgetChanged ||
    vramBudgetChanged ||
    gpuMissesChanged ||
    (slotsMatter && saved.expertCacheSlots !== loaded.expertCacheSlots) ||
    saved.threads !== loaded.threads ||
    saved.backend !== loaded.backend ||
    saved.kvDtype !== loaded.kvDtype ||
    saved.activations !== loaded.activations
  );
}

/** A model's own settings: what its `models` entry holds. */
export interface ModelSettings {
  engine: EngineSettings;
  sampling: SamplingSettings;
}

/** generation_config.json keys and the sampling fields they give. */
const GENERATION_KEYS = [
  ["temperature", "temperature"],
  ["top_k", "topK"],
  ["top_p", "topP"],
  ["repetition_penalty", "repetitionPenalty"],
] as const;

/**
 * A model's settings before the user changed any: the defaults (DEFAULT_SETTINGS, from
 * core/defaults.ts) with the context capped at the model's maximum, and each sampling value
 * taken from the first that has it in range: the model's catalog entry (core/catalog, what its
 * makers recommend), its generation_config.json, core/defaults.ts.
 */
export async function modelDefaults(
  dir: string,
  maxContext: number,
  catalog: CatalogSampling | null = null,
): Promise<ModelSettings> {
  const engine = structuredClone(DEFAULT_SETTINGS.engine);
  engine.context = Math.min(engine.context, maxContext);
  const sampling = structuredClone(DEFAULT_SETTINGS.sampling);
  let config: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(await readFile(join(dir, "generation_config.json"), "utf8"));
    if (parsed && typeof parsed === "object") config = parsed as Record<string, unknown>;
  } catch {
    // No generation_config.json (or an unreadable one): the defaults stand.
  }
  for (const [key, field] of GENERATION_KEYS) {
    const value = [catalog?.[field], config[key]].find(
      (v) => SamplingSettingsSchema.shape[field].safeParse(v).success,
    );
    if (value !== undefined) (sampling as Record<string, unknown>)[field] = value;
  }
  return { engine, sampling };
}

/** modelDefaults for an installed model: its maximum context and its catalog entry's sampling. */
export function installedModelDefaults(
  name: string,
  dir: string,
  manifest: Manifest,
): Promise<ModelSettings> {
  const entry = catalogEntryFor(name, manifest.source, isDemoCreatedBy(manifest.created_by));
  return modelDefaults(dir, manifest.architecture.max_position_embeddings, entry?.sampling ?? null);
}

/**
 * The settings with `name` as the active model: the current model's engine and sampling saved
 * under its name, and `name`'s own (else `defaults`) made the current ones.
 */
export function switchModel(
  current: Settings,
  currentName: string,
  name: string,
  defaults: ModelSettings,
): Settings {
  const models = {
    ...current.models,
    [currentName]: { engine: current.engine, sampling: current.sampling },
  };
  const own = models[name] ?? defaults;
  return SettingsSchema.parse({
    ...current,
    models,
    engine: own.engine,
    sampling: own.sampling,
  });
}
