import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { TINY_GEMMA3, writeTinyCheckpoint } from "../../testkit/checkpoints.ts";
import { runCli } from "../../testkit/run-cli.ts";

let root: string;
let ckpt: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-cli-"));
  ckpt = join(root, "ckpt");
  await writeTinyCheckpoint(ckpt, TINY_GEMMA3, { form: "nested", kind: "mlx" });
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});
afterEach(() => {
  vi.restoreAllMocks();
});

const run = runCli;

describe("redwing import / verify", () => {
  it("imports, then verify accepts every file", async () => {
    const dest = join(root, "model");
    const imp = await run("import", ckpt, "--out", dest, "--repo", "mlx-community/tiny");
    expect(imp.code).toBe(0);
    expect(imp.out).toMatch(/imported gemma3 \(mlx-affine, 4 layers\) into .*model: 5 files/);
    expect(imp.err).toMatch(/import: tensors/); // progress on stderr
    const manifest = JSON.parse(await readFile(join(dest, "manifest.json"), "utf8"));
    expect(manifest.created_by).toMatch(/^redwing \d+\.\d+\.\d+/);
    expect(manifest.source.repo).toBe("mlx-community/tiny");
    const ver = await run("verify", dest);
    expect(ver.code).toBe(0);
    expect(ver.out).toMatch(/ok +weights\.bin/);
    expect(ver.out).toMatch(/all 5 files match the manifest/);
  });

  it("verify exits 1 naming the bad file", async () => {
    const dest = join(root, "model-bad");
    expect((await run("import", ckpt, "--out", dest)).code).toBe(0);
    const path = join(dest, "weights.bin");
    const bytes = await readFile(path);
    bytes[100]! ^= 0xff;
    await writeFile(path, bytes);
    const ver = await run("verify", dest);
    expect(ver.code).toBe(1);
    expect(ver.out).toMatch(/BAD +weights\.bin: sha256 [0-9a-f]{64}, expected [0-9a-f]{64}/);
    expect(ver.out).toMatch(/ok +tokenizer\.json/);
    await writeFile(join(dest, "notes.txt"), "x");
    const extra = await run("verify", dest);
    expect(extra.out).toMatch(/EXTRA +notes\.txt: is not listed in the manifest/);
    expect(extra.err).toMatch(/weights\.bin \(contents differ\), notes\.txt \(unexpected\)/);
    expect(ver.err).toMatch(
      /redwing: .* does not match its manifest: weights\.bin \(contents differ\); reinstall/,
    );
  });

  it("reports user errors on one line with exit 1", async () => {
    const dest = join(root, "model");
    const again = await run("import", ckpt, "--out", dest);
    expect(again.code).toBe(1);
    expect(again.err).toMatch(
      /redwing: a model is already installed at .*; pass --force to replace it/,
    );
    expect((await run("import", ckpt, "--out", dest, "--force")).code).toBe(0);
    const missing = await run("verify", join(root, "none"));
    expect(missing.code).toBe(1);
    expect(missing.err).toMatch(/redwing: no model is installed at/);
    const noOut = await run("import", ckpt);
    expect(noOut.code).not.toBe(0);
  });
});
