/**
 * Model discovery against the fake hub (testkit/test-hub.ts): a mix of repositories Redwing runs
 * (Gemma 4 MoE in MLX 4-bit, Gemma 3 in bf16), a gated one, and ones it cannot (Llama, GGUF
 * only, GPTQ). Memory figures come from the real decode service, and are checked against the
 * plan of the same checkpoint actually imported.
 */
import { mkdtemp, readFile, readdir, rm, stat } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { toProtocolLoad } from "../generation/settings.ts";
import { EngineClient } from "../engine/client.ts";
import { importCheckpoint } from "../import/index.ts";
import { TestHub } from "../../testkit/test-hub.ts";
import { METADATA_FILES } from "../catalog/catalog.ts";
import { discoverModels, type DiscoverOptions, type DiscoveredModel } from "./discover.ts";
import { writeSkeleton } from "./plan-skeleton.ts";

const ROOT = join(import.meta.dirname, "..", "..");
const FIXTURES = join(ROOT, "fixtures");
const TOKEN = "hf_discover_test_token";
const GB = 1e9;

let hub: TestHub;
let work = "";
let engine: EngineClient;

async function dirFiles(dir: string): Promise<Map<string, Buffer>> {
  const files = new Map<string, Buffer>();
  for (const name of await readdir(dir)) files.set(name, await readFile(join(dir, name)));
  return files;
}

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), "redwing-discover-"));
  hub = await TestHub.start();
  const moe = await dirFiles(join(FIXTURES, "gemma4-moe", "mlx"));
  hub.addRepo("tiny-org/gemma-4-tiny-moe-4bit", moe, {
    info: { downloads: 900, likes: 12, cardData: { license: "apache-2.0" }, tags: ["mlx"] },
  });
  hub.addRepo("tiny-org/gemma-3-tiny-bf16", await dirFiles(join(FIXTURES, "gemma3", "bf16")), {
    info: {
      downloads: 800,
      cardData: {
        license: "other",
        license_name: "gemma",
        license_link: "https://ai.google.dev/gemma/terms",
      },
    },
  });
  hub.addRepo("tiny-org/gemma-3-tiny-gated", await dirFiles(join(FIXTURES, "gemma3", "mlx")), {
    token: TOKEN,
    info: { downloads: 700, tags: ["license:gemma"] },
  });
  const llamaConfig = {
    architectures: ["LlamaForCausalLM"],
    model_type: "llama",
    hidden_size: 64,
  };
  hub.addRepo(
    "tiny-org/llama-tiny",
    new Map([
      ["config.json", Buffer.from(JSON.stringify(llamaConfig))],
      ["model.safetensors", Buffer.alloc(1000)],
    ]),
    { info: { downloads: 600, cardData: { license: "llama3.1" } } },
  );
  hub.addRepo(
    "tiny-org/gemma-3-tiny-gguf",
    new Map([
      ["README.md", Buffer.from("# GGUF")],
      ["gemma-3-tiny-Q4_K_M.gguf", Buffer.alloc(2000)],
    ]),
    { info: { downloads: 500 } },
  );
  const gptq = JSON.parse(
    await readFile(join(FIXTURES, "gemma3", "bf16", "config.json"), "utf8"),
  ) as Record<string, unknown>;
  gptq.quantization_config = { quant_method: "gptq", bits: 4, group_size: 128 };
  hub.addRepo(
    "tiny-org/gemma-3-tiny-gptq",
    new Map([
      ["config.json", Buffer.from(JSON.stringify(gptq))],
      ["model.safetensors", Buffer.alloc(1000)],
    ]),
    { info: { downloads: 400 } },
  );
  hub.addRepo("elsewhere/unrelated", new Map([["config.json", Buffer.from("{}")]]));
  engine = await EngineClient.start({ env: { ...process.env, REDWING_HOME: join(work, "home") } });
}, 60_000);

