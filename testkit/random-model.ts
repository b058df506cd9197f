/**
 * A small random-weight model for tests that need more than the trained demo model offers: a
 * real 262k-entry tokenizer, a reply that runs to the token limit, or a chat template of the
 * test's choosing. It has the previous demo model's shape (core/synth preset "demo-gemma4-moe")
 * with Gemma 3's published tokenizer files unless the test brings its own.
 */
import type { Manifest } from "../core/format/manifest.ts";
import { gemma3TokenizerFiles } from "../core/models/gemma3.ts";
import { synthesizeModel } from "../core/synth/synth.ts";

export interface RandomModelOptions {
  /** The weights' seed: the same seed gives the same bytes. */
  seed: number;
  /**
   * Scales the post-attention and post-feedforward norms (core/synth): 4 makes the text vary
   * instead of repeating the prompt's last token. Default 1.
   */
  postNormScale?: number;
  /** The manifest's `created_by` (default "redwing synth"). */
  createdBy?: string;
  /** tokenizer.json to ship instead of Gemma 3's. */
  tokenizer?: string;
  /** tokenizer_config.json to ship instead of Gemma 3's (which carries a chat template). */
  tokenizerConfig?: string;
  /** chat_template.jinja to ship next to them (none by default). */
  chatTemplate?: string;
}

/** Writes the model into `dir` (a models directory's `<models>/<name>` to install it). */
export async function writeRandomModel(
  dir: string,
  options: RandomModelOptions,
): Promise<Manifest> {
  const gemma3 = gemma3TokenizerFiles();
  return synthesizeModel({
    preset: "demo-gemma4-moe",
    out: dir,
    seed: options.seed,
    postNormScale: options.postNormScale,
    createdBy: options.createdBy,
    files: {
      "tokenizer.json": options.tokenizer ?? gemma3.tokenizer,
      "tokenizer_config.json": options.tokenizerConfig ?? gemma3.config,
      ...(options.chatTemplate !== undefined
        ? { "chat_template.jinja": options.chatTemplate }
        : {}),
    },
  });
}
