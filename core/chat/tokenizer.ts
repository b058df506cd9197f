/**
 * The model's tokenizer, built from its own `tokenizer.json` (and `tokenizer_config.json`) with
 * @huggingface/tokenizers. Gemma's tokenizer is a BPE over whole characters with `▁` for spaces
 * and `<0xXX>` byte fallback; special tokens (`<bos>`, `<start_of_turn>`, `<|turn>`, ...) in the
 * text are matched as single tokens, so a rendered chat template tokenizes to the right ids.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
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
  /**
   * The longest text, in UTF-16 code units, that one token stands for: the longest vocabulary or
   * added-token string (a vocabulary string is never shorter than the text it covers: `▁` is one
   * space, a byte-level symbol one byte). It bounds a prompt's length before tokenizing it.
   */
  readonly maxTokenChars: number;
  private readonly specialIds: Set<number>;
  private worker: TokenizeWorker | null = null;

  constructor(
    private readonly tokenizer: Tokenizer,
    tokenizerJson: { added_tokens?: AddedTokenJson[]; model: { vocab: unknown } },
    config: Record<string, unknown>,
    /** Where the tokenizer came from, so that a worker thread can load it too (encodeAsync). */
    private readonly source: TokenizerSource | null = null,
  ) {
    const added = tokenizerJson.added_tokens ?? [];
    this.specialIds = new Set(added.filter((t) => t.special).map((t) => t.id));
    const vocab = tokenizerJson.model.vocab;
    const strings: unknown[] = Array.isArray(vocab)
      ? vocab.map((entry) => (Array.isArray(entry) ? entry[0] : entry))
      : Object.keys(vocab as Record<string, number>);
    let longest = 1;
    for (const t of [...strings, ...added.map((a) => a.content)]) {
      if (typeof t === "string" && t.length > longest) longest = t.length;
    }
    this.maxTokenChars = longest;
    this.size = Math.max(strings.length, ...added.map((t) => t.id + 1));
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

  /**
   * The most characters a text can have and still fit in `tokens` tokens, with a factor of 2 to
   * spare for normalizers that shorten text. A longer text is refused before tokenizing it, so
   * that a huge prompt costs a length check, not seconds of tokenization.
   */
  maxCharsFor(tokens: number): number {
    return tokens * this.maxTokenChars * 2;
  }

  /**
   * `encode` without holding up the event loop: tokenizing is synchronous and takes ~10 µs per
   * character, so a text beyond a few thousand characters is tokenized on a worker thread (which
   * loads the same tokenizer.json once, and exits after a minute of idleness).
   */
  async encodeAsync(text: string, options: EncodeOptions = {}): Promise<number[]> {
    if (text.length <= INLINE_ENCODE_CHARS || this.source === null) {
      return this.encode(text, options);
    }
    this.worker ??= new TokenizeWorker(this.source, () => (this.worker = null));
    const ids = await this.worker.encode(text);
    if (options.addBos && this.bosId !== null && ids[0] !== this.bosId) ids.unshift(this.bosId);
    return ids;
  }

  /** Stops the worker thread (it also stops by itself when idle). */
  async close(): Promise<void> {
    await this.worker?.close();
    this.worker = null;
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

/** Texts up to this many characters are tokenized inline (a few tens of milliseconds at most). */
export const INLINE_ENCODE_CHARS = 4096;
/** A tokenizer worker with nothing to do for this long exits (it holds a copy of the vocabulary). */
const WORKER_IDLE_MS = 60_000;

export interface TokenizerSource {
  tokenizerPath: string;
  /** tokenizer_config.json, or null when the model has none. */
  configPath: string | null;
}

interface WorkerReply {
  id: number;
  ids?: Int32Array;
  error?: string;
}

/** One worker thread running tokenize-worker.mjs; requests are answered in order. */
class TokenizeWorker {
  private readonly worker: Worker;
  private next = 0;
  private idle: NodeJS.Timeout | null = null;
  private readonly pending = new Map<
    number,
    { resolve: (ids: number[]) => void; reject: (e: Error) => void }
  >();

  constructor(source: TokenizerSource, onExit: () => void) {
    this.worker = new Worker(new URL("./tokenize-worker.mjs", import.meta.url), {
      workerData: source,
    });
    this.worker.unref();
    this.worker.on("message", (reply: WorkerReply) => {
      const p = this.pending.get(reply.id);
      if (!p) return;
      this.pending.delete(reply.id);
      this.settle();
      if (reply.error !== undefined || !reply.ids) {
        p.reject(
          new UserError(`cannot tokenize: ${reply.error ?? "no answer"}`, "tokenize_failed"),
        );
      } else {
        p.resolve(Array.from(reply.ids));
      }
    });
    const fail = (error: Error): void => {
      for (const p of this.pending.values()) p.reject(error);
      this.pending.clear();
      onExit();
    };
    this.worker.on("error", fail);
    this.worker.on("exit", () => fail(new Error("the tokenizer worker exited")));
  }

  encode(text: string): Promise<number[]> {
    const id = this.next++;
    if (this.idle) clearTimeout(this.idle);
    this.idle = null;
    // Referenced while it has work, so that a caller awaiting it keeps the process alive.
    this.worker.ref();
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ id, text });
    });
  }

  private settle(): void {
    if (this.pending.size > 0) return;
    this.worker.unref();
    this.idle = setTimeout(() => void this.close(), WORKER_IDLE_MS);
    this.idle.unref();
  }

  async close(): Promise<void> {
    if (this.idle) clearTimeout(this.idle);
    await this.worker.terminate();
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
  const configPath = join(modelDir, "tokenizer_config.json");
  const configJson = await readJson(configPath, false);
  const config = configJson ?? {};
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
    { tokenizerPath, configPath: configJson ? configPath : null },
  );
}
