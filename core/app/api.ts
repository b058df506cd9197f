/**
 * The app's API: every call the renderer makes and every event it receives, as zod schemas.
 * One definition serves both transports (Electron IPC through the preload, and web mode's HTTP +
 * server-sent events) and the renderer, which imports this file too: so this module must stay
 * free of Node imports (eslint.config.js holds it to that: RENDERER_SHARED_CORE).
 *
 * A call is `{ method, params }` and answers `result` or an `AppError`. Events are pushed on one
 * channel, in order, to every connected window.
 */
import { z } from "zod";
import {
  CHAT_DEFAULTS,
  ENGINE_DEFAULTS,
  GPU_MISSES,
  SAMPLING_DEFAULTS,
  SERVER_DEFAULTS,
  type GpuMisses,
} from "../defaults.ts";

// ---- shared shapes ----------------------------------------------------------------------------

/**
 * An error as the user sees it: `message` says what happened in plain words, `action` the next
 * step the UI offers as a button.
 */
export const AppErrorSchema = z.object({
  /** Stable machine-readable code (`engine_crashed`, `model_corrupt`, `disk_full`, ...). */
  code: z.string(),
  message: z.string(),
  action: z.preprocess(
    // Replies stored before 0.2 carry "reduce_context" under text that says to raise it.
    (value) => (value === "reduce_context" ? "raise_context" : value),
    z
      .enum([
        "restart_engine",
        "verify_model",
        "reinstall_model",
        "free_space",
        "retry",
        "load_model",
        /** Opens the context length in Tuning. */
        "raise_context",
        /** Starts a new conversation. */
        "new_chat",
        /** Opens Connections (a remote endpoint's key or URL needs changing). */
        "open_connections",
        /** Saves `fix.engine` and loads `fix.model` (the button says `fix.label`). */
        "apply_fix",
      ])
      .nullable(),
  ),
  /** Technical detail (file, offset, exit status) shown on request. */
  detail: z.string().optional(),
  /** With action "apply_fix": the settings that make the failed load work, and its button. */
  fix: z
    .object({
      /** The button, e.g. "Load with 4096". */
      label: z.string(),
      model: z.string(),
      engine: z.object({
        context: z.number().int().positive().optional(),
        memoryBudgetBytes: z.number().nonnegative().nullable().optional(),
        vramBudgetBytes: z.number().nonnegative().nullable().optional(),
      }),
    })
    .optional(),
});
export type AppError = z.infer<typeof AppErrorSchema>;

const bytes = z.number().nonnegative();
const modelName = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[^/\\]+$/, "a model name, not a path")
  // A leading dot would name a hidden directory, such as another install's staging area
  // (`.<name>.install`); control characters (NUL above all) are no file name at all.
  .regex(/^[^.]/, "a model name cannot start with a dot")
  // eslint-disable-next-line no-control-regex
  .regex(/^[^\u0000-\u001f\u007f]*$/, "a model name cannot hold control characters");
const id = z.string().min(1).max(100);

// ---- settings ---------------------------------------------------------------------------------

/** A model on a saved connection (an OpenAI-compatible endpoint, docs/remote.md). */
export const RemoteTargetSchema = z.object({
  connectionId: id,
  /** The model's id at that endpoint. */
  model: z.string().min(1).max(300),
});
export type RemoteTarget = z.infer<typeof RemoteTargetSchema>;

/** Text that ends a reply (not shown). */
const stopStrings = z.array(z.string().min(1).max(200)).max(8);

export const SamplingSettingsSchema = z.object({
  /** 0: greedy. */
  temperature: z.number().min(0).max(2),
  /** 0: off. */
  topK: z.number().int().min(0).max(1000),
  topP: z.number().min(0).max(1),
  repetitionPenalty: z.number().min(1).max(2),
  /** null: a random seed per reply. */
  seed: z
    .number()
    .int()
    .min(0)
    .max(2 ** 31 - 1)
    .nullable(),
  maxNewTokens: z.number().int().min(1).max(32768),
  /** A file from before this field has none. */
  stop: stopStrings.default([]),
});
export type SamplingSettings = z.infer<typeof SamplingSettingsSchema>;

/**
 * What a reply does when the conversation is longer than the context: refuse ("stop"), leave out
 * the oldest exchanges ("rolling_window"), or those after the first ("truncate_middle").
 */
export const ContextOverflowSchema = z.enum(["stop", "rolling_window", "truncate_middle"]);
export type ContextOverflowPolicy = z.infer<typeof ContextOverflowSchema>;

const ActivationsSchema = z.enum(["exact", "head", "int8"]);
const GpuMissesSchema = z.enum(GPU_MISSES);
/** The most experts per layer and step `gpuExpertCopies` takes: Gemma 4 26B's experts per layer. */
export const MAX_GPU_EXPERT_COPIES = 128;
const GpuExpertCopiesSchema = z
  .number()
  .int("experts copied to the GPU must be a whole number")
  .min(0, "experts copied to the GPU cannot be negative")
  .max(MAX_GPU_EXPERT_COPIES, `experts copied to the GPU are at most ${MAX_GPU_EXPERT_COPIES}`);

