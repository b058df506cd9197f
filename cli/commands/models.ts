import type { Command } from "commander";
import { listModels } from "../../core/chat/model.ts";
import { formatBytes } from "../../core/chat/stats.ts";
import { ENGINE_DEFAULTS } from "../../core/defaults.ts";
import { DEMO_LABEL } from "../../core/demo/demo.ts";
import { modelsDir } from "../../core/paths.ts";

/** `redwing models`: the installed models with their size and a memory estimate. */
export function registerModelsCommand(program: Command): void {
  program
    .command("models")
    .description("List installed models with their size and a memory estimate")
    .option("--json", "print a JSON array")
    .action(async (opts: { json?: boolean }) => {
      const dir = modelsDir();
      const models = await listModels(dir);
      if (opts.json) {
        const rows = models.map((m) => ({
          name: m.name,
          dir: m.dir,
          size_bytes: m.sizeBytes,
          memory_estimate_bytes: m.memoryEstimateBytes,
          family: m.family,
          moe: m.moe,
          demo: m.isDemo,
          ...(m.isDemo ? { note: DEMO_LABEL } : {}),
        }));
        process.stdout.write(JSON.stringify(rows, null, 1) + "\n");
        return;
      }
      if (models.length === 0) {
        process.stdout.write(
          `no models installed in ${dir}; \`redwing install ...\` installs one (the demo model is made on first use of chat or complete)\n`,
        );
        return;
      }
      const width = Math.max(4, ...models.map((m) => m.name.length));
      process.stdout.write(
        `${"NAME".padEnd(width)}  ${"SIZE".padStart(10)}  ${"MEMORY".padStart(10)}  MODEL\n`,
      );
      for (const m of models) {
        const kind = `${m.family}${m.moe ? " MoE" : ""}${m.isDemo ? ` -- ${DEMO_LABEL}` : ""}`;
        process.stdout.write(
          `${m.name.padEnd(width)}  ${formatBytes(m.sizeBytes).padStart(10)}  ${`~${formatBytes(m.memoryEstimateBytes)}`.padStart(10)}  ${kind}\n`,
        );
      }
      process.stdout.write(
        `(in ${dir}; memory: resident weights, ${ENGINE_DEFAULTS.expertCacheSlots} cached experts per MoE layer and a ${ENGINE_DEFAULTS.context}-token KV cache)\n`,
      );
    });
}
