/**
 * `redwing prompt` on a small Gemma 4 model directory that ships Google's current chat template
 * (core/chat/testdata), and on one that ships none (Redwing's fallback): the printed text must be
 * exactly the test vector's expected prompt.
 */
import { readFileSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadTokenizer } from "../../core/chat/tokenizer.ts";
import { gemma3TokenizerFiles } from "../../core/models/gemma3.ts";
import { writeRandomModel } from "../../testkit/random-model.ts";
import { runCli } from "../../testkit/run-cli.ts";

const TESTDATA = join(
  dirname(fileURLToPath(import.meta.url)),
  "..",
  "..",
  "core",
  "chat",
  "testdata",
);
const VECTORS = JSON.parse(readFileSync(join(TESTDATA, "gemma4-vectors.json"), "utf8")) as {
  template: string;
  vectors: { messages: unknown[]; tools?: unknown[]; enable_thinking: boolean; expected: string }[];
};

let home: string;
let official: string;
let fallback: string;

beforeAll(async () => {
  home = await mkdtemp(join(tmpdir(), "redwing-prompt-"));
  const files = gemma3TokenizerFiles();
  // tokenizer_config.json without a chat_template, so the template comes from the directory.
  const config = JSON.parse(readFileSync(files.config, "utf8")) as Record<string, unknown>;
  delete config.chat_template;
  await writeFile(join(home, "tokenizer_config.json"), JSON.stringify(config));
  official = join(home, "official");
  fallback = join(home, "fallback");
  for (const [dir, template] of [
    [official, join(TESTDATA, VECTORS.template)],
    [fallback, null],
  ] as const) {
    await writeRandomModel(dir, {
      seed: 3,
      tokenizerConfig: join(home, "tokenizer_config.json"),
      chatTemplate: template ?? undefined,
    });
  }
}, 60_000);

afterAll(async () => {
  await rm(home, { recursive: true, force: true });
});

async function files(i: number): Promise<string[]> {
  const v = VECTORS.vectors[i]!;
  const messages = join(home, `m${i}.json`);
  await writeFile(messages, JSON.stringify(v.messages));
  const args = ["--messages-file", messages];
  if (v.tools) {
    await writeFile(join(home, `t${i}.json`), JSON.stringify(v.tools));
    args.push("--tools-file", join(home, `t${i}.json`));
  }
  if (v.enable_thinking) args.push("--thinking", "on");
  return args;
}

describe("redwing prompt", () => {
  // Every vector through both templates is core/chat/template.test.ts; here the command itself.
  it.each([
    ["Google's template", 3],
    ["the fallback template", 2],
    ["Google's template", 1],
  ])(
    "prints exactly the prompt through %s (vector %i)",
    async (which, i) => {
      const v = VECTORS.vectors[i]!;
      const dir = which === "the fallback template" ? fallback : official;
      const r = await runCli("prompt", "--model", dir, ...(await files(i)));
      expect(r.err).toBe("");
      expect(r.code).toBe(0);
      expect(r.out).toBe(v.expected); // the tokenizer's BOS is "<bos>", as in the vectors
    },
    60_000,
  );

  it("prints the token ids the engine would receive", async () => {
    const args = await files(0);
    const r = await runCli("prompt", "--model", official, "--ids", ...args);
    expect(r.code).toBe(0);
    const tokenizer = await loadTokenizer(official);
    const ids = tokenizer.encode(VECTORS.vectors[0]!.expected, { addBos: true });
    expect(r.out).toBe(`${ids.join(",")}\n`);
    expect(ids[0]).toBe(2); // one BOS, not two
    expect(ids[1]).not.toBe(2);
  }, 60_000);

  it("leaves out the generation prompt on request and reports bad input clearly", async () => {
    const args = await files(0);
    const r = await runCli("prompt", "--model", official, "--no-generation-prompt", ...args);
    expect(r.out).toBe(
      VECTORS.vectors[0]!.expected.replace("<|turn>model\n<|channel>thought\n<channel|>", ""),
    );
    await writeFile(
      join(home, "bad-tools.json"),
      JSON.stringify([{ type: "function", function: {} }]),
    );
    const bad = await runCli(
      "prompt",
      "--model",
      official,
      ...args,
      "--tools-file",
      join(home, "bad-tools.json"),
    );
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/tool 0: function\.name/);
    const thinking = await runCli("prompt", "--model", official, ...args, "--thinking", "maybe");
    expect(thinking.code).not.toBe(0);
    expect(thinking.err).toMatch(/--thinking/);
  }, 60_000);
});