/** Settings the engine is loaded with: changing any of them needs a reload (but one, below). */
export const EngineSettingsSchema = z.object({
  /** KV-cache positions (prompt plus reply). */
  context: z.number().int().min(256).max(131072),
  /** Expert slots per MoE layer; ignored when `memoryBudgetBytes` is set. */
  expertCacheSlots: z.number().int().min(4).max(128),
  /** When set, the engine picks the slot count that fits. */
  memoryBudgetBytes: bytes.nullable(),
  /**
   * GPU memory for the model on a GPU backend (docs/gpu.md, "Expert streaming on the GPU"): every
   * expert resident when they fit, else the expert slots that fit; ignored on the CPU. null: none.
   * A file from before this field has none.
   */
  vramBudgetBytes: bytes.nullable().default(null),
  /** 0: one per core. */
  threads: z.number().int().min(0).max(256),
  /** Where the engine runs the model (docs/gpu.md): the CPU, a Vulkan GPU, or a GPU if any. */
  backend: z.enum(["cpu", "metal", "vulkan", "auto"]),
  kvDtype: z.enum(["f16", "f32"]),
  /**
   * When the conversation is longer than the context (core/app/context-fit.ts). The one field
   * here that needs no reload: the next reply reads it. A file from before it has none.
   */
  contextOverflow: ContextOverflowSchema.default(CHAT_DEFAULTS.contextOverflow),
  /**
   * Input precision of the quantized products (the Tuning view's presets of an activation
   * plan): exact float32 everywhere, int8 on the output head only, or int8 everywhere. A file
   * from before this field has the default.
   */
  activations: ActivationsSchema.default(ENGINE_DEFAULTS.activations),
  /**
   * Where the experts the GPU's slots miss are computed (docs/gpu.md, "Hybrid experts"): copied
   * into a GPU slot ("copy"), on the CPU from RAM ("cpu"), or split between the two ("split":
   * gpuExpertCopies of them on the GPU, the rest on the CPU at the same time). Applies only under
   * a GPU memory budget on a GPU backend (effectiveGpuMisses). A file from before this field has
   * the default.
   */
  gpuMisses: GpuMissesSchema.default(ENGINE_DEFAULTS.gpuMisses),
  /**
   * Per MoE layer and step: with gpuMisses "split", how many of the misses the GPU copies and
   * computes; with "cpu", at most this many of the CPU-computed experts are also copied into GPU
   * slots. A file from before this field has the engine's default.
   */
  gpuExpertCopies: GpuExpertCopiesSchema.default(ENGINE_DEFAULTS.gpuExpertCopies),
});
export type EngineSettings = z.infer<typeof EngineSettingsSchema>;

/**
 * The GPU memory budget a load sends: the saved one on a GPU backend (metal, vulkan, auto), none
 * on the CPU, where the engine ignores it (and it must not keep the saved slot count from being
 * sent, nor ask for a reload).
 */
export function effectiveVramBudget(
  s: Pick<EngineSettings, "backend" | "vramBudgetBytes">,
): number | undefined {
  return s.backend === "cpu" || s.vramBudgetBytes == null
    ? undefined
    : Math.floor(s.vramBudgetBytes);
}

/**
 * Where a load sends the GPU's expert misses (the load's `gpu_misses`, and `gpu_expert_copies`
 * with "cpu" and "split", the modes that count it): only on a GPU backend with a GPU memory
 * budget, the one way these settings give the GPU fewer expert slots than host memory (the RAM
 * tier, where the choice exists; without a budget the GPU's slots mirror the host's). Elsewhere
 * undefined: the engine would ignore them, and they must not ask for a reload.
 */
export function effectiveGpuMisses(
  s: Pick<EngineSettings, "backend" | "vramBudgetBytes" | "gpuMisses" | "gpuExpertCopies">,
): { gpuMisses: GpuMisses; gpuExpertCopies?: number } | undefined {
  if (effectiveVramBudget(s) === undefined) return undefined;
  return s.gpuMisses === "copy"
    ? { gpuMisses: "copy" }
    : { gpuMisses: s.gpuMisses, gpuExpertCopies: s.gpuExpertCopies };
}

/**
 * Engine settings as a patch: any subset. Without the defaults: a patch that leaves a field with
 * a default out (`contextOverflow`, `activations`, ...) keeps the saved choice (zod fills the
 * defaults of absent fields, in a partial object too).
 */
const EngineSettingsPartialSchema = EngineSettingsSchema.extend({
  contextOverflow: ContextOverflowSchema,
  vramBudgetBytes: bytes.nullable(),
  activations: ActivationsSchema,
  gpuMisses: GpuMissesSchema,
  gpuExpertCopies: GpuExpertCopiesSchema,
}).partial();

export const SettingsSchema = z.object({
  sampling: SamplingSettingsSchema,
  engine: EngineSettingsSchema,
  /** System prompt for new conversations. */
  systemPrompt: z.string().max(100_000),
  /** The model loaded at start and chatted with; null: the demo model. */
  activeModel: modelName.nullable(),
  server: z.object({
    enabled: z.boolean(),
    port: z.number().int().min(1).max(65535),
  }),
  /**
   * Each model's own engine and sampling settings, saved when another model becomes the active
   * one; `engine` and `sampling` above are always the active model's. A file from before this
   * field has none: the settings in it become the active model's at its first switch.
   */
  models: z
    .record(modelName, z.object({ engine: EngineSettingsSchema, sampling: SamplingSettingsSchema }))
    .default({}),
  /**
   * The remote model chats go to instead of the local engine (chosen in the model picker), or
   * null: the local model. Sampling settings apply to it as far as the endpoint takes them.
   */
  remote: RemoteTargetSchema.nullable().default(null),
});
export type Settings = z.infer<typeof SettingsSchema>;

