import { ensureDemoModel } from "../../core/demo/demo.ts";
import { redwingVersionLabel } from "../../core/version.ts";
import type { Command } from "commander";
import { join } from "node:path";
import { CATALOG, resolveModelRef, type CatalogEntry } from "../../core/catalog/catalog.ts";
import { UserError } from "../../core/errors.ts";
import {
  discardPartial,
  hasPartial,
  startInstall,
  type InstallPhase,
  type InstallProgress,
} from "../../core/install/installer.ts";
import { modelsDir } from "../../core/paths.ts";
import { formatBytes } from "../../core/units.ts";

/** Sizes in the one unit family of the app and the CLI (core/units.ts). */
export { formatBytes };

function formatDuration(seconds: number): string {
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, "0");
  return h > 0 ? `${h}:${String(m).padStart(2, "0")}:${ss}` : `${m}:${ss}`;
}

const PHASES: Record<InstallPhase, string> = {
  resolving: "resolving",
  planning: "reading headers",
  verifying: "verifying earlier download",
  downloading: "downloading",
  paused: "paused",
  finishing: "finishing",
  done: "done",
};

/** The progress line: `[#####-----] 48% 1.13 GiB/2.35 GiB 81.3 MiB/s ETA 0:15 file`. */
export function progressLine(p: InstallProgress, width = 100): string {
  const parts = [`install: ${PHASES[p.phase]}`];
  if (p.bytesTotal > 0) {
    const frac = Math.min(1, p.bytesDone / p.bytesTotal);
    const cells = 20;
    const full = Math.round(frac * cells);
    parts.push(`[${"#".repeat(full)}${"-".repeat(cells - full)}] ${(frac * 100).toFixed(0)}%`);
    parts.push(`${formatBytes(p.bytesDone)}/${formatBytes(p.bytesTotal)}`);
  }
  if (p.rate !== null) parts.push(`${formatBytes(p.rate)}/s`);
  if (p.etaSeconds !== null && p.phase === "downloading")
    parts.push(`ETA ${formatDuration(p.etaSeconds)}`);
  if (p.file) parts.push(p.file);
  return parts.join(" ").slice(0, Math.max(20, width - 1));
}

/**
 * A progress bar rewritten in place on a terminal; notes go on their own lines above it. When
 * stderr is not a terminal: one line per phase, every 10% of the download, and the notes.
 */
export function installPrinter(stream: NodeJS.WriteStream = process.stderr): {
  update: (p: InstallProgress) => void;
  end: () => void;
} {
  const tty = stream.isTTY === true;
  let shown = 0;
  let lastPhase = "";
  let lastTenth = -1;
  let lastWrite = 0;
  const clear = (): void => {
    if (tty && shown > 0) stream.write(`\r${" ".repeat(shown)}\r`);
    shown = 0;
  };
  return {
    update(p) {
      if (p.note !== undefined) {
        clear();
        stream.write(`install: ${p.note}\n`);
      }
      const changed = p.phase !== lastPhase;
      lastPhase = p.phase;
      if (!tty) {
        const tenth = p.bytesTotal > 0 ? Math.floor((10 * p.bytesDone) / p.bytesTotal) : -1;
        if (changed) {
          stream.write(`install: ${PHASES[p.phase]}\n`);
          lastTenth = tenth;
        } else if (p.phase === "downloading" && tenth > lastTenth) {
          lastTenth = tenth;
          stream.write(`${progressLine(p)}\n`);
        }
        return;
      }
      const now = Date.now();
      if (!changed && p.note === undefined && now - lastWrite < 100) return;
      lastWrite = now;
      const line = progressLine(p, stream.columns || 100);
      stream.write(`\r${line.padEnd(shown)}`);
      shown = line.length;
    },
    end: clear,
  };
}

function describeEntry(entry: CatalogEntry): string {
  const size = (s: { bytes: number; approx: boolean }): string =>
    `${s.approx ? "~" : ""}${formatBytes(s.bytes)}`;
  const lines = [`${entry.title}`];
  if (entry.kind === "hub") {
    lines.push(
      `  from ${entry.repo}${entry.revision ? `@${entry.revision.slice(0, 12)}` : ` (${entry.branch}, resolved at install)`}`,
      `  download ${size(entry.download)}, install ${size(entry.install)}, memory ${size(entry.memory)} (${entry.memoryNote})`,
    );
  }
  lines.push(`  licence: ${entry.licence.name} (${entry.licence.url}). ${entry.licence.note}`);
  return lines.join("\n");
}

