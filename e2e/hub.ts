/**
 * The fake Hugging Face hub the e2e tests download from (testkit/test-hub.ts, in the test
 * process, 127.0.0.1 only). It serves one repository: the Gemma 3 reference fixture in MLX form
 * (fixtures/gemma3/mlx, vocabulary 512) plus a small character-level tokenizer written here, so
 * the installed model can be loaded and chatted with (its text is random characters).
 */
import { copyFile, mkdir, readdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { TestHub } from "../testkit/test-hub.ts";

export const ROOT = fileURLToPath(new URL("..", import.meta.url));
/** The repository the download spec asks for. */
export const E2E_REPO = "e2e-test/tiny-gemma3";
const VOCAB = 512;

/**
 * Slows the repository's weights file to about 25 kB/s, so that a download's progress, pause and
 * resume can be watched; `hub.faults.length = 0` lets the rest come at full speed.
 */
export function trickleWeights(hub: TestHub): void {
  hub.faults.push({
    on: "data",
    path: "model.safetensors",
    action: { kind: "trickle", chunkBytes: 1024, delayMs: 40 },
  });
}

/**
 * A BPE tokenizer without merges over 512 ids: the special tokens the Gemma 3 chat template
 * uses at Gemma's ids (`<start_of_turn>` 105, `<end_of_turn>` 106), the printable ASCII
 * characters and newline, and two-letter pieces for the rest (so random ids read as words).
 */
export function tinyTokenizer(): { tokenizer: unknown; config: unknown } {
  const special: Record<number, string> = {
    0: "<pad>",
    1: "<eos>",
    2: "<bos>",
    3: "<unk>",
    105: "<start_of_turn>",
    106: "<end_of_turn>",
  };
  const pieces: string[] = ["\n"];
  for (let c = 32; c < 127; c++) pieces.push(String.fromCharCode(c));
  const letters = "abcdefghijklmnopqrstuvwxyz";
  for (const a of letters) for (const b of letters) pieces.push(a + b);
  const vocab: Record<string, number> = {};
  let next = 0;
  for (let id = 0; id < VOCAB; id++) {
    const token = special[id] ?? pieces[next++]!;
    vocab[token] = id;
  }
  const addedTokens = Object.entries(special).map(([id, content]) => ({
    id: Number(id),
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  return {
    tokenizer: {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: addedTokens,
      normalizer: null,
      pre_tokenizer: null,
      post_processor: null,
      decoder: { type: "Fuse" },
      model: {
        type: "BPE",
        dropout: null,
        unk_token: "<unk>",
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        vocab,
        merges: [],
      },
    },
    config: { bos_token: "<bos>", eos_token: "<eos>", pad_token: "<pad>", unk_token: "<unk>" },
  };
}

/** Writes the checkpoint the hub serves into `dir`. */
export async function writeE2eCheckpoint(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true });
  const source = join(ROOT, "fixtures", "gemma3", "mlx");
  for (const name of await readdir(source)) await copyFile(join(source, name), join(dir, name));
  const { tokenizer, config } = tinyTokenizer();
  await writeFile(join(dir, "tokenizer.json"), JSON.stringify(tokenizer));
  await writeFile(join(dir, "tokenizer_config.json"), JSON.stringify(config));
}

/** Starts the hub with the e2e repository (the checkpoint written under `scratch`). */
export async function startE2eHub(scratch: string): Promise<TestHub> {
  const dir = join(scratch, "hub-repo");
  await writeE2eCheckpoint(dir);
  const hub = await TestHub.start();
  await hub.addRepoFromDir(E2E_REPO, dir);
  return hub;
}