export const DEFAULT_SETTINGS: Settings = {
  sampling: {
    temperature: SAMPLING_DEFAULTS.temperature,
    topK: SAMPLING_DEFAULTS.topK,
    topP: SAMPLING_DEFAULTS.topP,
    repetitionPenalty: SAMPLING_DEFAULTS.repetitionPenalty,
    seed: null,
    maxNewTokens: SAMPLING_DEFAULTS.maxNewTokens,
    stop: [],
  },
  engine: {
    context: ENGINE_DEFAULTS.context,
    expertCacheSlots: ENGINE_DEFAULTS.expertCacheSlots,
    memoryBudgetBytes: null,
    vramBudgetBytes: null,
    threads: ENGINE_DEFAULTS.threads,
    backend: ENGINE_DEFAULTS.backend,
    kvDtype: ENGINE_DEFAULTS.kvDtype,
    contextOverflow: CHAT_DEFAULTS.contextOverflow,
    activations: ENGINE_DEFAULTS.activations,
    gpuMisses: ENGINE_DEFAULTS.gpuMisses,
    gpuExpertCopies: ENGINE_DEFAULTS.gpuExpertCopies,
  },
  systemPrompt: "",
  activeModel: null,
  server: { enabled: false, port: SERVER_DEFAULTS.port },
  models: {},
  remote: null,
};

/** A partial update: any subset of fields, nested objects merged. */
export const SettingsPatchSchema = z.object({
  // Without the default: a patch that leaves `stop` out keeps the saved stop strings.
  sampling: SamplingSettingsSchema.extend({ stop: stopStrings }).partial().optional(),
  engine: EngineSettingsPartialSchema.optional(),
  systemPrompt: SettingsSchema.shape.systemPrompt.optional(),
  activeModel: SettingsSchema.shape.activeModel.optional(),
  server: SettingsSchema.shape.server.partial().optional(),
  remote: RemoteTargetSchema.nullable().optional(),
});
export type SettingsPatch = z.infer<typeof SettingsPatchSchema>;

// ---- app --------------------------------------------------------------------------------------

export const AppInfoSchema = z.object({
  version: z.string(),
  /** "electron": the desktop app; "web": `redwing ui` in a browser. */
  shell: z.enum(["electron", "web"]),
  platform: z.string(),
  arch: z.string(),
  dataDir: z.string(),
  modelsDir: z.string(),
  hardwareThreads: z.number().int(),
  totalMemoryBytes: bytes,
  /** What the live panel can show on this machine (hidden otherwise). */
  features: z.object({ energy: z.boolean(), thermal: z.boolean(), reveal: z.boolean() }),
  /** Things from start-up the user should know (e.g. a damaged settings file was set aside). */
  notices: z.array(z.string()).optional(),
});
export type AppInfo = z.infer<typeof AppInfoSchema>;

// ---- models -----------------------------------------------------------------------------------

export const CatalogItemSchema = z.object({
  id: z.string(),
  title: z.string(),
  description: z.string(),
  kind: z.enum(["demo", "hub"]),
  repo: z.string().nullable(),
  downloadBytes: bytes.nullable(),
  installBytes: bytes,
  /** Memory needed at the installed model's own settings (else the catalog's estimate). */
  memoryBytes: bytes,
  memoryNote: z.string(),
  /** Whether it fits in this machine's total memory. */
  fits: z.boolean(),
  licence: z.object({ name: z.string(), url: z.string(), gated: z.boolean(), note: z.string() }),
  /** The installed model's name, or null. */
  installedAs: z.string().nullable(),
});
export type CatalogItem = z.infer<typeof CatalogItemSchema>;

/** A model found by `models.search` (core/install/discover.ts says how each field is found). */
export const DiscoveredModelSchema = z.object({
  repo: z.string(),
  url: z.string(),
  downloads: z.number().int().nonnegative(),
  likes: z.number().int().nonnegative(),
  updatedAt: z.string().nullable(),
  /** "unsupported": Redwing cannot run it (`reason`); "unknown": its files could not be read. */
  status: z.enum(["runnable", "unsupported", "unknown"]),
  reason: z.string().nullable(),
  family: z.string().nullable(),
  architecture: z.string().nullable(),
  format: z.string().nullable(),
  downloadBytes: bytes.nullable(),
  installBytes: bytes.nullable(),
  /** The engine's memory plan at the current engine settings (as in `models.list`). */
  memoryBytes: bytes.nullable(),
  /** Whether it fits in this machine's total memory. */
  fits: z.boolean().nullable(),
  licence: z.object({
    id: z.string().nullable(),
    name: z.string().nullable(),
    url: z.string().nullable(),
  }),
  gated: z.boolean(),
  access: z.enum(["open", "granted", "needs_token", "denied"]),
  /** The installed model's name when this repository is installed, or null. */
  installedAs: z.string().nullable(),
});
export type DiscoveredModel = z.infer<typeof DiscoveredModelSchema>;

export const ModelSearchSchema = z.object({
  query: z.string(),
  /** The hub searched (HF_ENDPOINT or huggingface.co). */
  endpoint: z.string(),
  /** Whether a hub token (HF_TOKEN or the token file) is set. */
  tokenSet: z.boolean(),
  models: z.array(DiscoveredModelSchema),
});
export type ModelSearch = z.infer<typeof ModelSearchSchema>;

export const VerifyStateSchema = z.object({
  state: z.enum(["unchecked", "checking", "ok", "corrupt"]),
  /** Files hashed so far while checking. */
  fraction: z.number().min(0).max(1).optional(),
  /** What is wrong (the file named) when corrupt. */
  message: z.string().optional(),
  checkedAt: z.string().optional(),
});
export type VerifyState = z.infer<typeof VerifyStateSchema>;

