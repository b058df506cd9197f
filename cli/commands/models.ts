import { Option, type Command } from "commander";
import { listModels } from "../../core/chat/model.ts";
import { formatBytes } from "../../core/chat/stats.ts";
import { ENGINE_DEFAULTS, expertCacheSlotsFor } from "../../core/defaults.ts";
import { DEMO_LABEL } from "../../core/demo/demo.ts";
import { EngineClient, type PlanEvent, type PlanParams } from "../../core/engine/index.ts";
import { modelsDir } from "../../core/paths.ts";
import { backendOption, intArg, parseByteSize } from "./chat.ts";

interface ModelsOptions {
  json?: boolean;
  context: number;
  expertCacheSlots?: number;
  memoryBudget?: number;
  kvDtype: "f16" | "f32";
  backend?: "cpu" | "metal" | "vulkan" | "auto";
}

/** The load settings the plan is asked for: those `redwing chat` would load with. */
function planSettings(opts: ModelsOptions): Omit<PlanParams, "model"> {
  const slots = expertCacheSlotsFor(opts.expertCacheSlots, opts.memoryBudget);
  return {
    context: opts.context,
    kv_dtype: opts.kvDtype,
    ...(opts.backend !== undefined ? { backend: opts.backend } : {}),
    // With a memory budget and no slot count, the engine picks the count that fits.
    ...(opts.memoryBudget !== undefined ? { memory_budget: opts.memoryBudget } : {}),
    ...(slots !== undefined ? { expert_cache_slots: slots } : {}),
  };
}

/** The plan's parts as the JSON listing prints them (every part of the total). */
function planJson(p: PlanEvent): Record<string, unknown> {
  return {
    weights_bytes: p.core_bytes,
    kv_bytes: p.kv_bytes,
    expert_bytes: p.expert_bytes,
    work_bytes: p.work_bytes,
    total_bytes: p.total_bytes,
    expert_cache_slots: p.moe_layers > 0 ? p.slots : null,
    device_bytes: p.device_bytes,
    over_budget: p.over_budget,
  };
}

/**
 * `redwing models`: the installed models with their size and the engine's memory plan (the
 * decode service's plan request, docs/protocol.md: the figures the app's Tuning view and
 * `redwing-engine memory` show for the same settings).
 */
export function registerModelsCommand(program: Command): void {
  program
    .command("models")
    .description("List installed models with their size and the memory they would need")
    .option("--json", "print a JSON array")
    .option(
      "--context <n>",
      "plan for this context size in tokens",
      intArg(1),
      ENGINE_DEFAULTS.context,
    )
    .option(
      "--expert-cache-slots <n>",
      `plan for this many experts per MoE layer (default: ${ENGINE_DEFAULTS.expertCacheSlots}, or what --memory-budget allows)`,
      intArg(0),
    )
    .option("--memory-budget <size>", "plan for a memory limit, e.g. 8G", parseByteSize)
    .addOption(
      new Option("--kv-dtype <type>", "KV cache precision")
        .choices(["f16", "f32"])
        .default(ENGINE_DEFAULTS.kvDtype),
    )
    .addOption(backendOption())
    .action(async (opts: ModelsOptions) => {
      const dir = modelsDir();
      const models = await listModels(dir);
      if (models.length === 0 && !opts.json) {
        process.stdout.write(
          `no models installed in ${dir}; \`redwing install ...\` installs one (the demo model is made on first use of chat or complete)\n`,
        );
        return;
      }
      const plans: PlanEvent[] = [];
      if (models.length > 0) {
        const client = await EngineClient.start({ restart: false });
        try {
          for (const m of models)
            plans.push(await client.plan({ model: m.dir, ...planSettings(opts) }));
        } finally {
          await client.close();
        }
      }
      if (opts.json) {
        const rows = models.map((m, i) => ({
          name: m.name,
          dir: m.dir,
          size_bytes: m.sizeBytes,
          memory_estimate_bytes: plans[i]!.total_bytes,
          memory_plan: planJson(plans[i]!),
          family: m.family,
          moe: m.moe,
          demo: m.isDemo,
          ...(m.isDemo ? { note: DEMO_LABEL } : {}),
        }));
        process.stdout.write(JSON.stringify(rows, null, 1) + "\n");
        return;
      }
      const width = Math.max(4, ...models.map((m) => m.name.length));
      process.stdout.write(
        `${"NAME".padEnd(width)}  ${"SIZE".padStart(10)}  ${"MEMORY".padStart(10)}  MODEL\n`,
      );
      models.forEach((m, i) => {
        const kind = `${m.family}${m.moe ? " MoE" : ""}${m.isDemo ? ` -- ${DEMO_LABEL}` : ""}`;
        const plan = plans[i]!;
        const memory = `${plan.over_budget !== null ? ">" : "~"}${formatBytes(plan.total_bytes)}`;
        process.stdout.write(
          `${m.name.padEnd(width)}  ${formatBytes(m.sizeBytes).padStart(10)}  ${memory.padStart(10)}  ${kind}\n`,
        );
      });
      const slots =
        opts.expertCacheSlots !== undefined || opts.memoryBudget === undefined
          ? `${opts.expertCacheSlots ?? ENGINE_DEFAULTS.expertCacheSlots} expert slots per MoE layer`
          : `the expert slots a ${formatBytes(opts.memoryBudget ?? 0)} budget allows`;
      process.stdout.write(
        `(in ${dir}; memory: the engine's plan with a ${opts.context}-token ${opts.kvDtype} KV cache, ${slots}, weights and working memory)\n`,
      );
    });
}
