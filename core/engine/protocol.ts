/**
 * The decode-service protocol (docs/protocol.md), version 1, as zod schemas: every request the
 * client sends and every event the service writes is checked against these. Exported for the
 * server and the app, which speak to the service through the same client.
 *
 * Field names are the protocol's own (snake_case), so a request object is the JSON line minus
 * `type` and `id`.
 */
import { z } from "zod";
import { GPU_MISSES } from "../defaults.ts";

export const PROTOCOL_VERSION = 1;

const tokenId = z.number().int().nonnegative();
/** Request ids: strings or integers chosen by the client, echoed in every event they cause. */
export const RequestId = z.union([z.string(), z.number().int()]);
export type RequestId = z.infer<typeof RequestId>;

// ---- requests -------------------------------------------------------------------------------

export const SamplingSchema = z.object({
  temperature: z.number().nonnegative().optional(),
  top_k: z.number().int().nonnegative().optional(),
  top_p: z.number().min(0).max(1).optional(),
  repetition_penalty: z.number().positive().optional(),
  repetition_context: z.number().int().nonnegative().optional(),
  /** Omitted: a random seed. */
  seed: z.number().int().nonnegative().optional(),
});
export type Sampling = z.infer<typeof SamplingSchema>;

/** The kinds of quantized product an activation plan may put on the 8-bit path. */
export const ACTIVATION_KINDS = ["attention", "mlp", "router", "experts", "head"] as const;

/**
 * Whether `s` is an activation plan the engine accepts: "exact", "int8", or a comma-separated
 * list of distinct ACTIVATION_KINDS that take 8-bit inputs (the rest stay exact), e.g. "head".
 */
export function isActivationPlan(s: string): boolean {
  if (s === "exact" || s === "int8") return true;
  const kinds = s.split(",");
  return (
    kinds.every((k) => (ACTIVATION_KINDS as readonly string[]).includes(k)) &&
    new Set(kinds).size === kinds.length
  );
}

export const ActivationPlanSchema = z
  .string()
  .refine(
    isActivationPlan,
    "exact, int8, or a comma-separated list of " + ACTIVATION_KINDS.join(", "),
  );

/** Where a GPU's expert misses run under the RAM tier (docs/gpu.md, "Hybrid experts"). */
const GpuMissesSchema = z.enum(GPU_MISSES);

export const LoadParamsSchema = z.object({
  /** The model directory (docs/format.md). */
  model: z.string().min(1),
  /** KV cache positions (default 4096). */
  context: z.number().int().positive().optional(),
  threads: z.number().int().nonnegative().optional(),
  /** cpu, metal, vulkan or auto (docs/gpu.md); default cpu. */
  backend: z.enum(["cpu", "metal", "vulkan", "auto"]).optional(),
  kv_dtype: z.enum(["f16", "f32"]).optional(),
  /**
   * Input precision of the quantized products (ActivationPlanSchema): exact, int8 (faster,
   * approximate), or the kinds of product that take 8-bit inputs ("head"); omitted: the default.
   */
  activations: ActivationPlanSchema.optional(),
  /** Prefill chunk size in tokens (default 512, or 128 under a memory or GPU memory budget). */
  chunk: z.number().int().positive().optional(),
  expert_cache_slots: z.number().int().nonnegative().optional(),
  /**
   * Extra ring rows for sliding-window layers: how many more positions a prompt may back up and
   * still reuse the cached prefix (default 0; each row costs KV memory on every sliding layer).
   */
  prefix_slack: z.number().int().nonnegative().optional(),
  /** Bytes. */
  memory_budget: z.number().int().nonnegative().optional(),
  /** GPU memory in bytes (GPU backends): core, KV cache and experts, resident or in slots. */
  vram_budget: z.number().int().nonnegative().optional(),
  /**
   * GPU backends: the GPU's expert slots per MoE layer (omitted: vram_budget's pick, else as many
   * as the host's); fewer than the host's make those a RAM tier (docs/gpu.md).
   */
  gpu_expert_slots: z.number().int().nonnegative().optional(),
  /**
   * Under the RAM tier: each GPU miss copied into a GPU slot and computed there ("copy"),
   * computed on the CPU from the host's slots ("cpu": hybrid experts, docs/gpu.md), or split
   * between the two ("split", the default: gpu_expert_copies of a layer's misses per step copied
   * and computed on the GPU, the rest on the CPU at the same time).
   */
  gpu_misses: GpuMissesSchema.optional(),
  /**
   * Per MoE layer and step (default 2): with gpu_misses "split" the misses the GPU copies and
   * computes; with "cpu" the CPU-computed misses also copied into GPU slots at most.
   */
  gpu_expert_copies: z.number().int().nonnegative().optional(),
});
export type LoadParams = z.infer<typeof LoadParamsSchema>;

/** A plan request takes the load fields (threads is ignored) and loads nothing. */
export const PlanParamsSchema = LoadParamsSchema;
export type PlanParams = LoadParams;