export const InstalledModelSchema = z.object({
  name: z.string(),
  dir: z.string(),
  sizeBytes: bytes,
  /** At the current engine settings. */
  memoryEstimateBytes: bytes,
  family: z.string(),
  moe: z.boolean(),
  isDemo: z.boolean(),
  verify: VerifyStateSchema,
  /** Loaded in the engine now. */
  loaded: z.boolean(),
});
export type InstalledModel = z.infer<typeof InstalledModelSchema>;

export const DownloadStateSchema = z.enum(["running", "paused", "done", "failed", "cancelled"]);

export const DownloadSchema = z.object({
  taskId: id,
  /** What was asked for: a catalog id or `owner/repo[@revision]`. */
  ref: z.string(),
  /** The model directory name it installs to. */
  name: z.string(),
  state: DownloadStateSchema,
  phase: z.enum([
    "resolving",
    "planning",
    "verifying",
    "downloading",
    "paused",
    "finishing",
    "done",
  ]),
  bytesDone: bytes,
  bytesTotal: bytes,
  /** Bytes/s; null until measured. */
  rate: z.number().nullable(),
  etaSeconds: z.number().nullable(),
  file: z.string().nullable(),
  /** The latest note from the installer (a retry, a resume). */
  note: z.string().nullable(),
  error: AppErrorSchema.nullable(),
});
export type Download = z.infer<typeof DownloadSchema>;

// ---- engine -----------------------------------------------------------------------------------

export const EngineStatusSchema = z.object({
  state: z.enum(["stopped", "starting", "loading", "ready", "generating", "crashed"]),
  /** Installed model name (or "demo"). */
  model: z.string().nullable(),
  pid: z.number().int().nullable(),
  /** Load progress 0..1 while loading. */
  loadFraction: z.number().min(0).max(1).nullable(),
  /** The engine settings it was loaded with. */
  loadedWith: EngineSettingsSchema.nullable(),
  /** Slots per MoE layer actually used (a memory budget picks them); 0: all resident. */
  expertCacheSlots: z.number().int().nullable(),
  /**
   * How the loaded engine runs the GPU's expert misses (its `ready` event): "cpu" or "split"
   * only while the CPU computes some of them (a GPU backend under the RAM tier), else "copy";
   * null without a model, absent from an older service.
   */
  gpuMisses: GpuMissesSchema.nullable().optional(),
  /** Saved engine settings differ from what is loaded: a reload applies them. */
  reloadNeeded: z.boolean(),
  /**
   * The loaded model's memory. The plan's parts (weights, KV cache, expert cache, working
   * memory; estimateBytes is their total) are the engine's plan for the settings it was loaded
   * with: the figures the Tuning view's plan shows. modelBytes is the model's files on disk,
   * rssBytes what the engine holds now.
   */
  memory: z
    .object({
      modelBytes: bytes,
      weightsBytes: bytes,
      kvBytes: bytes,
      expertCacheBytes: bytes,
      workBytes: bytes,
      estimateBytes: bytes,
      rssBytes: bytes,
      /** GPU backends: the device memory the engine planned for the loaded settings; 0 on the CPU. */
      deviceBytes: bytes.optional(),
    })
    .nullable(),
  /** Why the engine is not usable (crashed, load failed), with the next step. */
  error: AppErrorSchema.nullable(),
});
export type EngineStatus = z.infer<typeof EngineStatusSchema>;

/** What a setting costs in memory, for the Tuning view (model = active model). */
export const MemoryPlanSchema = z.object({
  model: z.string().nullable(),
  weightsBytes: bytes,
  kvBytes: bytes,
  /** Expert slots in all MoE layers; 0 for dense models. */
  expertCacheBytes: bytes,
  /** Activations of one prefill chunk, the logits and the process itself. */
  workBytes: bytes,
  /** weightsBytes + kvBytes + expertCacheBytes + workBytes (host memory). */
  totalBytes: bytes,
  /** GPU backends: the device memory the engine plans (an estimate); 0 on the CPU. */
  deviceBytes: bytes,
  /** Expert slots the plan uses (budget applied); null for dense models. */
  expertCacheSlots: z.number().int().nullable(),
  /** Expected hit rate at that slot count, measured or estimated; null when unknown. */
  expectedHitRate: z.number().min(0).max(1).nullable(),
  hitRateSource: z.enum(["measured", "estimate"]).nullable(),
  freeMemoryBytes: bytes,
  /** Whether the total fits in the free memory (the memory budget is `overBudget`'s matter). */
  fits: z.boolean(),
  /** The memory budget the plan was made for; null without one. */
  budgetBytes: bytes.nullable(),
  /** The GPU memory budget the plan was made for (GPU backends only); null without one. */
  vramBudgetBytes: bytes.nullable().optional(),
  /**
   * The engine's reason when the plan does not fit in the memory budget or the GPU memory
   * budget (then it starts with "GPU memory budget"); null when it does.
   */
  overBudget: z.string().nullable(),
});
export type MemoryPlan = z.infer<typeof MemoryPlanSchema>;

// ---- chat -------------------------------------------------------------------------------------

export const MessageStatsSchema = z.object({
  /** `19.9 t/s, TTFT: 660.1ms (19.7 t/s, 13 tokens), 53 tokens` */
  line: z.string(),
  decodeTokensPerSecond: z.number(),
  ttftMs: z.number(),
  prefillTokensPerSecond: z.number(),
  promptTokens: z.number().int(),
  generatedTokens: z.number().int(),
  peakRssBytes: bytes.nullable(),
  hitRate: z.number().nullable(),
});
export type MessageStats = z.infer<typeof MessageStatsSchema>;

/**
 * Why a reply ended: an end-of-turn token, a stop string, "Max new tokens", the context full
 * ("context_full": nothing more could be left out, or the policy is "stop"), Stop, a failure.
 */
