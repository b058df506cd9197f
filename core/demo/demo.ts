/**
 * The built-in demo model: a tiny Gemma 4 MoE chat model (24M parameters, 6 layers, 32 experts,
 * top 4, a 4096-entry byte-level BPE vocabulary) that we trained on public-domain text (the King
 * James Bible and Debian's fortune cookies; recipe and model card in demo-model/). It ships in
 * the repository in the runtime format (demo-model/model, made by `redwing import` from the
 * trained 4-bit checkpoint) and is copied into the models directory on first use, so every
 * command works offline on a fresh machine and the first reply is real text.
 *
 * Random-weight models of any shape (tests, benchmarks) come from core/synth instead.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { modelsDir } from "../paths.ts";
import { exists } from "../fs.ts";
import { moveIntoPlace } from "../format/writer.ts";
import { partialDirName } from "../format/paths.ts";

export const DEMO_MODEL_NAME = "demo";

/** Shown wherever the demo appears (model lists, the CLI banner, the manifest). */
export const DEMO_LABEL =
  "tiny demo model trained on public-domain text (the King James Bible and fortune cookies): " +
  "it quotes verses and tells fortunes; install a real model with `redwing install ...`";

/**
 * `created_by` of the installed demo's manifest: marks the directory as the demo wherever it is
 * listed. The version changes whenever the shipped model changes, so an old demo is replaced
 * (version 1 was a random-weight model).
 */
const DEMO_VERSION = 2;
export const DEMO_CREATED_BY = `redwing demo v${DEMO_VERSION} (${DEMO_LABEL})`;

/** The shipped demo model (runtime format) in the checkout, or in the packaged app. */
export function shippedDemoDir(): string {
  return fileURLToPath(new URL("../../demo-model/model", import.meta.url));
}

/** Files of the demo's recipe beside the model: the reference values and the held-out text. */
export function demoRecipeFile(name: "reference.json" | "heldout.txt" | "training.json"): string {
  return fileURLToPath(new URL(`../../demo-model/${name}`, import.meta.url));
}

/** True when a manifest's `created_by` says the model is the demo. */
export function isDemoCreatedBy(createdBy: string): boolean {
  return createdBy.startsWith("redwing demo");
}

/** The `created_by` of the model in `dir`, or null when there is none (or it is unreadable). */
async function createdBy(dir: string): Promise<string | null> {
  try {
    const m = JSON.parse(await readFile(join(dir, "manifest.json"), "utf8")) as {
      created_by?: unknown;
    };
    return typeof m.created_by === "string" ? m.created_by : null;
  } catch {
    return null;
  }
}

/** Every file under `dir`, as `/`-separated paths relative to it. */
async function listFiles(dir: string, prefix = ""): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(join(dir, prefix), { withFileTypes: true })) {
    const rel = prefix ? `${prefix}/${entry.name}` : entry.name;
    if (entry.isDirectory()) out.push(...(await listFiles(dir, rel)));
    else if (entry.isFile()) out.push(rel);
  }
  return out.sort();
}

/**
 * Copies the shipped demo into a new directory beside `dir` and moves it into place (an old demo
 * is moved aside first and removed after). The manifest's `created_by` is set to
 * DEMO_CREATED_BY; every other byte is the shipped one (the manifest hashes the files, not
 * itself). readFile/writeFile rather than copyFile: they also read from the packaged app.asar.
 */
async function installShippedDemo(dir: string): Promise<void> {
  const source = shippedDemoDir();
  const parent = dirname(dir);
  await mkdir(parent, { recursive: true });
  const partial = join(
    parent,
    partialDirName(basename(dir), process.pid, randomBytes(6).toString("hex")),
  );
  try {
    for (const rel of await listFiles(source)) {
      const to = join(partial, ...rel.split("/"));
      await mkdir(dirname(to), { recursive: true });
      if (rel === "manifest.json") {
        const manifest = JSON.parse(await readFile(join(source, rel), "utf8")) as Record<
          string,
          unknown
        >;
        manifest.created_by = DEMO_CREATED_BY;
        await writeFile(to, JSON.stringify(manifest, null, 1) + "\n");
      } else {
        await writeFile(to, await readFile(join(source, rel)));
      }
    }
    // Replaces an old demo or an empty directory; nothing else.
    await moveIntoPlace(partial, dir, true, false);
  } finally {
    await rm(partial, { recursive: true, force: true });
  }
}

/**
 * Installs the demo model in `dir` (default `<models dir>/demo`) unless a model is already
 * installed there, and returns the directory. Safe against a concurrent first use: when another
 * process installs it first, that copy is used.
 */
export async function ensureDemoModel(
  dir: string = join(modelsDir(), DEMO_MODEL_NAME),
  onCreate?: () => void,
): Promise<string> {
  if (await exists(join(dir, "manifest.json"))) {
    const by = await createdBy(dir);
    // Keep the current demo, and anything that is not a demo (a model the user named "demo");
    // replace a demo from another version.
    if (by === DEMO_CREATED_BY || by === null || !isDemoCreatedBy(by)) return dir;
  }
  onCreate?.();
  if (!(await stat(shippedDemoDir()).catch(() => null))) {
    throw new Error(`the shipped demo model is missing: ${shippedDemoDir()}`);
  }
  try {
    await installShippedDemo(dir);
  } catch (error) {
    if ((await createdBy(dir)) === DEMO_CREATED_BY) return dir; // another process won the race
    throw error;
  }
  return dir;
}
