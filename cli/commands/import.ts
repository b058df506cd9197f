import type { Command } from "commander";
import { redwingVersionLabel } from "../../core/version.ts";
import { importCheckpoint, type ImportProgress } from "../../core/import/importer.ts";
import { formatBytes } from "./install.ts";

const PHASES: Record<ImportProgress["phase"], string> = {
  hashing: "hashing source",
  tensors: "tensors",
  experts: "experts",
  finishing: "finishing",
};

/**
 * One progress line on stderr, rewritten in place on a terminal. When stderr is not a terminal
 * (a log file, a pipe), one line per phase instead.
 */
export function progressPrinter(stream: NodeJS.WriteStream = process.stderr): {
  update: (p: ImportProgress) => void;
  end: () => void;
} {
  const tty = stream.isTTY === true;
  let lastWrite = 0;
  let lastPhase = "";
  let width = 0;
  return {
    update(p) {
      const changed = p.phase !== lastPhase;
      lastPhase = p.phase;
      if (!tty) {
        if (changed) stream.write(`import: ${PHASES[p.phase]}\n`);
        return;
      }
      const now = Date.now();
      if (!changed && now - lastWrite < 100 && p.done < p.total) return;
      lastWrite = now;
      const pct = p.total > 0 ? ` ${Math.min(100, (100 * p.done) / p.total).toFixed(0)}%` : "";
      const amount =
        p.total === 0
          ? ""
          : p.phase === "experts"
            ? ` ${p.done}/${p.total}`
            : ` ${formatBytes(p.done)}/${formatBytes(p.total)}`;
      const line = `import: ${PHASES[p.phase]}${pct}${amount} ${p.item}`;
      const shown = line.slice(0, (stream.columns ?? 100) - 1);
      stream.write(`\r${shown.padEnd(width)}`);
      width = shown.length;
    },
    end() {
      if (tty && width > 0) stream.write(`\r${" ".repeat(width)}\r`);
      width = 0;
    },
  };
}

export function registerImportCommand(program: Command): void {
  program
    .command("import")
    .description(
      "Import a Gemma 4 / Gemma 3 checkpoint (MLX 4/8-bit or bf16/f16/f32 safetensors) into a Redwing model directory",
    )
    .argument("<checkpoint-dir>", "directory with config.json and *.safetensors")
    .requiredOption("--out <model-dir>", "where to create the model directory")
    .option("--force", "replace an existing model at --out")
    .option("--repo <id>", "hub repository the checkpoint came from (recorded in the manifest)")
    .option("--revision <rev>", "revision of that repository (recorded in the manifest)")
    .action(
      async (
        checkpointDir: string,
        opts: { out: string; force?: boolean; repo?: string; revision?: string },
      ) => {
        const printer = progressPrinter();
        const controller = new AbortController();
        // First Ctrl-C: stop cleanly and remove the partial directory; a second one kills.
        const onSigint = (): void => controller.abort();
        process.once("SIGINT", onSigint);
        try {
          const started = Date.now();
          const { dir, manifest } = await importCheckpoint(checkpointDir, opts.out, {
            force: opts.force ?? false,
            repo: opts.repo ?? null,
            revision: opts.revision ?? null,
            onProgress: printer.update,
            signal: controller.signal,
            createdBy: redwingVersionLabel(),
          });
          printer.end();
          const bytes = manifest.files.reduce((a, f) => a + f.size, 0);
          const seconds = ((Date.now() - started) / 1000).toFixed(1);
          process.stdout.write(
            `imported ${manifest.architecture.family} (${manifest.source.kind}, ${manifest.architecture.num_layers} layers${manifest.architecture.moe ? `, ${manifest.architecture.moe.num_experts} experts` : ""}) into ${dir}: ${manifest.files.length} files, ${formatBytes(bytes)} in ${seconds} s\n`,
          );
        } catch (error) {
          printer.end();
          throw error;
        } finally {
          process.removeListener("SIGINT", onSigint);
        }
      },
    );
}