const FinishReasonSchema = z.enum(["eos", "stop", "length", "context_full", "cancelled", "error"]);

/** What a reply left out of the conversation to fit the context (core/app/context-fit.ts). */
export const ContextNoteSchema = z.object({
  policy: ContextOverflowSchema,
  /** Messages left out of the prompt (at the reply's last continuation). */
  droppedMessages: z.number().int().min(0),
  /** Tokens of their text; null when one was too long to count. */
  droppedTokens: z.number().int().min(0).nullable(),
  /** The context length, in tokens. */
  context: z.number().int().positive(),
  /** Times the reply filled the context and went on after leaving out more. */
  continued: z.number().int().min(0),
});
export type ContextNote = z.infer<typeof ContextNoteSchema>;

/** What every message and every kept version of one has. */
const MessageFieldsSchema = z.object({
  id,
  content: z.string(),
  createdAt: z.string(),
  /** Assistant messages: the model that wrote it. */
  model: z.string().optional(),
  stats: MessageStatsSchema.optional(),
  finishReason: FinishReasonSchema.optional(),
  error: AppErrorSchema.optional(),
  /** Assistant messages that left part of the conversation out to fit the context. */
  contextNote: ContextNoteSchema.optional(),
});

/**
 * Another version of a message, kept by Regenerate (a reply) or Edit (a user message): a branch.
 * `after` holds the messages that followed this version in its branch (absent: none).
 */
export interface MessageVersion extends z.infer<typeof MessageFieldsSchema> {
  after?: Message[];
}

/** A message on the branch shown (see Conversation.messages). */
export interface Message extends z.infer<typeof MessageFieldsSchema> {
  role: "user" | "assistant";
  otherVersions?: MessageVersion[];
  versionIndex?: number;
}

/** Most versions kept per message; Regenerate or Edit beyond this forgets the oldest. */
export const MAX_VERSIONS = 100;

export const MessageVersionSchema: z.ZodType<MessageVersion> = MessageFieldsSchema.extend({
  get after() {
    return z.array(MessageSchema).optional();
  },
});

export const MessageSchema: z.ZodType<Message> = MessageFieldsSchema.extend({
  role: z.enum(["user", "assistant"]),
  /**
   * The message's other versions (branches), oldest first: Regenerate keeps earlier replies,
   * Edit earlier user messages, each with the messages that followed it. The message itself is
   * the one shown (and the one the model sees), at `versionIndex` among all of them. Absent
   * (conversations stored before versions, or a message never regenerated nor edited): one version.
   */
  get otherVersions() {
    return z.array(MessageVersionSchema).max(MAX_VERSIONS).optional();
  },
  versionIndex: z.number().int().min(0).optional(),
});

/**
 * The storage format of a conversation (docs/app.md): 2 since branches. Files without it are
 * format 1, where a reply's other versions shared the messages after it; the store migrates
 * them on load (each version gets a copy of those messages as its branch).
 */
export const CONVERSATION_FORMAT = 2;

export const ConversationSchema = z.object({
  id,
  /** Absent: format 1 (see CONVERSATION_FORMAT). */
  format: z.literal(CONVERSATION_FORMAT).optional(),
  title: z.string(),
  systemPrompt: z.string(),
  createdAt: z.string(),
  updatedAt: z.string(),
  /** Kept at the top of the list. */
  pinned: z.boolean().optional(),
  /** The branch shown, in order: what the model sees. */
  messages: z.array(MessageSchema),
});
export type Conversation = z.infer<typeof ConversationSchema>;

export const ConversationSummarySchema = z.object({
  id,
  title: z.string(),
  updatedAt: z.string(),
  messageCount: z.number().int(),
  pinned: z.boolean(),
});
export type ConversationSummary = z.infer<typeof ConversationSummarySchema>;

/** A search hit (core/app/conversation-search.ts): a conversation's title or one of its messages shown. */
export const SearchHitSchema = z.object({
  conversationId: id,
  title: z.string(),
  updatedAt: z.string(),
  pinned: z.boolean(),
  /** The message that matched; null when the title did. */
  messageId: id.nullable(),
  role: z.enum(["user", "assistant"]).nullable(),
  /** The text around the first match ("…" where cut; line breaks as spaces). */
  snippet: z.string(),
  /** Each match in `snippet`: [start, end) in UTF-16 code units. */
  highlights: z.array(z.tuple([z.number().int().min(0), z.number().int().min(0)])),
});
export type SearchHit = z.infer<typeof SearchHitSchema>;

/** The largest file `chat.import` reads (web mode's request limit is 4 MiB, escapes included). */
export const MAX_IMPORT_BYTES = 3 * 1024 * 1024;

/**
 * A JSON export (docs/app.md): `conversations` in the storage format, branches included, which
 * `chat.import` reads back as they were (new ids where one is taken).
 */
export const EXPORT_FORMAT = "redwing-conversations";
export const EXPORT_VERSION = 1;
export const ExportFileSchema = z.object({
  format: z.literal(EXPORT_FORMAT),
  version: z.literal(EXPORT_VERSION),
  exportedAt: z.string(),
  conversations: z.array(ConversationSchema).min(1).max(10_000),
});
export type ExportFile = z.infer<typeof ExportFileSchema>;

// ---- server -----------------------------------------------------------------------------------

