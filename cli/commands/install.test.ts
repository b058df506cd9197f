import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { importCheckpoint } from "../../core/import/importer.ts";
import { TINY_GEMMA4_MOE, writeTinyCheckpoint } from "../../testkit/checkpoints.ts";
import { installPaths, type InstallProgress } from "../../core/install/installer.ts";
import { TestHub } from "../../testkit/test-hub.ts";
import { runCli } from "../../testkit/run-cli.ts";
import { progressLine } from "./install.ts";

let root: string;
let hub: TestHub;
let commit: string;
let ckpt: string;
const saved = { ...process.env };

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-cli-install-"));
  ckpt = join(root, "ckpt");
  await writeTinyCheckpoint(ckpt, TINY_GEMMA4_MOE, { form: "nested", kind: "mlx", shards: 2 });
  hub = await TestHub.start();
  commit = await hub.addRepoFromDir("test/tiny", ckpt);
  process.env.HF_ENDPOINT = hub.url;
  process.env.REDWING_HOME = join(root, "home");
  delete process.env.HF_TOKEN;
});
afterAll(async () => {
  process.env = saved;
  await hub.close();
  await rm(root, { recursive: true, force: true });
});
afterEach(() => {
  vi.restoreAllMocks();
});

const run = runCli;

describe("redwing install", () => {
  it("makes the demo model locally instead of downloading it", async () => {
    const r = await run("install", "demo");
    expect(r.code).toBe(0);
    const dir = join(root, "home", "models", "demo");
    expect(r.out).toContain(dir);
    expect(await run("verify", dir)).toMatchObject({ code: 0 });
  });

  it("installs repo@revision into the models directory, then verify accepts it", async () => {
    const r = await run("install", `test/tiny@${commit}`);
    expect(r.code).toBe(0);
    expect(r.err).toMatch(/install: downloading/);
    const dir = join(root, "home", "models", "test--tiny");
    expect(r.out).toMatch(
      new RegExp(
        `installed gemma4 \\(mlx-affine, commit ${commit.slice(0, 12)}\\) into ${dir}: 8 files`,
      ),
    );
    expect(r.out).toMatch(/every shard's SHA-256 matched the hub/);
    const ref = join(root, "ref");
    await importCheckpoint(ckpt, ref, { repo: "test/tiny", revision: commit, durable: false });
    expect(
      (await readFile(join(dir, "weights.bin"))).equals(await readFile(join(ref, "weights.bin"))),
    ).toBe(true);
    const ver = await run("verify", dir);
    expect(ver.code).toBe(0);
    const again = await run("install", `test/tiny@${commit}`);
    expect(again.code).toBe(1);
    expect(again.err).toMatch(/redwing: a model is already installed at .*--force/);
    expect((await run("install", `test/tiny@${commit}`, "--force")).code).toBe(0);
  });

  it("--out, --discard-partial, --list and clear errors", async () => {
    const out = join(root, "elsewhere");
    // The two header probes pass; the first tensor range gets a 404.
    hub.faults.push({ on: "data", ranged: true, skip: 2, action: { kind: "status", status: 404 } });
    const failed = await run("install", "test/tiny", "--out", out);
    expect(failed.code).toBe(1);
    expect(existsSync(out)).toBe(false);
    expect(existsSync(installPaths(out).journal)).toBe(true);
    hub.faults.length = 0;
    const discard = await run("install", "test/tiny", "--out", out, "--discard-partial");
    expect(discard.out).toMatch(/removed the partial install/);
    expect(existsSync(installPaths(out).staging)).toBe(false);
    expect((await run("install", "test/tiny", "--out", out, "--discard-partial")).out).toMatch(
      /there is no partial install/,
    );
    const list = await run("install", "--list");
    expect(list.out).toMatch(
      /gemma-4-26b-a4b-it\n.*\n *from mlx-community\/gemma-4-26b-a4b-it-4bit@0d77464eeb23/,
    );
    const bad = await run("install", "not a repo");
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/is not a model name or a hub repository/);
    const missing = await run("install", "test/none", "--out", join(root, "x"));
    expect(missing.err).toMatch(/redwing: test\/none was not found/);
  });

  it("draws a progress bar", () => {
    const p: InstallProgress = {
      phase: "downloading",
      bytesDone: 1_210_000_000,
      bytesTotal: 2_520_000_000,
      rate: 85_300_000,
      etaSeconds: 15.4,
      file: "model-00001-of-00002.safetensors",
    };
    const line = progressLine(p, 200);
    expect(line).toBe(
      "install: downloading [##########----------] 48% 1.13 GiB/2.35 GiB 81.3 MiB/s ETA 0:15 model-00001-of-00002.safetensors",
    );
    expect(
      progressLine({ ...p, phase: "paused", rate: null, etaSeconds: null, file: null }, 200),
    ).toBe("install: paused [##########----------] 48% 1.13 GiB/2.35 GiB");
    expect(progressLine(p, 41)).toHaveLength(40);
  });
});
