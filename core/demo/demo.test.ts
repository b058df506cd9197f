import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { listModels, resolveModel } from "../chat/model.ts";
import { loadTokenizer } from "../chat/tokenizer.ts";
import { verifyModelFiles } from "../format/read.ts";
import { nativeBuildDir } from "../native.ts";
import { DEMO_CREATED_BY, DEMO_LABEL, ensureDemoModel } from "./demo.ts";

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

describe("demo model", () => {
  it("is a small Gemma 4 MoE whose vocabulary covers every id of its tokenizer", async () => {
    const { manifest } = await resolveModel(dir);
    const arch = manifest.architecture;
    expect(arch.family).toBe("gemma4");
    expect(arch.moe).toEqual({ num_experts: 8, top_k: 2, intermediate_size: 128 });
    expect(arch.hidden_size).toBe(256);
    const tok = await loadTokenizer(dir);
    expect(arch.vocab_size).toBe(tok.size);
    expect(arch.eos_token_ids).toContain(tok.tokenId("<end_of_turn>"));
    expect(manifest.created_by).toContain(DEMO_LABEL);
    expect(tok.configTemplate).toContain("<start_of_turn>");
  });

  it("passes verify (every file hashed against the manifest)", async () => {
    const { checks } = await verifyModelFiles(dir, undefined);
    expect(checks.map((c) => c.status).every((s) => s === "ok")).toBe(true);
    expect(checks.map((c) => c.path)).toEqual(
      expect.arrayContaining(["weights.bin", "tokenizer.json", "tokenizer_config.json"]),
    );
  });

  it("is deterministic: a second build has identical files", async () => {
    const again = await ensureDemoModel(join(root, "again", "demo"));
    const a = JSON.parse(await readFile(join(dir, "manifest.json"), "utf8")) as { files: unknown };
    const b = JSON.parse(await readFile(join(again, "manifest.json"), "utf8")) as {
      files: unknown;
    };
    expect(b.files).toEqual(a.files);
    // Existing: returned as is, not rebuilt.
    expect(await ensureDemoModel(again, () => expect.fail("rebuilt"))).toBe(again);
  });

  it("rebuilds a demo from another generator version, and leaves other models alone", async () => {
    const old = await ensureDemoModel(join(root, "old", "demo"));
    const path = join(old, "manifest.json");
    const manifest = JSON.parse(await readFile(path, "utf8")) as { created_by: string };
    await writeFile(path, JSON.stringify({ ...manifest, created_by: "redwing demo v0 (old)" }));
    let rebuilt = false;
    await ensureDemoModel(old, () => (rebuilt = true));
    expect(rebuilt).toBe(true);
    expect(JSON.parse(await readFile(path, "utf8"))).toMatchObject({ created_by: DEMO_CREATED_BY });
    await writeFile(path, JSON.stringify({ ...manifest, created_by: "redwing import" }));
    await ensureDemoModel(old, () => expect.fail("replaced a model that is not the demo"));
  });

  it("is listed as the demo", async () => {
    const models = await listModels(join(root, "models"));
    expect(models).toHaveLength(1);
    expect(models[0]).toMatchObject({ name: "demo", isDemo: true, moe: true });
    expect(models[0]!.memoryEstimateBytes).toBeGreaterThan(30e6);
  });

  it.skipIf(!existsSync(engine))("loads in the engine (finite logits)", () => {
    const r = spawnSync(engine, ["logits", "--model", dir, "--tokens", "2,3,4"], {
      encoding: "utf8",
      maxBuffer: 64 * 1024 * 1024,
    });
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
    const { logits } = JSON.parse(r.stdout) as { logits: number[][] };
    expect(logits).toHaveLength(3);
    expect(logits[0]).toHaveLength(262145);
    expect(logits.flat().every(Number.isFinite)).toBe(true);
  });
});