export const ServerStatusSchema = z.object({
  running: z.boolean(),
  /** http://127.0.0.1:8080/v1 when running. */
  url: z.string().nullable(),
  modelId: z.string().nullable(),
  /** A ready-to-paste curl command against the running server. */
  example: z.string().nullable(),
  error: AppErrorSchema.nullable(),
  /** Requests in flight, oldest first: waiting for the engine ("queued") or generating. */
  requests: z.array(
    z.object({
      id: z.string(),
      endpoint: z.enum(["chat", "completion"]),
      /** The client's address:port. */
      client: z.string(),
      state: z.enum(["queued", "running"]),
      tokens: z.number().int().min(0),
      maxTokens: z.number().int().min(0),
      /** ms since the epoch. */
      receivedAt: z.number(),
    }),
  ),
  /**
   * Why the running server answers 503 for now (the engine crashed and is restarting, or a model
   * is loading), or null when it serves.
   */
  unavailable: z.string().nullable(),
});
export type ServerStatus = z.infer<typeof ServerStatusSchema>;

/** The server's status while it is off (no error). */
export const SERVER_OFF: ServerStatus = Object.freeze({
  running: false,
  url: null,
  modelId: null,
  example: null,
  error: null,
  requests: [],
  unavailable: null,
});

/** What the example asks for at most: a short answer, so that trying it costs seconds. */
export const EXAMPLE_MAX_TOKENS = 128;

/** ServerStatus's `example`: a ready-to-paste request against the running server, bounded. */
export function curlExample(baseUrl: string, modelId: string): string {
  const body = JSON.stringify({
    model: modelId,
    messages: [{ role: "user", content: "Hello!" }],
    max_tokens: EXAMPLE_MAX_TOKENS,
  });
  return [
    `curl ${baseUrl}/chat/completions \\`,
    `  -H "Content-Type: application/json" \\`,
    `  -d '${body}'`,
  ].join("\n");
}

// ---- live -------------------------------------------------------------------------------------

export const LiveSampleSchema = z.object({
  /** ms since the epoch. */
  t: z.number(),
  generating: z.boolean(),
  /**
   * A generation (chat reply or server request) finished since the previous sample, and this
   * sample carries its final figures: charts plot it even when the reply was shorter than the
   * sampling interval. Absent means false.
   */
  finished: z.boolean().optional(),
  /** Engine process memory; null while no engine runs. */
  rssBytes: bytes.nullable(),
  peakRssBytes: bytes.nullable(),
  /** The memory budget, or the load-time estimate when no budget is set. */
  budgetBytes: bytes.nullable(),
  freeMemoryBytes: bytes,
  totalMemoryBytes: bytes,
  /** Of the running (else the last) generation. */
  decodeTokensPerSecond: z.number().nullable(),
  ttftMs: z.number().nullable(),
  generatedTokens: z.number().int().nullable(),
  expertCache: z
    .object({
      slots: z.number().int(),
      hitRate: z.number().nullable(),
      readBytesPerToken: z.number().nullable(),
      /** ms per token the model thread waited on expert reads; null or absent when unmeasured. */
      ioWaitMsPerToken: z.number().nullable().optional(),
      /**
       * A GPU backend's tiers (docs/gpu.md): its slots per layer (0 on the CPU), and the shares
       * of expert uses found in a GPU slot and in host memory (RAM); null or absent when
       * unmeasured or from an older service.
       */
      gpuSlots: z.number().int().nullable().optional(),
      gpuHitRate: z.number().nullable().optional(),
      ramHitRate: z.number().nullable().optional(),
      /** Bytes copied from host memory to the GPU per generated token (GPU backends). */
      gpuCopyBytesPerToken: z.number().nullable().optional(),
      /**
       * Hybrid experts (docs/gpu.md): expert uses the CPU computed per generated token and the
       * CPU's ms on them; 0 without hybrid experts.
       */
      cpuExpertsPerToken: z.number().nullable().optional(),
      cpuExpertMsPerToken: z.number().nullable().optional(),
    })
    .nullable(),
  /** Package power where the machine exposes it (RAPL, NVML); null otherwise. */
  powerWatts: z.number().nullable(),
  joulesPerToken: z.number().nullable(),
  /** macOS thermal state ("nominal", "fair", "serious", "critical"); null elsewhere. */
  thermal: z.string().nullable(),
});
export type LiveSample = z.infer<typeof LiveSampleSchema>;

// ---- connections ------------------------------------------------------------------------------

/** A saved OpenAI-compatible endpoint as the UI sees it: never its API key. */
export const ConnectionSchema = z.object({
  id,
  name: z.string(),
  /** The API's base URL, e.g. http://gpu-box:8000/v1. */
  baseUrl: z.string(),
  /** Where its API key is kept: the OS keychain, a file only this user can read, or none. */
  keyStorage: z.enum(["keychain", "file"]).nullable(),
  /** A risk to know about (the key or the conversation sent in clear over http), or null. */
  warning: z.string().nullable(),
  /** Its models as last listed, sorted; null: not listed yet. */
  models: z.array(z.string()).nullable(),
  /** Why the last listing failed, or null. */
  error: AppErrorSchema.nullable(),
});
export type Connection = z.infer<typeof ConnectionSchema>;

const connectionName = z.string().min(1).max(100);
const baseUrl = z.string().min(1).max(2000);
/** "" or null removes the key; absent keeps it. */
const apiKey = z.string().max(4096);

// ---- calls ------------------------------------------------------------------------------------

const none = z.object({}).strict();
const ok = z.object({ ok: z.literal(true) });
const byName = z.object({ name: modelName }).strict();
const byTask = z.object({ taskId: id }).strict();
const byConversation = z.object({ conversationId: id }).strict();

