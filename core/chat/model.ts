/**
 * Finding a model for the chat commands: a name in the models directory, a path, or (by default)
 * the built-in demo model, made on first use. Also the `models` listing (the memory figures come
 * from the engine's plan: cli/commands/models.ts).
 */
import { stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import { DEMO_MODEL_NAME, ensureDemoModel, isDemoCreatedBy } from "../demo/demo.ts";
import { UserError } from "../errors.ts";
import type { Manifest } from "../format/manifest.ts";
import { modelDirNames, readModelDir } from "../format/read.ts";
import { modelsDir } from "../paths.ts";

export interface ResolvedModel {
  dir: string;
  manifest: Manifest;
  isDemo: boolean;
}

async function isDir(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isDirectory();
  } catch {
    return false;
  }
}

/**
 * `arg` undefined or "demo": the demo model (created on first use, `onCreateDemo` called first);
 * a path (contains a separator or names an existing directory): that directory; otherwise the
 * installed model of that name.
 */
export async function resolveModel(
  arg: string | undefined,
  onCreateDemo?: () => void,
): Promise<ResolvedModel> {
  let dir: string;
  if (arg === undefined || arg === DEMO_MODEL_NAME) {
    dir = await ensureDemoModel(join(modelsDir(), DEMO_MODEL_NAME), onCreateDemo);
  } else if (arg.includes("/") || arg.includes("\\") || (await isDir(arg))) {
    dir = resolve(arg);
  } else {
    dir = join(modelsDir(), arg);
    if (!(await isDir(dir))) {
      const names = (await listModels()).map((m) => m.name);
      throw new UserError(
        `no model named "${arg}" in ${modelsDir()}; installed: ${names.length ? names.join(", ") : "none"} ` +
          "(install one with `redwing install ...`, or pass a model directory)",
        "model_not_found",
      );
    }
  }
  const { manifest } = await readModelDir(dir);
  return { dir, manifest, isDemo: isDemoCreatedBy(manifest.created_by) };
}

export interface ModelInfo {
  name: string;
  dir: string;
  /** Bytes of all files of the model. */
  sizeBytes: number;
  family: string;
  moe: boolean;
  isDemo: boolean;
}

/** Installed models (directories with a readable manifest), sorted by name. */
export async function listModels(dir: string = modelsDir()): Promise<ModelInfo[]> {
  const out: ModelInfo[] = [];
  for (const name of await modelDirNames(dir)) {
    let manifest: Manifest;
    try {
      manifest = (await readModelDir(join(dir, name))).manifest;
    } catch {
      continue; // not an installed model (no manifest, or damaged: `redwing verify` says why)
    }
    out.push({
      name,
      dir: join(dir, name),
      sizeBytes: manifest.files.reduce((s, f) => s + f.size, 0),
      family: manifest.architecture.family,
      moe: manifest.architecture.moe !== null,
      isDemo: isDemoCreatedBy(manifest.created_by),
    });
  }
  return out;
}
