/**
 * The shipped demo model (demo-model/) against transformers 5.17, which computed its reference on
 * the GPU machine from exactly the weights the engine runs (the dequantized 4-bit checkpoint,
 * float32, eager; demo-model/reference.json, made by demo-model/train.py):
 * - `redwing perplexity` over demo-model/heldout.txt (CPU engine, f32 KV and the default f16 KV)
 *   within 0.5% of transformers' perplexity, on the same token ids;
 * - the greedy replies to three chat prompts equal transformers' token for token (through the
 *   engine directly, and one through `redwing chat` end to end).
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { greedyGenerateArgs } from "../bench/generate-report.ts";
import { runCli } from "../testkit/run-cli.ts";
import { demoRecipeFile, shippedDemoDir } from "../core/demo/demo.ts";
import { nativeBinary } from "../core/native.ts";

interface Reference {
  perplexity: {
    context: number;
    stride: number;
    tokens: number;
    nll_per_token: number;
    perplexity: number;
    ids: number[];
  };
  greedy: {
    prompt: string;
    prompt_ids: number[];
    greedy: number[];
    text: string;
    min_logit_gap: number;
  }[];
}

const reference = JSON.parse(readFileSync(demoRecipeFile("reference.json"), "utf8")) as Reference;
const HELDOUT = demoRecipeFile("heldout.txt");
const PPL_TOLERANCE = 0.005;
// The three prompts with the widest top-1/top-2 logit margin along transformers' greedy path:
// an f16 KV cache moves logits by far less than these margins.
const PROMPTS = [...reference.greedy].sort((a, b) => b.min_logit_gap - a.min_logit_gap).slice(0, 3);

let home: string;
beforeAll(() => {
  home = mkdtempSync(join(tmpdir(), "redwing-demo-accuracy-"));
  process.env.REDWING_HOME = home;
});
afterAll(() => {
  delete process.env.REDWING_HOME;
  rmSync(home, { recursive: true, force: true });
});

/**
 * `redwing perplexity --json` on the held-out text, windowed as the reference was (2 threads);
 * fails the test unless it runs cleanly.
 */
async function heldoutPerplexity(
  kv: "f32" | "f16",
  activations: string,
): Promise<{ perplexity: number; nll_per_token: number; tokens: number; activations: string }> {
  const { code, out, err } = await runCli(
    "perplexity",
    "--file",
    HELDOUT,
    "--context",
    String(reference.perplexity.context),
    "--stride",
    String(reference.perplexity.stride),
    "--kv-dtype",
    kv,
    "--activations",
    activations,
    "--threads",
    "2",
    "--json",
  );
  expect(err).toBe("");
  expect(code).toBe(0);
  return JSON.parse(out) as {
    perplexity: number;
    nll_per_token: number;
    tokens: number;
    activations: string;
  };
}

describe("demo model against transformers", () => {
  it("has a reference that is worth checking against", () => {
    expect(reference.perplexity.tokens).toBe(reference.perplexity.ids.length - 1);
    expect(reference.perplexity.tokens).toBeGreaterThan(1000);
    expect(PROMPTS.every((p) => p.min_logit_gap > 0.5)).toBe(true);
  });

  for (const [kv, activations] of [
    ["f32", "exact"],
    ["f16", "exact"],
    ["f32", "head"], // the default plan: 8-bit inputs on the output head (measured -0.07%)
  ] as const) {
    it(`redwing perplexity (${kv} KV, ${activations} activations) is within 0.5% of transformers`, async () => {
      const got = await heldoutPerplexity(kv, activations);
      expect(got.activations).toBe(activations);
      expect(got.tokens).toBe(reference.perplexity.tokens);
      const rel = Math.abs(got.perplexity / reference.perplexity.perplexity - 1);
      expect(rel).toBeLessThan(PPL_TOLERANCE);
      expect(Math.abs(got.nll_per_token - reference.perplexity.nll_per_token)).toBeLessThan(0.005);
    });
  }

  it("int8 activations: perplexity within 5% of transformers, and not the exact path's", async () => {
    // 8-bit inputs to every product (not the default: the default plan, "head", is held to 0.5%
    // above). Measured against transformers' 73.81 (f32 KV): +0.84% on AVX-512 VNNI, -0.15% with
    // the scalar kernels, +3.0% on AVX2 (2026-12-02). The kernels agree (kernels_test); the spread
    // is the quantization's rounding meeting each ISA's float summation order in the exact parts
    // (attention, norms), which this small model amplifies. A broken 8-bit product lands far
    // outside 5%.
    const got = await heldoutPerplexity("f32", "int8");
    expect(got.activations).toBe("int8");
    const rel = got.perplexity / reference.perplexity.perplexity - 1;
    expect(Math.abs(rel)).toBeLessThan(0.05);
    expect(Math.abs(rel)).toBeGreaterThan(1e-4); // the 8-bit path really ran
  });

  it("a window shorter than the text changes the perplexity (the windows are real)", async () => {
    const { out } = await runCli("perplexity", "--file", HELDOUT, "--context", "16", "--json");
    const got = JSON.parse(out) as { perplexity: number; windows: number };
    expect(got.windows).toBeGreaterThan(100);
    expect(got.perplexity).toBeGreaterThan(reference.perplexity.perplexity * 1.2);
  });

  it("gives clear errors for bad input", async () => {
    const missing = await runCli("perplexity", "--file", join(home, "nope.txt"));
    expect(missing.code).toBe(1);
    expect(missing.err).toMatch(/cannot read .*nope\.txt/);
    const empty = join(home, "empty.txt");
    writeFileSync(empty, "");
    expect((await runCli("perplexity", "--file", empty)).err).toMatch(/no text to score/);
    const stride = await runCli("perplexity", "--file", HELDOUT, "--context", "8", "--stride", "8");
    expect(stride.err).toMatch(/--stride must be less than --context/);
  });

  for (const kv of ["f32", "f16"] as const) {
    it(`greedy replies to three prompts equal transformers' (${kv} KV)`, () => {
      for (const p of PROMPTS) {
        const r = spawnSync(
          nativeBinary("redwing-engine"),
          [
            ...greedyGenerateArgs(shippedDemoDir(), p.prompt_ids, p.greedy.length),
            ...["--kv-dtype", kv, "--threads", "2"],
          ],
          { encoding: "utf8" },
        );
        expect(r.status, r.stderr).toBe(0);
        expect({
          prompt: p.prompt,
          tokens: (JSON.parse(r.stdout) as { tokens: number[] }).tokens,
        }).toEqual({ prompt: p.prompt, tokens: p.greedy });
      }
    });
  }

  it("redwing chat replies with transformers' text (demo model by default)", async () => {
    const p = PROMPTS[0]!;
    const messages = join(home, "messages.json");
    writeFileSync(messages, JSON.stringify([{ role: "user", content: p.prompt }]));
    const { code, out } = await runCli(
      "chat",
      "--messages-file",
      messages,
      "--temperature",
      "0",
      "--threads",
      "2",
      "--json",
    );
    expect(code).toBe(0);
    expect((JSON.parse(out) as { text: string }).text).toBe(p.text);
  });
});