/** Every call: its params and result schemas. */
export const API = {
  "app.info": { params: none, result: AppInfoSchema },

  "settings.get": { params: none, result: SettingsSchema },
  /** Saves a patch; engine settings take effect on the next load (`engine.reload`). */
  "settings.update": {
    params: SettingsPatchSchema.strict(),
    result: z.object({ settings: SettingsSchema, reloadNeeded: z.boolean() }),
  },
  "settings.reset": { params: none, result: SettingsSchema },
  /** Memory a model would need at the given engine settings (default: saved ones). */
  "settings.memoryPlan": {
    params: z
      .object({ model: modelName.optional(), engine: EngineSettingsPartialSchema.optional() })
      .strict(),
    result: MemoryPlanSchema,
  },

  "models.catalog": { params: none, result: z.array(CatalogItemSchema) },
  "models.list": { params: none, result: z.array(InstalledModelSchema) },
  /**
   * Searches the hub for models and says which Redwing can run (sizes, memory, fit, licence,
   * gating). A newer search ends an unfinished one (it fails with `search_superseded`).
   */
  "models.search": {
    params: z
      .object({
        query: z.string().max(200),
        limit: z.number().int().min(1).max(100).optional(),
      })
      .strict(),
    result: ModelSearchSchema,
  },
  /** Starts a download: a catalog id or `owner/repo[@revision]`; `name` the directory. */
  "models.install": {
    params: z.object({ ref: z.string().min(1).max(300), name: modelName.optional() }).strict(),
    result: DownloadSchema,
  },
  "models.downloads": { params: none, result: z.array(DownloadSchema) },
  /** Stops a download, keeping what was fetched. */
  "models.pause": { params: byTask, result: DownloadSchema },
  "models.resume": { params: byTask, result: DownloadSchema },
  /** Stops a download and deletes what was fetched. */
  "models.cancel": { params: byTask, result: DownloadSchema },
  /** Forgets a finished, failed or cancelled download. */
  "models.dismiss": { params: byTask, result: ok },
  /** Rehashes every file (progress in `models` events). */
  "models.verify": { params: byName, result: VerifyStateSchema },
  "models.remove": { params: byName, result: ok },
  /** Shows the model folder in the file manager (Electron); web mode answers the path. */
  "models.reveal": { params: byName, result: z.object({ path: z.string(), shown: z.boolean() }) },

  "engine.status": { params: none, result: EngineStatusSchema },
  /** Loads a model (default: the active one) with the saved engine settings; sets it active. */
  "engine.load": {
    params: z
      .object({
        model: modelName.optional(),
        /** Saved as the model's own settings before it loads (an error's fix). */
        engine: EngineSettingsPartialSchema.optional(),
      })
      .strict(),
    result: EngineStatusSchema,
  },
  "engine.unload": { params: none, result: EngineStatusSchema },
  /** Reloads the loaded (or active) model with the saved settings; restarts a crashed engine. */
  "engine.reload": { params: none, result: EngineStatusSchema },

  "chat.list": { params: none, result: z.array(ConversationSummarySchema) },
  "chat.get": { params: z.object({ id }).strict(), result: ConversationSchema },
  "chat.create": {
    params: z
      .object({
        title: z.string().max(200).optional(),
        systemPrompt: z.string().max(100_000).optional(),
      })
      .strict(),
    result: ConversationSchema,
  },
  "chat.rename": {
    params: z.object({ id, title: z.string().min(1).max(200) }).strict(),
    result: ConversationSchema,
  },
  "chat.setSystemPrompt": {
    params: z.object({ id, systemPrompt: z.string().max(100_000) }).strict(),
    result: ConversationSchema,
  },
  "chat.delete": { params: z.object({ id }).strict(), result: ok },
  /**
   * Appends a user message and starts the reply; answers at once with the conversation holding
   * the new user message and an empty assistant message, whose text arrives in `chat.delta`
   * events and ends with `chat.done`.
   */
  "chat.send": {
    params: z.object({ conversationId: id, content: z.string().min(1).max(1_000_000) }).strict(),
    result: ConversationSchema,
  },
  /**
   * Writes a reply again (default: the last one); the earlier reply and what followed it are
   * kept as another version of it (a branch).
   */
  "chat.regenerate": {
    params: z.object({ conversationId: id, messageId: id.optional() }).strict(),
    result: ConversationSchema,
  },
  /**
   * Shows another version (0 = oldest) of a regenerated reply or an edited message, with the
   * messages of its branch: the branch the model sees from then on.
   */
  "chat.selectVersion": {
    params: z
      .object({ conversationId: id, messageId: id, index: z.number().int().min(0).max(100) })
      .strict(),
    result: ConversationSchema,
  },
  /**
   * A user message with new text, and a reply to it, as a new branch: the message as it was and
   * everything after it are kept as its other version.
   */
  "chat.edit": {
    params: z
      .object({ conversationId: id, messageId: id, content: z.string().min(1).max(1_000_000) })
      .strict(),
    result: ConversationSchema,
  },
  /** Stops the reply being written (the text so far is kept). */
  "chat.stop": { params: byConversation, result: ok },
  /** Pins a conversation to the top of the list, or unpins it. */
  "chat.pin": {
    params: z.object({ id, pinned: z.boolean() }).strict(),
    result: ConversationSchema,
  },
  /** Titles and the messages shown, case- and diacritics-insensitive; best hits first. */
  "chat.search": {
    params: z
      .object({ query: z.string().max(500), limit: z.number().int().min(1).max(500).optional() })
      .strict(),
    result: z.array(SearchHitSchema),
  },
  /**
   * Conversations (default: all) as Markdown or as JSON (ExportFileSchema). Electron asks where
   * to save (`savedTo`, null when cancelled; `content` null); web mode answers `content` to
   * download.
   */
  "chat.export": {
    params: z
      .object({
        ids: z.array(id).min(1).max(10_000).optional(),
        format: z.enum(["markdown", "json"]),
      })
      .strict(),
    result: z.object({
      filename: z.string(),
      mimeType: z.string(),
      content: z.string().nullable(),
      savedTo: z.string().nullable(),
    }),
  },
  /** Adds the conversations of a JSON export (never replacing one: new ids where taken). */
  "chat.import": {
    params: z.object({ data: z.string().max(4 * 1024 * 1024) }).strict(),
    result: z.object({ imported: z.array(ConversationSummarySchema) }),
  },

  "server.status": { params: none, result: ServerStatusSchema },
  /** Starts or stops the OpenAI-compatible server (port from settings); saves `server.enabled`. */
  "server.set": {
    params: z
      .object({ enabled: z.boolean(), port: z.number().int().min(1).max(65535).optional() })
      .strict(),
    result: ServerStatusSchema,
  },
  /** Ends a server request (it leaves the queue, or its generation stops; its client gets no answer). */
  "server.cancel": { params: z.object({ id: z.string().min(1).max(100) }).strict(), result: ok },

  /** The last samples (about 2 minutes at 2 per second), oldest first. */
  "live.history": { params: none, result: z.array(LiveSampleSchema) },

  "connections.list": { params: none, result: z.array(ConnectionSchema) },
  /** Saves an endpoint (URL checked; key to the OS keychain, else a 0600 file), then lists its models. */
  "connections.add": {
    params: z.object({ name: connectionName, baseUrl, apiKey: apiKey.optional() }).strict(),
    result: ConnectionSchema,
  },
  "connections.update": {
    params: z
      .object({
        id,
        name: connectionName.optional(),
        baseUrl: baseUrl.optional(),
        apiKey: apiKey.nullable().optional(),
      })
      .strict(),
    result: ConnectionSchema,
  },
  /** Lists the endpoint's models again: fails with the endpoint's error in plain words. */
  "connections.test": { params: z.object({ id }).strict(), result: ConnectionSchema },
  /** Forgets the endpoint and its key; chats on one of its models go back to the local model. */
  "connections.remove": { params: z.object({ id }).strict(), result: ok },
} as const;

