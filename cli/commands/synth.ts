import { InvalidArgumentError, type Command } from "commander";
import { UserError } from "../../core/errors.ts";
import { synthesizeModel } from "../../core/synth/synth.ts";
import { SYNTH_PRESETS, isSynthPreset } from "../../core/synth/presets.ts";
import { formatBytes } from "../../core/units.ts";

function positiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError("expected a positive integer");
  return n;
}

/** `redwing synth`: a random-weight model with a real model's shapes (benchmarks, tests). */
export function registerSynthCommand(program: Command): void {
  program
    .command("synth")
    .description("write a random-weight model with a real model's shapes in the runtime format")
    .requiredOption("--preset <name>", `one of: ${Object.keys(SYNTH_PRESETS).join(", ")}`)
    .requiredOption("--out <dir>", "model directory to create")
    .option("--layers <n>", "keep only the first N layers", positiveInt)
    .option("--seed <n>", "random seed", positiveInt)
    .option("--force", "replace an existing model at --out")
    .action(
      async (opts: {
        preset: string;
        out: string;
        layers?: number;
        seed?: number;
        force?: boolean;
      }) => {
        if (!isSynthPreset(opts.preset)) {
          throw new UserError(
            `unknown preset "${opts.preset}"; known: ${Object.keys(SYNTH_PRESETS).join(", ")}`,
          );
        }
        let lastPct = -1;
        const manifest = await synthesizeModel({
          preset: opts.preset,
          out: opts.out,
          layers: opts.layers,
          seed: opts.seed,
          force: opts.force,
          onProgress: (done, total) => {
            const pct = Math.floor((100 * done) / total);
            if (pct !== lastPct && pct % 10 === 0) process.stderr.write(`synth: ${pct}%\n`);
            lastPct = pct;
          },
        });
        const bytes = manifest.files.reduce((sum, f) => sum + f.size, 0);
        process.stderr.write(
          `synth: wrote ${opts.out} (${manifest.architecture.num_layers} layers, ${formatBytes(bytes)})\n`,
        );
      },
    );
}
