import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TINY_GEMMA4_MOE, writeTinyCheckpoint } from "../../testkit/checkpoints.ts";
import { TestHub } from "../../testkit/test-hub.ts";
import { runCli } from "../../testkit/run-cli.ts";
import type { DiscoverResult } from "../../core/install/discover.ts";

let root: string;
let hub: TestHub;
const saved = { ...process.env };

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-cli-search-"));
  const ckpt = join(root, "ckpt");
  await writeTinyCheckpoint(ckpt, TINY_GEMMA4_MOE, { form: "nested", kind: "mlx", shards: 2 });
  hub = await TestHub.start();
  await hub.addRepoFromDir("test/tiny-moe", ckpt, { info: { downloads: 2 } });
  hub.addRepo(
    "test/tiny-llama",
    new Map([
      ["config.json", Buffer.from('{"architectures":["LlamaForCausalLM"],"model_type":"llama"}')],
      ["model.safetensors", Buffer.alloc(16)],
    ]),
    { info: { downloads: 1 } },
  );
  process.env.HF_ENDPOINT = hub.url;
  process.env.REDWING_HOME = join(root, "home");
  delete process.env.HF_TOKEN;
});
afterAll(async () => {
  process.env = saved;
  await hub.close();
  await rm(root, { recursive: true, force: true });
});

describe("redwing search", () => {
  it("prints each result: whether it runs (and why not), download size and memory", async () => {
    const r = await runCli("search", "tiny");
    expect(r.code).toBe(0);
    const lines = r.out.split("\n");
    expect(lines[0]).toMatch(/^REPO\s+RUNS\s+DOWNLOAD\s+MEMORY\s+FITS\s+LICENCE$/);
    expect(lines[1]).toMatch(
      /^test\/tiny-moe\s+yes\s+\d+(\.\d+)? [KMG]iB\s+\d+(\.\d+)? [KMG]iB\s+yes/,
    );
    expect(lines[2]).toMatch(/^test\/tiny-llama\s+no\s+-\s+-\s+-/);
    expect(lines[3]).toContain("Llama architecture: not supported yet");

    const json = await runCli("search", "tiny", "--json");
    const parsed = JSON.parse(json.out) as DiscoverResult;
    expect(parsed.endpoint).toBe(hub.url);
    expect(parsed.models[0]).toMatchObject({ repo: "test/tiny-moe", status: "runnable" });
    expect(parsed.models[0]!.memoryBytes).toBeGreaterThan(0);
  }, 60_000);

  it("says plainly when the hub cannot be reached", async () => {
    process.env.HF_ENDPOINT = "http://127.0.0.1:9";
    try {
      const r = await runCli("search", "tiny");
      expect(r.code).toBe(1);
      expect(r.err).toMatch(/^redwing: cannot reach the hub at http:\/\/127\.0\.0\.1:9.*offline/);
    } finally {
      process.env.HF_ENDPOINT = hub.url;
    }
  });
});
