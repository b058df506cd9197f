/**
 * A random-weight model for the specs that need a reply longer than the trained demo model
 * gives (streaming in several steps, stopping mid-answer): testkit/random-model.ts (the previous
 * demo model's shape, Gemma 3's tokenizer and template), which writes until the token limit.
 * Written into the app's models directory and loaded, like an installed model.
 */
import { join } from "node:path";
import { writeRandomModel } from "../testkit/random-model.ts";
import type { RedwingApp } from "./fixtures.ts";
import { waitReady } from "./ui.ts";

export const RANDOM_MODEL = "random-words";

export async function loadRandomModel(app: RedwingApp, name = RANDOM_MODEL): Promise<void> {
  await writeRandomModel(join(app.home, "models", name), {
    seed: 20261129,
    postNormScale: 4,
    createdBy: "e2e random-weight model",
  });
  await app.call("engine.load", { model: name });
  await waitReady(app.page, name);
}
