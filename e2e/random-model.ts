/**
 * A random-weight model for the specs that need a reply longer than the trained demo model
 * gives (streaming in several steps, stopping mid-answer): it has the previous demo model's shape
 * (core/synth preset "demo-gemma4-moe", Gemma 3's tokenizer and template) and writes until the
 * token limit. Written into the app's models directory and loaded, like an installed model.
 */
import { join } from "node:path";
import { gemma3TokenizerFiles } from "../core/models/gemma3.ts";
import { synthesizeModel } from "../core/synth/synth.ts";
import type { RedwingApp } from "./fixtures.ts";
import { waitReady } from "./ui.ts";

export const RANDOM_MODEL = "random-words";

export async function loadRandomModel(app: RedwingApp): Promise<void> {
  const files = gemma3TokenizerFiles();
  await synthesizeModel({
    preset: "demo-gemma4-moe",
    out: join(app.home, "models", RANDOM_MODEL),
    seed: 20261129,
    // Makes the text vary instead of repeating the prompt's last token.
    postNormScale: 4,
    createdBy: "e2e random-weight model",
    files: { "tokenizer.json": files.tokenizer, "tokenizer_config.json": files.config },
  });
  await app.call("engine.load", { model: RANDOM_MODEL });
  await waitReady(app.page, RANDOM_MODEL);
}
