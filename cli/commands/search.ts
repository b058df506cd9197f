import { totalmem } from "node:os";
import { join } from "node:path";
import { type Command } from "commander";
import { formatBytes } from "../../core/chat/stats.ts";
import { ENGINE_DEFAULTS } from "../../core/defaults.ts";
import { EngineClient } from "../../core/engine/index.ts";
import {
  DEFAULT_SEARCH_LIMIT,
  MAX_SEARCH_LIMIT,
  discoverModels,
  type DiscoveredModel,
} from "../../core/install/discover.ts";
import { writeSkeleton } from "../../core/install/plan-skeleton.ts";
import { dataDir } from "../../core/paths.ts";
import { intArg } from "./chat.ts";

interface SearchOptions {
  json?: boolean;
  limit: number;
  context: number;
}

function runs(m: DiscoveredModel): string {
  if (m.status === "runnable") return "yes";
  return m.status === "unsupported" ? "no" : "?";
}

/**
 * `redwing search <query>`: the hub's models matching `query`, most downloaded first, with
 * whether Redwing runs each (and why not), its download size and the engine's memory plan at
 * the default settings (the figure `redwing models` prints once it is installed).
 */
export function registerSearchCommand(program: Command): void {
  program
    .command("search")
    .description("Search the hub (HF_ENDPOINT) for models and say which Redwing can run")
    .argument("<query>", "words in the repository name, e.g. gemma-3")
    .option("--json", "print the results as JSON")
    .option(
      "--limit <n>",
      `results to ask for (at most ${MAX_SEARCH_LIMIT})`,
      intArg(1),
      DEFAULT_SEARCH_LIMIT,
    )
    .option(
      "--context <n>",
      "plan memory for this context size in tokens",
      intArg(1),
      ENGINE_DEFAULTS.context,
    )
    .action(async (query: string, opts: SearchOptions) => {
      let client: EngineClient | null = null;
      const skeletons = join(dataDir(), "plan-skeletons");
      try {
        const found = await discoverModels(query, {
          limit: Math.min(opts.limit, MAX_SEARCH_LIMIT),
          totalMemoryBytes: totalmem(),
          concurrency: 4,
          planMemory: async (manifest) => {
            client ??= await EngineClient.start({ restart: false });
            const plan = await client.plan({
              model: await writeSkeleton(skeletons, manifest),
              context: opts.context,
              kv_dtype: ENGINE_DEFAULTS.kvDtype,
              expert_cache_slots: ENGINE_DEFAULTS.expertCacheSlots,
            });
            return plan.total_bytes;
          },
        });
        if (opts.json) {
          process.stdout.write(JSON.stringify(found, null, 1) + "\n");
          return;
        }
        if (found.models.length === 0) {
          process.stdout.write(`no models on ${found.endpoint} match "${found.query}"\n`);
          return;
        }
        const width = Math.max(4, ...found.models.map((m) => m.repo.length));
        process.stdout.write(
          `${"REPO".padEnd(width)}  RUNS  ${"DOWNLOAD".padStart(9)}  ${"MEMORY".padStart(9)}  FITS  LICENCE\n`,
        );
        for (const m of found.models) {
          const size = m.downloadBytes === null ? "-" : formatBytes(m.downloadBytes);
          const memory = m.memoryBytes === null ? "-" : formatBytes(m.memoryBytes);
          const fits = m.fits === null ? "-" : m.fits ? "yes" : "no";
          const licence = `${m.licence.name ?? m.licence.id ?? "-"}${m.gated ? " (gated)" : ""}`;
          process.stdout.write(
            `${m.repo.padEnd(width)}  ${runs(m).padEnd(4)}  ${size.padStart(9)}  ${memory.padStart(9)}  ${fits.padEnd(4)}  ${licence}\n`,
          );
          if (m.reason) process.stdout.write(`${" ".repeat(width)}  ${m.reason}\n`);
        }
        process.stdout.write(
          `(${found.endpoint}; memory: the engine's plan with a ${opts.context}-token KV cache and ${ENGINE_DEFAULTS.expertCacheSlots} expert slots per MoE layer; install with \`redwing install <repo>\`${found.tokenSet ? "" : "; gated models need HF_TOKEN"})\n`,
        );
      } finally {
        await (client as EngineClient | null)?.close();
      }
    });
}
