import { mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { readModelDir } from "../format/read.ts";
import { synthArchitecture, synthesizeModel } from "./synth.ts";

describe("synthetic models", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  it("keeps the real Gemma 4 26B-A4B shapes", () => {
    const arch = synthArchitecture("gemma-4-26b-a4b");
    expect(arch.num_layers).toBe(30);
    expect(arch.hidden_size).toBe(2816);
    expect(arch.moe).toEqual({ num_experts: 128, top_k: 8, intermediate_size: 704 });
    const full = arch.layers.flatMap((l, i) => (l.attention === "full" ? [i] : []));
    expect(full).toEqual([5, 11, 17, 23, 29]);
    expect(arch.layers[5]).toMatchObject({ head_dim: 512, num_kv_heads: 2, k_eq_v: true });
    expect(arch.layers[0]).toMatchObject({ head_dim: 256, num_kv_heads: 8, sliding_window: 1024 });
    expect(arch.embed_scale).toBe(53);
  });

  it("cuts layers and keeps a full-attention last layer", () => {
    const arch = synthArchitecture("gemma-4-26b-a4b", 3);
    expect(arch.layers.map((l) => l.attention)).toEqual(["sliding", "sliding", "full"]);
    expect(() => synthArchitecture("gemma-4-26b-a4b", 31)).toThrow(/from 1 to 30/);
  });

  it("writes a model that the reader accepts, with the real expert stride", async () => {
    const parent = await mkdtemp(join(tmpdir(), "redwing-synth-"));
    dirs.push(parent);
    const out = join(parent, "model");
    const manifest = await synthesizeModel({ preset: "gemma-4-26b-a4b", out, layers: 1 });
    const layer = manifest.experts?.layers["0"];
    // 3 x (991,232 packed + 2 x 61,952 scales/biases) = 3,345,408 B, padded to 205 x 16 KiB.
    expect(layer?.stride).toBe(3_358_720);
    expect((await stat(join(out, "experts", "layer_000.bin"))).size).toBe(128 * 3_358_720);
    const model = await readModelDir(out, { verifyHashes: true });
    expect(model.manifest.source.kind).toBe("synthetic");
  });
});