export const GenerateParamsSchema = z.object({
  tokens: z.array(tokenId).min(1),
  max_new_tokens: z.number().int().nonnegative().optional(),
  sampling: SamplingSchema.optional(),
  stop_token_ids: z.array(tokenId).optional(),
  /** EOS tokens do not end the generation (benchmarks and tests; default false). */
  ignore_eos: z.boolean().optional(),
  /** false: no tokens/prefill events, only finished (default true). */
  stream: z.boolean().optional(),
  /** Periodic stats events during generation; 0 turns them off (default 1000). */
  stats_interval_ms: z.number().int().nonnegative().optional(),
});
export type GenerateParams = z.infer<typeof GenerateParamsSchema>;

export const RequestSchema = z.discriminatedUnion("type", [
  z.object({ type: z.literal("hello"), id: RequestId, protocol: z.number().int() }),
  LoadParamsSchema.extend({ type: z.literal("load"), id: RequestId }),
  PlanParamsSchema.extend({ type: z.literal("plan"), id: RequestId }),
  GenerateParamsSchema.extend({ type: z.literal("generate"), id: RequestId }),
  z.object({ type: z.literal("cancel"), id: RequestId.optional(), target: RequestId }),
  z.object({ type: z.literal("unload"), id: RequestId }),
  z.object({ type: z.literal("stats"), id: RequestId }),
  z.object({ type: z.literal("shutdown"), id: RequestId }),
]);
export type Request = z.infer<typeof RequestSchema>;

// ---- events ---------------------------------------------------------------------------------

const eventId = RequestId.nullable();

export const HelloEventSchema = z.object({
  type: z.literal("hello"),
  id: eventId,
  protocol: z.number().int(),
  service_version: z.string(),
  backends: z.array(z.string()),
  /** Each backend's device (absent from services older than the GPU backend). */
  devices: z
    .array(
      z.object({
        backend: z.string(),
        name: z.string(),
        memory_bytes: z.number(),
        discrete: z.boolean(),
        software: z.boolean(),
      }),
    )
    .optional(),
  cpu_features: z.array(z.string()),
  hardware_threads: z.number().int(),
  pid: z.number().int(),
});
export type HelloEvent = z.infer<typeof HelloEventSchema>;

export const LoadProgressEventSchema = z.object({
  type: z.literal("load_progress"),
  id: eventId,
  phase: z.string(),
  fraction: z.number().min(0).max(1),
});
export type LoadProgressEvent = z.infer<typeof LoadProgressEventSchema>;

export const ReadyEventSchema = z.object({
  type: z.literal("ready"),
  id: eventId,
  model: z.object({
    dir: z.string(),
    family: z.string(),
    vocab_size: z.number().int(),
    layers: z.number().int(),
    moe: z.boolean(),
    eos_token_ids: z.array(tokenId),
    bos_token_id: z.number().int(),
  }),
  context: z.number().int(),
  backend: z.string(),
  /** Expert slots per MoE layer; 0: every expert resident. */
  expert_cache_slots: z.number().int(),
  /** A GPU backend's expert slots per layer (fewer: the RAM tier); absent from older services. */
  gpu_expert_slots: z.number().int().optional(),
  /**
   * How the GPU's expert misses run: "cpu" or "split" while the GPU's misses go to the CPU (a GPU
   * backend under the RAM tier), else "copy"; absent from older services.
   */
  gpu_misses: GpuMissesSchema.optional(),
  memory: z.object({
    model_bytes: z.number(),
    kv_bytes: z.number(),
    estimate_bytes: z.number(),
    rss_bytes: z.number(),
    /** GPU memory the backend holds (docs/gpu.md); 0 on the CPU. Absent from older services. */
    device_bytes: z.number().optional(),
  }),
});
export type ReadyEvent = z.infer<typeof ReadyEventSchema>;

/**
 * The memory plan (native/src/runtime/memory_plan.h) for a model at load settings, before
 * loading: core_bytes + kv_bytes + expert_bytes + work_bytes = total_bytes (host memory).
 */
export const PlanEventSchema = z.object({
  type: z.literal("plan"),
  id: eventId,
  model: z.string(),
  /** The backend planned for ("auto" resolved). */
  backend: z.string(),
  context: z.number().int(),
  chunk: z.number().int(),
  prefix_slack: z.number().int(),
  kv_dtype: z.enum(["f16", "f32"]),
  /** Expert slots per MoE layer (picked by memory_budget when given); 0: all resident or dense. */
  slots: z.number().int(),
  moe_layers: z.number().int(),
  expert_bytes_each: z.number(),
  /** weights.bin, mapped. */
  core_bytes: z.number(),
  kv_bytes: z.number(),
  expert_bytes: z.number(),
  /** Activations of one prefill chunk, the logits and the process itself. */
  work_bytes: z.number(),
  total_bytes: z.number(),
  /** Every expert file (for comparison; not part of the total). */
  all_experts_bytes: z.number(),
  memory_budget: z.number(),
  /** Why the budget cannot hold the model; null when it fits or there is none. */
  over_budget: z.string().nullable(),
  /** GPU backends: the device memory, estimated; 0 on the CPU. */
  device_bytes: z.number(),
  /** The GPU memory budget planned for (0: none). Absent from services older than it. */
  vram_budget: z.number().optional(),
  /** GPU backends: the GPU's expert slots per layer (fewer than slots: the RAM tier). */
  gpu_slots: z.number().int().optional(),
  /** Of device_bytes, the experts in the GPU's slots (or all). */
  device_expert_bytes: z.number().optional(),
});
export type PlanEvent = z.infer<typeof PlanEventSchema>;