export type Method = keyof typeof API;
export type Params<M extends Method> = z.input<(typeof API)[M]["params"]>;
export type Result<M extends Method> = z.infer<(typeof API)[M]["result"]>;

export const METHODS = Object.keys(API) as Method[];

export function isMethod(name: string): name is Method {
  return Object.prototype.hasOwnProperty.call(API, name);
}

// ---- events -----------------------------------------------------------------------------------

export const AppEventSchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("settings"), settings: SettingsSchema, reloadNeeded: z.boolean() }),
  /** The installed models or a verify state changed: refetch `models.list`. */
  z.object({ type: z.literal("models"), models: z.array(InstalledModelSchema) }),
  z.object({ type: z.literal("download"), download: DownloadSchema }),
  z.object({ type: z.literal("engine"), status: EngineStatusSchema }),
  /** A piece of the reply being written. */
  z.object({
    type: z.literal("chat.delta"),
    conversationId: id,
    messageId: id,
    text: z.string(),
  }),
  /** The reply is complete (or stopped, or failed: see `message.finishReason` / `error`). */
  z.object({ type: z.literal("chat.done"), conversationId: id, message: MessageSchema }),
  /** The conversation list changed (created, renamed, deleted, new title). */
  z.object({ type: z.literal("conversations"), conversations: z.array(ConversationSummarySchema) }),
  z.object({ type: z.literal("server"), status: ServerStatusSchema }),
  /** About twice a second while the app runs. */
  z.object({ type: z.literal("live"), sample: LiveSampleSchema }),
  /** The saved connections or their model lists changed. */
  z.object({ type: z.literal("connections"), connections: z.array(ConnectionSchema) }),
]);
export type AppEvent = z.infer<typeof AppEventSchema>;

// ---- the backend both transports carry ---------------------------------------------------------

/** A call's answer on the wire: one of the two. */
export type CallOutcome<M extends Method> =
  { ok: true; result: Result<M> } | { ok: false; error: AppError };

/**
 * What the main process implements and both transports expose: `call` takes params already
 * validated against `API[method].params`; events go to every subscriber.
 */
export interface AppBackend {
  call<M extends Method>(method: M, params: z.infer<(typeof API)[M]["params"]>): Promise<Result<M>>;
  subscribe(listener: (event: AppEvent) => void): () => void;
}

/** What the renderer uses: the same, with unvalidated params (the transport validates). */
export interface AppClient {
  call<M extends Method>(method: M, params?: Params<M>): Promise<Result<M>>;
  subscribe(listener: (event: AppEvent) => void): () => void;
}

/** Thrown by clients when a call answers an AppError. */
export class AppCallError extends Error {
  constructor(readonly error: AppError) {
    super(error.message);
    this.name = "AppCallError";
  }
}

/**
 * Validates a call's params against its schema; a bad call answers an AppError (never throws),
 * so both transports reject malformed messages the same way.
 */
export function parseCall(
  method: string,
  params: unknown,
): { ok: true; method: Method; params: unknown } | { ok: false; error: AppError } {
  if (!isMethod(method)) {
    return {
      ok: false,
      error: { code: "unknown_method", message: `unknown call "${method}"`, action: null },
    };
  }
  const parsed = API[method].params.safeParse(params ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const where = issue.path.map(String).join(".") || "params";
    return {
      ok: false,
      error: {
        code: "bad_request",
        message: `invalid ${method} call: ${where}: ${issue.message}`,
        action: null,
      },
    };
  }
  return { ok: true, method, params: parsed.data };
}