export function registerInstallCommand(program: Command): void {
  program
    .command("install")
    .description(
      "Download a model from Hugging Face (or the HF_ENDPOINT mirror) into the models directory: resumable, verified, converted on the way",
    )
    .argument("[model]", "a catalog name (see --list) or a hub repository owner/name[@revision]")
    .option("--out <dir>", "model directory (default: <models dir>/<name>)")
    .option("--force", "replace a model already installed there")
    .option("--discard-partial", "remove the partial download of an interrupted install, then stop")
    .option(
      "--ranges-only",
      "fetch only the tensors Redwing uses (skip vision/audio bytes); shards holding skipped tensors then go without a whole-file SHA-256 check",
    )
    .option("--list", "list the models in the catalog")
    .action(
      async (
        model: string | undefined,
        opts: {
          out?: string;
          force?: boolean;
          discardPartial?: boolean;
          rangesOnly?: boolean;
          list?: boolean;
        },
      ) => {
        if (opts.list) {
          for (const e of CATALOG) process.stdout.write(`${e.id}\n${describeEntry(e)}\n\n`);
          return;
        }
        if (model === undefined) {
          throw new UserError(
            "name a model to install: a catalog name (redwing install --list) or owner/name[@revision]",
            "bad_model_ref",
          );
        }
        const ref = resolveModelRef(model);
        const dest = opts.out ?? join(modelsDir(), ref.dirName);
        if (opts.discardPartial) {
          const removed = await discardPartial(dest);
          process.stdout.write(
            removed.length > 0
              ? `removed the partial install of ${dest} (${removed.join(", ")})\n`
              : `there is no partial install of ${dest}\n`,
          );
          return;
        }
        if (ref.entry?.kind === "demo") {
          // The demo is made on this machine, not downloaded.
          const dir = await ensureDemoModel(opts.out, () =>
            process.stderr.write("install: making the demo model (random weights)...\n"),
          );
          process.stdout.write(`the demo model is installed in ${dir}\n`);
          return;
        }
        if (ref.repo === null) {
          throw new UserError(`${model} names no Hugging Face repository`, "bad_model_ref");
        }
        const printer = installPrinter();
        if (ref.entry) process.stderr.write(`${describeEntry(ref.entry)}\n`);
        if (await hasPartial(dest)) process.stderr.write(`install: resuming into ${dest}\n`);
        const task = startInstall(
          { repo: ref.repo, revision: ref.revision, dest },
          {
            force: opts.force ?? false,
            verify: opts.rangesOnly ? "ranges" : "full",
            createdBy: redwingVersionLabel(),
            onProgress: printer.update,
          },
        );
        // First Ctrl-C: stop cleanly and keep the partial download; a second one kills.
        const onSigint = (): void => task.cancel();
        process.once("SIGINT", onSigint);
        try {
          const r = await task.result;
          printer.end();
          const m = r.manifest;
          const bytes = m.files.reduce((a, f) => a + f.size, 0);
          const rate = r.seconds > 0 ? r.fetchedBytes / r.seconds : 0;
          const checked =
            r.uncheckedShards.length === 0
              ? `every shard's SHA-256 matched the hub`
              : `${r.verifiedShards.length} of ${r.verifiedShards.length + r.uncheckedShards.length} shards checked against their SHA-256 (--ranges-only)`;
          process.stdout.write(
            `installed ${m.architecture.family} (${m.source.kind}, commit ${r.commit.slice(0, 12)}) into ${r.dir}: ${m.files.length} files, ${formatBytes(bytes)}; fetched ${formatBytes(r.fetchedBytes)}${r.reusedBytes > 0 ? ` (${formatBytes(r.reusedBytes)} reused)` : ""} in ${r.seconds.toFixed(1)} s (${formatBytes(rate)}/s); ${checked}\n`,
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