export const PrefillEventSchema = z.object({
  type: z.literal("prefill"),
  id: eventId,
  done: z.number().int(),
  total: z.number().int(),
});
export type PrefillEvent = z.infer<typeof PrefillEventSchema>;

export const TokensEventSchema = z.object({
  type: z.literal("tokens"),
  id: eventId,
  tokens: z.array(tokenId),
});
export type TokensEvent = z.infer<typeof TokensEventSchema>;

export const StatsEventSchema = z.object({
  type: z.literal("stats"),
  id: eventId,
  model: z.string().nullable(),
  generating: z.boolean(),
  generations: z.number().int(),
  prompt_tokens: z.number().int(),
  cached_tokens: z.number().int(),
  prefill_tokens: z.number().int(),
  generated_tokens: z.number().int(),
  prefill_tokens_per_second: z.number(),
  decode_tokens_per_second: z.number(),
  ttft_seconds: z.number(),
  tokens_so_far: z.number().int().optional(),
  memory: z.object({ rss_bytes: z.number(), peak_rss_bytes: z.number(), kv_bytes: z.number() }),
  /** Over the last (or running) generation, prefill included; null when experts are resident. */
  expert_cache: z.object({
    slots: z.number().int(),
    hit_rate: z.number().nullable(),
    read_bytes_per_token: z.number().nullable(),
    /** ms per token the model thread waited on expert reads (absent from older services). */
    io_wait_ms_per_token: z.number().nullable().optional(),
    /**
     * The tiers on a GPU backend (docs/gpu.md; absent from older services): its slots per layer,
     * the share of expert uses already in a GPU slot and in a host slot (RAM), and the bytes
     * copied to the GPU per token.
     */
    gpu_slots: z.number().int().optional(),
    gpu_hit_rate: z.number().nullable().optional(),
    ram_hit_rate: z.number().nullable().optional(),
    gpu_copy_bytes_per_token: z.number().nullable().optional(),
    /** Hybrid experts: expert uses computed on the CPU per token, and the CPU's ms on them. */
    cpu_experts_per_token: z.number().nullable().optional(),
    cpu_expert_ms_per_token: z.number().nullable().optional(),
  }),
});
export type StatsEvent = z.infer<typeof StatsEventSchema>;

export const FinishReason = z.enum(["eos", "stop", "length", "cancelled"]);
export type FinishReason = z.infer<typeof FinishReason>;

export const FinishedEventSchema = z.object({
  type: z.literal("finished"),
  id: eventId,
  reason: FinishReason,
  tokens: z.array(tokenId),
  prompt_tokens: z.number().int(),
  cached_tokens: z.number().int(),
  prefill_tokens: z.number().int(),
  timings: z
    .object({
      prefill_seconds: z.number(),
      ttft_seconds: z.number(),
      decode_seconds: z.number(),
      prefill_tokens_per_second: z.number(),
      decode_tokens_per_second: z.number(),
    })
    .optional(),
});
export type FinishedEvent = z.infer<typeof FinishedEventSchema>;

export const ErrorCode = z.enum([
  "bad_json",
  "bad_request",
  "unknown_type",
  "unsupported_version",
  "unsupported_backend",
  "message_too_large",
  "not_loaded",
  "already_loaded",
  "model_locked",
  "load_failed",
  "plan_failed",
  "context_overflow",
  "generate_failed",
  "non_finite_logits",
  "unload_failed",
  "internal",
]);
export type ErrorCode = z.infer<typeof ErrorCode>;

export const ErrorEventSchema = z.object({
  type: z.literal("error"),
  id: eventId,
  code: ErrorCode,
  message: z.string(),
  owner_pid: z.number().int().optional(),
});
export type ErrorEvent = z.infer<typeof ErrorEventSchema>;

export const UnloadedEventSchema = z.object({ type: z.literal("unloaded"), id: eventId });
export const ByeEventSchema = z.object({ type: z.literal("bye"), id: eventId });

export const EventSchema = z.discriminatedUnion("type", [
  HelloEventSchema,
  LoadProgressEventSchema,
  ReadyEventSchema,
  PlanEventSchema,
  PrefillEventSchema,
  TokensEventSchema,
  StatsEventSchema,
  FinishedEventSchema,
  ErrorEventSchema,
  UnloadedEventSchema,
  ByeEventSchema,
]);
export type Event = z.infer<typeof EventSchema>;

/** What `EngineClient.generate()` yields. */
export type GenerateEvent = PrefillEvent | TokensEvent | StatsEvent | FinishedEvent;
