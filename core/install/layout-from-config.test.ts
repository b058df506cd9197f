import { readFile, readdir } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { layoutImport, planImport, readQuantConfig } from "../import/importer.ts";
import { SafetensorsCheckpoint } from "../import/safetensors.ts";
import { normalizeConfig } from "../import/config.ts";
import { describeQuantization, isMlxQuantization, layoutFromConfig } from "./layout-from-config.ts";

const FIXTURES = join(import.meta.dirname, "..", "..", "fixtures");

describe("layoutFromConfig", () => {
  for (const fixture of [
    "gemma3/mlx",
    "gemma3/bf16",
    "gemma4-moe/mlx",
    "gemma4-moe/bf16",
    "gemma4-dense/mlx",
    "gemma4-dense/bf16",
  ]) {
    it(`gives the layout the real headers give (${fixture})`, async () => {
      const dir = join(FIXTURES, fixture);
      const config = JSON.parse(await readFile(join(dir, "config.json"), "utf8")) as Record<
        string,
        unknown
      >;
      const fromConfig = layoutFromConfig(config);
      const ckpt = await SafetensorsCheckpoint.open(dir, (await readdir(dir)).sort());
      try {
        const { architecture } = normalizeConfig(config);
        const real = planImport(architecture, ckpt, config);
        expect(fromConfig.layout).toEqual(layoutImport(real, architecture));
        expect(fromConfig.importPlan.kind).toBe(real.kind);
        expect(fromConfig.importPlan.defaultQuant).toEqual(real.defaultQuant);
      } finally {
        await ckpt.close();
      }
      expect(describeQuantization(fromConfig.importPlan)).toMatch(
        fixture.endsWith("mlx") ? /^MLX 4/ : /^bf16 \(quantized to 4-bit at install\)$/,
      );
    });
  }
});

describe("layoutFromConfig refuses what the engine does not run, saying why", () => {
  async function config(fixture: string): Promise<Record<string, unknown>> {
    return JSON.parse(await readFile(join(FIXTURES, fixture, "config.json"), "utf8")) as Record<
      string,
      unknown
    >;
  }

  it("MLX bits other than 4 and 8, and odd group sizes", async () => {
    const c = await config("gemma3/mlx");
    expect(() => layoutFromConfig({ ...c, quantization: { group_size: 64, bits: 6 } })).toThrow(
      /^MLX 6-bit: Redwing runs 4- and 8-bit MLX checkpoints/,
    );
    expect(() => layoutFromConfig({ ...c, quantization: { group_size: 16, bits: 4 } })).toThrow(
      /^MLX group size 16: Redwing runs group sizes 32, 64 and 128/,
    );
  });

  it("an architecture Redwing does not run", () => {
    expect(() => layoutFromConfig({ model_type: "llama", hidden_size: 64 })).toThrow(
      /model_type llama; Redwing imports Gemma 4/,
    );
  });
});

describe("a config's quantization block", () => {
  it("is found under either name, at the top level or in text_config, by both readers", () => {
    const q = { group_size: 32, bits: 8 };
    for (const config of [
      { quantization: q },
      { quantization_config: q },
      { text_config: { quantization: q } },
      { text_config: { quantization_config: q } },
    ]) {
      expect(isMlxQuantization(config), JSON.stringify(config)).toBe(true);
      expect(readQuantConfig(config, true, [])).toMatchObject({ bits: 8, group_size: 32 });
    }
    // The top level's comes first.
    const both = { quantization: q, text_config: { quantization: { group_size: 64, bits: 4 } } };
    expect(readQuantConfig(both, true, [])).toMatchObject({ bits: 8, group_size: 32 });
    expect(isMlxQuantization({ text_config: {} })).toBe(false);
    expect(readQuantConfig({ text_config: {} }, true, [])).toBeNull();
  });
});