afterAll(async () => {
  await engine?.close();
  await hub?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

const SETTINGS = { context: 4096, expertCacheSlots: 4 };

/** The engine's plan of a model directory at SETTINGS, as the Models view asks it. */
async function planTotal(dir: string): Promise<number> {
  return (await engine.plan(toProtocolLoad(dir, SETTINGS))).total_bytes;
}

function options(extra: Partial<DiscoverOptions> = {}): DiscoverOptions {
  return {
    env: { HF_ENDPOINT: hub.url, HF_HOME: join(work, "no-hf-home") },
    totalMemoryBytes: 16 * GB,
    planMemory: async (manifest) => planTotal(await writeSkeleton(join(work, "plans"), manifest)),
    ...extra,
  };
}

function byRepo(models: DiscoveredModel[], repo: string): DiscoveredModel {
  const m = models.find((x) => x.repo === repo);
  if (!m) throw new Error(`${repo} not in ${models.map((x) => x.repo).join(", ")}`);
  return m;
}

describe("discoverModels", () => {
  it("lists matches by downloads, judging each: runnable ones with sizes and memory, others with a reason", async () => {
    const result = await discoverModels("tiny", options());
    expect(result.endpoint).toBe(hub.url);
    expect(result.tokenSet).toBe(false);
    expect(result.models.map((m) => m.repo)).toEqual([
      "tiny-org/gemma-4-tiny-moe-4bit",
      "tiny-org/gemma-3-tiny-bf16",
      "tiny-org/gemma-3-tiny-gated",
      "tiny-org/llama-tiny",
      "tiny-org/gemma-3-tiny-gguf",
      "tiny-org/gemma-3-tiny-gptq",
    ]);
    // The search went to HF_ENDPOINT, with the standard parameters.
    const search = hub.log.find((r) => r.url.startsWith("/api/models?"))!;
    const params = new URL(search.url, hub.url).searchParams;
    expect(params.get("search")).toBe("tiny");
    expect(params.get("sort")).toBe("downloads");
    expect(params.getAll("expand")).toEqual(expect.arrayContaining(["config", "siblings"]));

    const moe = byRepo(result.models, "tiny-org/gemma-4-tiny-moe-4bit");
    expect(moe).toMatchObject({
      status: "runnable",
      reason: null,
      family: "gemma4",
      architecture: "Gemma 4",
      format: "MLX 4/8-bit",
      licence: { id: "apache-2.0", name: "apache-2.0", url: null },
      gated: false,
      access: "open",
      fits: true,
    });
    // Download: the metadata files and every shard, as the fixture's files add up.
    const moeDir = join(FIXTURES, "gemma4-moe", "mlx");
    let expected = 0;
    for (const name of await readdir(moeDir)) {
      if (name.endsWith(".safetensors") || (METADATA_FILES as readonly string[]).includes(name))
        expected += (await stat(join(moeDir, name))).size;
    }
    expect(moe.downloadBytes).toBe(expected);

    // Install size and memory: what the real import of the same checkpoint gives.
    const imported = await importCheckpoint(moeDir, join(work, "moe-imported"), {
      durable: false,
    });
    const dataBytes = imported.manifest.files.reduce((a, f) => a + f.size, 0);
    expect(moe.installBytes).toBe(dataBytes);
    expect(moe.memoryBytes).toBe(await planTotal(imported.dir));

    const bf16 = byRepo(result.models, "tiny-org/gemma-3-tiny-bf16");
    expect(bf16).toMatchObject({
      status: "runnable",
      family: "gemma3",
      format: "bf16 (quantized to 4-bit at install)",
      licence: { id: "other", name: "gemma", url: "https://ai.google.dev/gemma/terms" },
    });
    const bf16Imported = await importCheckpoint(
      join(FIXTURES, "gemma3", "bf16"),
      join(work, "bf16-imported"),
      { durable: false },
    );
    expect(bf16.memoryBytes).toBe(await planTotal(bf16Imported.dir));

    expect(byRepo(result.models, "tiny-org/llama-tiny")).toMatchObject({
      status: "unsupported",
      architecture: "Llama",
      reason: "Llama architecture: not supported yet (Redwing runs Gemma 4 and Gemma 3)",
      downloadBytes: null,
      memoryBytes: null,
    });
    expect(byRepo(result.models, "tiny-org/gemma-3-tiny-gguf")).toMatchObject({
      status: "unsupported",
      format: "GGUF",
      reason: expect.stringMatching(/^GGUF only: Redwing reads safetensors/),
    });
    expect(byRepo(result.models, "tiny-org/gemma-3-tiny-gptq")).toMatchObject({
      status: "unsupported",
      reason: expect.stringMatching(/^GPTQ quantization: Redwing reads safetensors/),
    });
    const gated = byRepo(result.models, "tiny-org/gemma-3-tiny-gated");
    expect(gated).toMatchObject({
      status: "unknown",
      gated: true,
      access: "needs_token",
      licence: { id: "gemma" },
      reason: expect.stringContaining("set HF_TOKEN"),
    });
    // The skeletons the engine planned are weightless: sparse files of the install's sizes.
    for (const dir of await readdir(join(work, "plans"))) {
      const weights = await stat(join(work, "plans", dir, "weights.bin"));
      expect(weights.size).toBeGreaterThan(0);
      expect(weights.blocks * 512).toBeLessThan(weights.size);
    }
    // Unsupported results cost no request beyond the search.
    expect(hub.log.some((r) => r.url.includes("llama-tiny"))).toBe(false);
    expect(hub.log.some((r) => r.url.includes("gguf"))).toBe(false);
  }, 60_000);

  it("reads a gated repository with HF_TOKEN, and says so when the token has no access", async () => {
    const withToken = await discoverModels("gated", {
      ...options(),
      env: { HF_ENDPOINT: hub.url, HF_TOKEN: TOKEN },
    });
    expect(withToken.tokenSet).toBe(true);
    expect(withToken.models).toHaveLength(1);
    expect(withToken.models[0]).toMatchObject({
      status: "runnable",
      gated: true,
      access: "granted",
      format: "MLX 4-bit",
    });
    expect(withToken.models[0]!.memoryBytes).toBeGreaterThan(0);

    const wrong = await discoverModels("gated", {
      ...options(),
      env: { HF_ENDPOINT: hub.url, HF_TOKEN: "hf_someone_else" },
    });
    expect(wrong.models[0]).toMatchObject({
      status: "unknown",
      access: "denied",
      reason: expect.stringContaining("accept the licence"),
    });
  }, 30_000);

  it("fits compares the engine's plan with this machine's memory", async () => {
    const small = await discoverModels("moe", options({ totalMemoryBytes: 1000 }));
    expect(small.models[0]).toMatchObject({ status: "runnable", fits: false });
    const none = await discoverModels("moe", options({ planMemory: undefined }));
    expect(none.models[0]).toMatchObject({ status: "runnable", memoryBytes: null, fits: null });
  }, 30_000);

  it("says plainly when the hub is unreachable, rate-limiting or refusing the token", async () => {
    // A port nothing listens on.
    const server = createServer();
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    const port = (server.address() as { port: number }).port;
    await new Promise<void>((r) => server.close(() => r()));
    await expect(
      discoverModels("x", { ...options(), env: { HF_ENDPOINT: `http://127.0.0.1:${port}` } }),
    ).rejects.toMatchObject({ code: "hub_offline", message: expect.stringMatching(/offline/) });

    hub.faults.push({ on: "api", path: "search", action: { kind: "status", status: 429 } });
    await expect(discoverModels("x", options())).rejects.toMatchObject({
      code: "hub_rate_limited",
      message: expect.stringContaining("429"),
    });
    hub.faults.length = 0;
    hub.faults.push({ on: "api", path: "search", action: { kind: "status", status: 401 } });
    await expect(discoverModels("x", options())).rejects.toMatchObject({
      code: "hub_unauthorized",
    });
    hub.faults.length = 0;
  });

  it("stops when its signal is aborted", async () => {
    hub.faults.push({ on: "api", path: "search", action: { kind: "status", status: 500 } });
    const controller = new AbortController();
    const reason = new Error("superseded");
    controller.abort(reason);
    await expect(discoverModels("x", options({ signal: controller.signal }))).rejects.toBe(reason);
    hub.faults.length = 0;
  });
});
