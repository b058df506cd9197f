import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { listModels, resolveModel } from "../chat/model.ts";
import { loadChatTemplate, renderChat } from "../chat/template.ts";
import { loadTokenizer } from "../chat/tokenizer.ts";
import { verifyModelFiles } from "../format/read.ts";
import { nativeBuildDir } from "../native.ts";
import {
  DEMO_CREATED_BY,
  DEMO_LABEL,
  demoRecipeFile,
  ensureDemoModel,
  shippedDemoDir,
} from "./demo.ts";

let root: string;
let dir: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-demo-"));
  dir = await ensureDemoModel(join(root, "models", "demo"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

const engine = join(nativeBuildDir(), "redwing-engine");

interface Reference {
  perplexity: { ids: number[] };
  greedy: { prompt: string; rendered: string; prompt_ids: number[] }[];
  stop_ids: number[];
}

describe("demo model", () => {
  it("is the trained Gemma 4 MoE: five sliding layers then one full k_eq_v layer, 32 experts", async () => {
    const { manifest } = await resolveModel(dir);
    const arch = manifest.architecture;
    expect(arch.family).toBe("gemma4");
    expect(arch.moe).toEqual({ num_experts: 32, top_k: 4, intermediate_size: 128 });
    expect(arch.layers.map((l) => l.attention)).toEqual([
      "sliding",
      "sliding",
      "sliding",
      "sliding",
      "sliding",
      "full",
    ]);
    expect(arch.layers[5]).toMatchObject({ k_eq_v: true, head_dim: 128, num_kv_heads: 1 });
    expect(arch.layers[5]!.rope.rotary_pairs).toBe(16); // proportional RoPE: a quarter rotates
    expect(arch.final_logit_softcap).toBe(30);
    const tok = await loadTokenizer(dir);
    expect(arch.vocab_size).toBe(tok.size);
    expect(tok.size).toBe(4096);
    // Gemma 4's control tokens at their own ids; the turn end stops generation.
    expect(tok.tokenId("<|turn>")).toBe(105);
    expect(tok.tokenId("<turn|>")).toBe(106);
    expect(tok.tokenId("<|channel>")).toBe(100);
    expect(tok.tokenId("<bos>")).toBe(2);
    expect(arch.eos_token_ids).toEqual(expect.arrayContaining([1, 106]));
    expect(manifest.created_by).toBe(DEMO_CREATED_BY);
    expect(manifest.created_by).toContain(DEMO_LABEL);
    expect(manifest.source.kind).toBe("mlx-affine");
  });

  it("renders and tokenizes chats exactly as it was trained and as transformers was fed", async () => {
    const reference = JSON.parse(
      await readFile(demoRecipeFile("reference.json"), "utf8"),
    ) as Reference;
    const tok = await loadTokenizer(dir);
    const template = await loadChatTemplate(dir, tok.configTemplate, "gemma4");
    for (const g of reference.greedy) {
      const rendered = renderChat(template, [{ role: "user", content: g.prompt }], {
        bosToken: tok.bosToken,
      });
      expect(rendered).toBe(g.rendered);
      expect(tok.encode(rendered)).toEqual(g.prompt_ids);
    }
    // The held-out text: the ids transformers scored are the ids our tokenizer makes.
    const text = await readFile(demoRecipeFile("heldout.txt"), "utf8");
    expect(tok.encode(text, { addBos: true })).toEqual(reference.perplexity.ids);
  });

  it("passes verify (every file hashed against the manifest)", async () => {
    const { checks } = await verifyModelFiles(dir, undefined);
    expect(checks.map((c) => c.status).every((s) => s === "ok")).toBe(true);
    expect(checks.map((c) => c.path)).toEqual(
      expect.arrayContaining(["weights.bin", "tokenizer.json", "experts/layer_005.bin"]),
    );
  });

  it("copies the shipped files byte for byte; only created_by differs", async () => {
    for (const rel of ["weights.bin", "experts/layer_000.bin", "tokenizer.json"]) {
      const [a, b] = await Promise.all([
        readFile(join(dir, rel)),
        readFile(join(shippedDemoDir(), rel)),
      ]);
      expect(a.equals(b)).toBe(true);
    }
    const shipped = JSON.parse(await readFile(join(shippedDemoDir(), "manifest.json"), "utf8"));
    const copy = JSON.parse(await readFile(join(dir, "manifest.json"), "utf8"));
    expect({ ...copy, created_by: null }).toEqual({ ...shipped, created_by: null });
    // Existing: returned as is, not copied again.
    expect(await ensureDemoModel(dir, () => expect.fail("copied again"))).toBe(dir);
  });

  it("replaces a demo of another version, and leaves other models alone", async () => {
    const old = await ensureDemoModel(join(root, "old", "demo"));
    const path = join(old, "manifest.json");
    const manifest = JSON.parse(await readFile(path, "utf8")) as { created_by: string };
    await writeFile(path, JSON.stringify({ ...manifest, created_by: "redwing demo v1 (random)" }));
    await writeFile(join(old, "weights.bin"), "stale");
    let replaced = false;
    await ensureDemoModel(old, () => (replaced = true));
    expect(replaced).toBe(true);
    expect(JSON.parse(await readFile(path, "utf8"))).toMatchObject({ created_by: DEMO_CREATED_BY });
    expect((await verifyModelFiles(old, undefined)).checks.every((c) => c.status === "ok")).toBe(
      true,
    );
    await writeFile(path, JSON.stringify({ ...manifest, created_by: "redwing import" }));
    await ensureDemoModel(old, () => expect.fail("replaced a model that is not the demo"));
  });

  it("refuses to replace a directory that is not a model", async () => {
    const target = join(root, "busy", "demo");
    await mkdir(target, { recursive: true });
    await writeFile(join(target, "notes.txt"), "mine");
    await expect(ensureDemoModel(target)).rejects.toThrow(/not a Redwing model/);
    expect(await readFile(join(target, "notes.txt"), "utf8")).toBe("mine");
  });

  it("is listed as the demo", async () => {
    const models = await listModels(join(root, "models"));
    expect(models).toHaveLength(1);
    expect(models[0]).toMatchObject({ name: "demo", isDemo: true, moe: true });
    expect(models[0]!.sizeBytes).toBeLessThan(25e6);
  });

  it.skipIf(!existsSync(engine))("loads in the engine (finite logits)", () => {
    const r = spawnSync(engine, ["logits", "--model", dir, "--tokens", "2,105,3000"], {
      encoding: "utf8",
      maxBuffer: 64 * 1024 * 1024,
    });
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
    const { logits } = JSON.parse(r.stdout) as { logits: number[][] };
    expect(logits).toHaveLength(3);
    expect(logits[0]).toHaveLength(4096);
    expect(logits.flat().every(Number.isFinite)).toBe(true);
  });
});
