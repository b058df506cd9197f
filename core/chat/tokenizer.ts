/**
 * The model's tokenizer, built from its own `tokenizer.json` (and `tokenizer_config.json`) with
 * @huggingface/tokenizers. Gemma's tokenizer is a BPE over whole characters with `▁` for spaces
 * and `<0xXX>` byte fallback; special tokens (`<bos>`, `<start_of_turn>`, `<|turn>`, ...) in the
 * text are matched as single tokens, so a rendered chat template tokenizes to the right ids.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { UserError } from "../errors.ts";

export interface EncodeOptions {
  /** Prepend the BOS token (when the text does not start with it already). Default false. */
  addBos?: boolean;
}

export interface DecodeOptions {
  /** Leave special tokens (`<eos>`, `<end_of_turn>`, ...) out of the text. Default true. */
  skipSpecial?: boolean;
}

interface AddedTokenJson {
  id: number;
  content: string;
  special?: boolean;
}

/** A loaded tokenizer plus the bits of tokenizer_config.json the chat side needs. */
export class ChatTokenizer {
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  readonly bosId: number | null;
  /** Number of token ids (vocabulary plus added tokens); ids are 0 .. size - 1. */
  readonly size: number;
  /** The chat template from tokenizer_config.json, when it has one. */
  readonly configTemplate: string | null;
  private readonly specialIds: Set<number>;

  constructor(
    private readonly tokenizer: Tokenizer,
    tokenizerJson: { added_tokens?: AddedTokenJson[]; model: { vocab: unknown } },
    config: Record<string, unknown>,
  ) {
    const added = tokenizerJson.added_tokens ?? [];
    this.specialIds = new Set(added.filter((t) => t.special).map((t) => t.id));
    const vocab = tokenizerJson.model.vocab;
    const vocabSize = Array.isArray(vocab)
      ? vocab.length
      : Object.keys(vocab as Record<string, number>).length;
    this.size = Math.max(vocabSize, ...added.map((t) => t.id + 1));
    this.bosToken = tokenString(config.bos_token);
    this.eosToken = tokenString(config.eos_token);
    this.bosId = this.bosToken === null ? null : (tokenizer.token_to_id(this.bosToken) ?? null);
    this.configTemplate = typeof config.chat_template === "string" ? config.chat_template : null;
  }

  /** Token ids of `text`; special-token strings inside it become their single ids. */
  encode(text: string, options: EncodeOptions = {}): number[] {
    const ids = this.tokenizer.encode(text, { add_special_tokens: false }).ids;
    if (options.addBos && this.bosId !== null && ids[0] !== this.bosId) ids.unshift(this.bosId);
    return ids;
  }

  decode(ids: readonly number[], options: DecodeOptions = {}): string {
    if (ids.length === 0) return ""; // the library rejects an empty list
    return this.tokenizer.decode([...ids], {
      skip_special_tokens: options.skipSpecial ?? true,
      clean_up_tokenization_spaces: false,
    });
  }

  /** The id of a token string (e.g. "<end_of_turn>"), or null when the vocabulary lacks it. */
  tokenId(token: string): number | null {
    return this.tokenizer.token_to_id(token) ?? null;
  }

  isSpecial(id: number): boolean {
    return this.specialIds.has(id);
  }
}

/** tokenizer_config.json gives special tokens as strings or as {content: ...} objects. */
function tokenString(value: unknown): string | null {
  if (typeof value === "string") return value;
  if (
    value &&
    typeof value === "object" &&
    typeof (value as { content?: unknown }).content === "string"
  ) {
    return (value as { content: string }).content;
  }
  return null;
}

async function readJson(path: string, required: boolean): Promise<Record<string, unknown> | null> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (error) {
    if (!required && (error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw new UserError(
      `cannot read ${path}: ${(error as Error).message}`,
      required ? "tokenizer_missing" : "tokenizer_invalid",
    );
  }
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (error) {
    throw new UserError(
      `${path} is not valid JSON: ${(error as Error).message}`,
      "tokenizer_invalid",
    );
  }
}

/** Loads `tokenizer.json` (required) and `tokenizer_config.json` (optional) from a model directory. */
export async function loadTokenizer(modelDir: string): Promise<ChatTokenizer> {
  const tokenizerPath = join(modelDir, "tokenizer.json");
  const json = await readJson(tokenizerPath, true);
  const config = (await readJson(join(modelDir, "tokenizer_config.json"), false)) ?? {};
  if (!json || typeof json.model !== "object" || json.model === null) {
    throw new UserError(`${tokenizerPath} has no "model" section`, "tokenizer_invalid");
  }
  let tokenizer: Tokenizer;
  try {
    tokenizer = new Tokenizer(json, config);
  } catch (error) {
    throw new UserError(
      `cannot build the tokenizer from ${tokenizerPath}: ${(error as Error).message}`,
      "tokenizer_invalid",
    );
  }
  return new ChatTokenizer(
    tokenizer,
    json as unknown as ConstructorParameters<typeof ChatTokenizer>[1],
    config,
  );
}
