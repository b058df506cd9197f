/**
 * The installer against a local hub (testkit/test-hub.ts, 127.0.0.1 only) with injected faults. Every
 * run must end either in a model directory byte-identical to `importCheckpoint` of the same
 * checkpoint, or in a clear error with nothing at the destination.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, open, readFile, readdir, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { UserError } from "../errors.ts";
import { importCheckpoint } from "../import/importer.ts";
import {
  TINY_GEMMA3,
  TINY_GEMMA4_MOE,
  writeTinyCheckpoint,
  type CheckpointOptions,
  type TinySpec,
} from "../../testkit/checkpoints.ts";
import {
  discardPartial,
  hasPartial,
  installModel,
  installPaths,
  startInstall,
  type InstallOptions,
  type InstallProgress,
} from "./installer.ts";
import { waitForPlacedRange } from "../../testkit/install.ts";
import { TestHub } from "../../testkit/test-hub.ts";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const CREATED_BY = "redwing test";

let root: string;
let hub: TestHub;
let counter = 0;

interface Source {
  repo: string;
  commit: string;
  dir: string;
  /** importCheckpoint of the same checkpoint, with repo and commit recorded. */
  reference: string;
}
const sources: Record<string, Source> = {};

async function addSource(
  name: string,
  spec: TinySpec,
  options: CheckpointOptions,
  repoOptions: Parameters<TestHub["addRepo"]>[2] = {},
): Promise<Source> {
  const dir = join(root, `ckpt-${name}`);
  await writeTinyCheckpoint(dir, spec, options);
  return addDir(name, dir, repoOptions);
}

async function addDir(
  name: string,
  dir: string,
  repoOptions: Parameters<TestHub["addRepo"]>[2] = {},
): Promise<Source> {
  const repo = `test/${name}`;
  const commit = await hub.addRepoFromDir(repo, dir, repoOptions);
  const reference = join(root, `ref-${name}`);
  await importCheckpoint(dir, reference, {
    durable: false,
    repo,
    revision: commit,
    createdBy: CREATED_BY,
  });
  const s = { repo, commit, dir, reference };
  sources[name] = s;
  return s;
}

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-install-"));
  hub = await TestHub.start();
  // MLX (bytes copied) and bf16 (quantized while installing), sharded, with a vision tower.
  await addSource("moe-mlx", TINY_GEMMA4_MOE, {
    form: "nested",
    kind: "mlx",
    shards: 2,
    vision: true,
  });
  await addSource("moe-bf16", TINY_GEMMA4_MOE, {
    form: "nested",
    kind: "float",
    shards: 2,
    vision: true,
  });
  await addSource("gemma3-bf16", TINY_GEMMA3, { form: "flat", kind: "float" });
});

afterAll(async () => {
  await hub?.close();
  await rm(root, { recursive: true, force: true });
});

beforeEach(() => {
  hub.faults.length = 0;
});

function dest(): string {
  return join(root, "models", `m${counter++}`);
}

/** Every later data request trickles in `chunkBytes` pieces, `delayMs` apart. */
function slowData(chunkBytes: number, delayMs: number): void {
  hub.faults.push({ on: "data", minStart: 1, action: { kind: "trickle", chunkBytes, delayMs } });
}

const FAST: InstallOptions = {
  createdBy: CREATED_BY,
  maxRangeBytes: 64 * 1024,
  unitBytes: 16 * 1024,
  reserveBytes: 0,
  durable: false,
  hub: {
    retry: { attempts: 4, baseDelayMs: 5, maxDelayMs: 20, maxRetryAfterMs: 3000 },
    stallTimeoutMs: 1500,
  },
};

function options(extra: InstallOptions = {}): InstallOptions {
  return {
    ...FAST,
    ...extra,
    env: { HF_ENDPOINT: hub.url, ...extra.env },
    hub: { ...FAST.hub, ...extra.hub },
  };
}

function install(
  source: Source,
  to: string,
  extra: InstallOptions = {},
  revision: string | null = null,
): ReturnType<typeof installModel> {
  return installModel({ repo: source.repo, revision, dest: to }, options(extra));
}

async function listFiles(dir: string, rel = ""): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(join(dir, rel), { withFileTypes: true })) {
    const path = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...(await listFiles(dir, path)));
    else out.push(path);
  }
  return out.sort();
}

/** Same file names and the same bytes in every file, manifest included. */
async function expectSameAsImport(dir: string, source: Source): Promise<void> {
  const got = await listFiles(dir);
  expect(got).toEqual(await listFiles(source.reference));
  for (const f of got) {
    const a = await readFile(join(dir, f));
    const b = await readFile(join(source.reference, f));
    expect(a.equals(b), `${f} differs from importCheckpoint's`).toBe(true);
  }
}

/** Nothing that looks installed: no destination, and no manifest in the staging area. */
async function expectNotInstalled(to: string): Promise<void> {
  expect(existsSync(to)).toBe(false);
  expect(existsSync(join(installPaths(to).model, "manifest.json"))).toBe(false);
}

async function expectUserError(p: Promise<unknown>, code: string, message: RegExp): Promise<void> {
  let error: unknown;
  try {
    await p;
  } catch (e) {
    error = e;
  }
  expect(error, "expected the install to fail").toBeInstanceOf(UserError);
  expect((error as UserError).code).toBe(code);
  expect((error as UserError).message).toMatch(message);
}

describe("installs", () => {
  it("MLX and bf16 checkpoints, byte-identical to importCheckpoint", async () => {
    for (const name of ["moe-mlx", "moe-bf16", "gemma3-bf16"]) {
      const s = sources[name]!;
      const to = dest();
      const phases = new Set<string>();
      const r = await install(s, to, { onProgress: (p) => phases.add(p.phase) });
      await expectSameAsImport(to, s);
      expect(r.commit).toBe(s.commit);
      expect(r.manifest.source.revision).toBe(s.commit);
      expect(r.uncheckedShards).toEqual([]);
      expect(r.verifiedShards.length).toBeGreaterThan(0);
      expect([...phases]).toEqual(
        expect.arrayContaining(["resolving", "planning", "downloading", "finishing", "done"]),
      );
      // Only the staging area's own files are gone; nothing else is left next to the model.
      expect(
        (await readdir(join(to, ".."))).filter((e) => e.includes(`${to.split("/").pop()}.`)),
      ).toEqual([]);
    }
  });

  it("sends the token to the hub only, follows relative redirects, resolves branches", async () => {
    const s = await addDir("gated", sources["moe-mlx"]!.dir, { token: "hf_secret" });
    hub.renames.set("test/old-name", s.repo);
    const before = hub.log.length;
    const to = dest();
    const r = await installModel(
      { repo: "test/old-name", revision: "main", dest: to },
      options({ env: { HF_TOKEN: "hf_secret" } }),
    );
    const log = hub.log.slice(before);
    expect(log.some((l) => l.status === 307)).toBe(true);
    expect(log.filter((l) => l.server === "hub").every((l) => l.authorization)).toBe(true);
    expect(log.some((l) => l.server === "cdn")).toBe(true);
    expect(hub.cdnSawAuthorization).toBe(false);
    expect(r.commit).toBe(s.commit);
    // The manifest records the name asked for; the bytes are the same checkpoint's.
    expect(r.manifest.source.repo).toBe("test/old-name");
    expect(
      (await readFile(join(to, "weights.bin"))).equals(
        await readFile(join(s.reference, "weights.bin")),
      ),
    ).toBe(true);
  });

  it("in ranges mode skips the vision tower and still installs the same bytes", async () => {
    const s = sources["moe-bf16"]!;
    const full = await install(s, dest());
    const to = dest();
    const r = await install(s, to, { verify: "ranges" });
    await expectSameAsImport(to, s);
    expect(r.fetchedBytes).toBeLessThan(full.fetchedBytes);
    expect(r.uncheckedShards.length).toBeGreaterThan(0);
  });

  it("reference fixtures (MLX and bf16) install like they import", async () => {
    const fixtures = join(ROOT, "fixtures");
    for (const name of ["gemma4-moe/mlx", "gemma4-moe/bf16", "gemma3/bf16"]) {
      const dir = join(fixtures, name);
      if (!existsSync(dir)) continue;
      const s = await addDir(`fx-${name.replace("/", "-")}`, dir);
      const to = dest();
      await install(s, to);
      await expectSameAsImport(to, s);
    }
  });
});

describe.runIf(existsSync(join(ROOT, "native/build/redwing-engine")))("engine", () => {
  /** `bin/redwing logits` of a model directory (stdout). */
  function logits(dir: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const child = spawn(
        process.execPath,
        [
          join(ROOT, "bin/redwing"),
          "logits",
          "--model",
          dir,
          "--tokens",
          "2,3,4",
          "--kv-dtype",
          "f32",
        ],
        { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] },
      );
      let out = "";
      child.stdout.on("data", (d: Buffer) => (out += d.toString()));
      child.once("error", reject);
      child.once("exit", (code) => (code === 0 ? resolve(out) : reject(new Error(`exit ${code}`))));
    });
  }

  it("gives the same logits for the installed and the imported model", async () => {
    for (const name of ["moe-mlx", "moe-bf16"]) {
      const s = sources[name]!;
      const to = dest();
      await install(s, to);
      const [a, b] = await Promise.all([logits(to), logits(s.reference)]);
      const rows = (JSON.parse(a) as { logits: number[][] }).logits;
      expect(rows).toHaveLength(3);
      expect(rows.every((r) => r.length === 256 && r.every(Number.isFinite))).toBe(true);
      expect(a).toBe(b);
    }
  });
});

describe("faults", () => {
  it("connections dropped mid-body are retried", async () => {
    const s = sources["moe-mlx"]!;
    hub.faults.push({
      on: "data",
      ranged: true,
      minStart: 1,
      action: { kind: "drop", afterBytes: 1000 },
      times: 3,
    });
    const to = dest();
    const r = await install(s, to);
    await expectSameAsImport(to, s);
    expect(r.retries).toBeGreaterThanOrEqual(3);
  });

  it("500 and 503 are retried, honouring Retry-After", async () => {
    const s = sources["moe-mlx"]!;
    hub.faults.push(
      { on: "api", action: { kind: "status", status: 500 }, times: 1 },
      { on: "resolve", action: { kind: "status", status: 502 }, times: 1 },
      {
        on: "data",
        minStart: 1,
        action: { kind: "status", status: 503, retryAfter: "1" },
        times: 1,
      },
    );
    const before = hub.log.length;
    const to = dest();
    const r = await install(s, to);
    await expectSameAsImport(to, s);
    expect(r.retries).toBeGreaterThanOrEqual(3);
    // The retry of the 503'd range came no sooner than Retry-After said.
    const log = hub.log.slice(before);
    const i = log.findIndex((l) => l.status === 503);
    const again = log.slice(i + 1).find((l) => l.range === log[i]!.range && l.server === "cdn");
    expect(again!.t - log[i]!.t).toBeGreaterThanOrEqual(950);
  });

  it("a spurious 416 is retried; a 416 for another file size stops the install", async () => {
    const s = sources["moe-mlx"]!;
    hub.faults.push({ on: "data", minStart: 1, action: { kind: "status", status: 416 }, times: 1 });
    const to = dest();
    await install(s, to);
    await expectSameAsImport(to, s);
    hub.faults.length = 0;
    hub.faults.push({
      on: "data",
      minStart: 1,
      action: { kind: "status", status: 416, contentRange: "bytes */12" },
    });
    const to2 = dest();
    await expectUserError(install(s, to2), "source_changed", /changed during the install/);
    await expectNotInstalled(to2);
  });

  it("a server that ignores Range is detected and still gives the same install", async () => {
    const s = sources["moe-bf16"]!;
    hub.faults.push({ on: "data", action: { kind: "ignore-range" } });
    const notes: string[] = [];
    const to = dest();
    await install(s, to, { onProgress: (p) => p.note && notes.push(p.note) });
    await expectSameAsImport(to, s);
    expect(notes.some((n) => /ignores HTTP Range/.test(n))).toBe(true);
  });

  it("bytes altered in transit are caught by the shard's SHA-256 and fetched again", async () => {
    const s = sources["moe-mlx"]!;
    hub.faults.push({ on: "data", minStart: 70_000, action: { kind: "alter" }, times: 1 });
    const notes: string[] = [];
    const to = dest();
    await install(s, to, { onProgress: (p) => p.note && notes.push(p.note) });
    await expectSameAsImport(to, s);
    expect(notes.some((n) => /did not match its SHA-256/.test(n))).toBe(true);
  });

  it("bytes altered every time end in a clear error and no model", async () => {
    const s = sources["moe-mlx"]!;
    hub.faults.push({ on: "data", path: /00002/, minStart: 1, action: { kind: "alter", at: 3 } });
    const to = dest();
    await expectUserError(install(s, to), "source_corrupt", /does not match the hub's SHA-256/);
    await expectNotInstalled(to);
  });

  it("trickle-slow bodies complete; a stalled body times out and is retried", async () => {
    const s = sources["moe-mlx"]!;
    hub.faults.push(
      {
        on: "data",
        minStart: 1,
        action: { kind: "trickle", chunkBytes: 4096, delayMs: 2 },
        times: 4,
      },
      { on: "data", minStart: 1, action: { kind: "stall", afterBytes: 100, ms: 5000 }, times: 1 },
    );
    const to = dest();
    const r = await install(s, to, { hub: { stallTimeoutMs: 300 } });
    await expectSameAsImport(to, s);
    expect(r.retries).toBeGreaterThanOrEqual(1);
  });

  it("a file that changes mid-way (ETag, commit) stops the install; a rerun resumes", async () => {
    const s = sources["moe-mlx"]!;
    const to = dest();
    /** The install stops with source_changed and leaves nothing installed. */
    const refused = async (message: RegExp): Promise<void> => {
      await expectUserError(install(s, to, { concurrency: 1 }), "source_changed", message);
      await expectNotInstalled(to);
      hub.faults.length = 0;
    };
    hub.faults.push({ on: "data", minStart: 1, skip: 3, action: { kind: "etag", etag: "other" } });
    await refused(/changed on the server/);
    hub.faults.push({
      on: "resolve",
      path: /00002/,
      skip: 1,
      action: { kind: "commit", commit: "f".repeat(40) },
    });
    await refused(/refusing to mix commits/);
    const r = await install(s, to);
    expect(r.reusedBytes).toBeGreaterThan(0);
    await expectSameAsImport(to, s);
  });
});

describe("resume", () => {
  it("after SIGKILL, fetches only what is missing and re-verifies what is there", async () => {
    const s = sources["moe-bf16"]!;
    const to = dest();
    slowData(8192, 5);
    const child = spawn(
      process.execPath,
      [
        "--import",
        "tsx",
        join(ROOT, "testkit/install-child.ts"),
        JSON.stringify({ repo: s.repo, dest: to, options: { ...options(), durable: true } }),
      ],
      { cwd: ROOT, stdio: "ignore" },
    );
    const exited = new Promise<void>((r) => child.once("exit", () => r()));
    const journal = installPaths(to).journal;
    for (let i = 0; i < 600; i++) {
      const lines = existsSync(journal) ? (await readFile(journal, "utf8")).split("\n").length : 0;
      if (lines >= 8) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    child.kill("SIGKILL");
    await exited;
    hub.faults.length = 0;
    expect(existsSync(to)).toBe(false);
    expect(await hasPartial(to)).toBe(true);
    // Damage one placed range on disk: the resume must notice and fetch it again.
    const entries = (await readFile(journal, "utf8"))
      .trim()
      .split("\n")
      .slice(1)
      .map((l) => JSON.parse(l) as { r: number });
    expect(entries.length).toBeGreaterThanOrEqual(3);
    const weights = join(installPaths(to).model, "weights.bin");
    const h = await open(weights, "r+");
    await h.write(Buffer.from([0xde, 0xad]), 0, 2, 0);
    await h.close();
    const before = hub.dataBytes;
    const notes: string[] = [];
    const r = await install(s, to, { onProgress: (p) => p.note && notes.push(p.note) });
    await expectSameAsImport(to, s);
    expect(r.reusedBytes).toBeGreaterThan(0);
    // Only what was missing (and the damaged range) came over the wire the second time.
    expect(r.fetchedBytes).toBeLessThan(r.rangeBytes);
    expect(r.reusedBytes + r.fetchedBytes).toBeGreaterThanOrEqual(r.rangeBytes);
    expect(hub.dataBytes - before).toBe(r.fetchedBytes + r.metadataBytes);
    expect(notes.some((n) => /damaged on disk/.test(n))).toBe(true);
    expect(existsSync(installPaths(to).lock)).toBe(false);
  });

  it("cancel keeps the partial download; pause stops requests until resume", async () => {
    const s = sources["moe-mlx"]!;
    const to = dest();
    slowData(4096, 5);
    const controller = new AbortController();
    let ranges = 0;
    const p = install(s, to, {
      signal: controller.signal,
      concurrency: 2,
      onProgress: (e) => {
        if (e.phase === "downloading" && e.bytesDone > 150_000 && ranges++ === 0)
          controller.abort();
      },
    });
    await expectUserError(p, "interrupted", /cancelled; run the same command again to resume/);
    await expectNotInstalled(to);
    expect(await hasPartial(to)).toBe(true);

    const progress: InstallProgress[] = [];
    const task = startInstall(
      { repo: s.repo, dest: to },
      options({ concurrency: 2, onProgress: (e) => progress.push(e) }),
    );
    while (!progress.some((e) => e.phase === "downloading" && e.bytesDone > 0))
      await new Promise((r) => setTimeout(r, 5));
    task.pause();
    expect(task.paused).toBe(true);
    await new Promise((r) => setTimeout(r, 100));
    const during = hub.log.length;
    await new Promise((r) => setTimeout(r, 300));
    expect(hub.log.length).toBe(during);
    expect(progress.some((e) => e.phase === "paused")).toBe(true);
    hub.faults.length = 0;
    task.resume();
    const r = await task.result;
    expect(r.reusedBytes).toBeGreaterThan(0);
    await expectSameAsImport(to, s);
  });

  it("a moved branch resumes the commit it started with", async () => {
    const s = sources["moe-mlx"]!;
    const repo = "test/moving";
    const files = new Map<string, Buffer>();
    for (const f of await readdir(s.dir)) files.set(f, await readFile(join(s.dir, f)));
    const firstCommit = hub.addRepo(repo, files);
    const to = dest();
    const controller = new AbortController();
    slowData(4096, 5);
    const first = installModel(
      { repo, revision: "main", dest: to },
      options({ signal: controller.signal }),
    );
    // Interrupted once a range is placed: that is what the resume below must reuse.
    expect(await waitForPlacedRange(to, first)).toBe(true);
    controller.abort();
    await expectUserError(first, "interrupted", /cancelled/);
    hub.faults.length = 0;
    const changed = new Map(files);
    changed.set("README.md", Buffer.from("new commit"));
    const second = hub.addRepo(repo, changed);
    expect(second).not.toBe(firstCommit);
    const notes: string[] = [];
    const r = await installModel(
      { repo, revision: "main", dest: to },
      options({ onProgress: (e) => e.note && notes.push(e.note) }),
    );
    expect(r.commit).toBe(firstCommit);
    expect(r.reusedBytes).toBeGreaterThan(0);
    expect(notes.some((n) => n.includes("now points at"))).toBe(true);
  });
});

describe("errors", () => {
  it("say what to do for gated repositories, unknown names, revisions and files", async () => {
    await addDir("gated2", sources["moe-mlx"]!.dir, { token: "hf_right" });
    const g = sources["gated2"]!;
    await expectUserError(install(g, dest()), "gated", /accept the licence.*set HF_TOKEN/);
    await expectUserError(
      install(g, dest(), { env: { HF_TOKEN: "hf_wrong" } }),
      "gated",
      /token in HF_TOKEN has no access/,
    );
    await expectUserError(
      installModel({ repo: "test/nope", dest: dest() }, options()),
      "repo_not_found",
      /test\/nope was not found/,
    );
    await expectUserError(
      install(sources["moe-mlx"]!, dest(), {}, "no-such-branch"),
      "revision_not_found",
      /revision no-such-branch was not found/,
    );
    // An index that names a shard the repository lacks.
    const files = new Map<string, Buffer>();
    const d = sources["moe-mlx"]!.dir;
    for (const f of await readdir(d))
      if (!f.startsWith("model-00002")) files.set(f, await readFile(join(d, f)));
    hub.addRepo("test/missing-shard", files);
    await expectUserError(
      installModel({ repo: "test/missing-shard", dest: dest() }, options()),
      "checkpoint_incomplete",
      /model-00002-of-00002.safetensors is listed in model.safetensors.index.json/,
    );
  });

  it("reject unsupported architectures before downloading tensors", async () => {
    const files = new Map<string, Buffer>([
      [
        "config.json",
        Buffer.from(JSON.stringify({ model_type: "llama", architectures: ["LlamaForCausalLM"] })),
      ],
      ["model.safetensors", Buffer.alloc(64)],
    ]);
    hub.addRepo("test/llama", files);
    const before = hub.log.length;
    const to = dest();
    await expectUserError(
      installModel({ repo: "test/llama", dest: to }, options()),
      "unsupported_model",
      /llama/,
    );
    // Nothing to resume: no staging area, no lock.
    expect(existsSync(installPaths(to).staging)).toBe(false);
    expect(existsSync(installPaths(to).lock)).toBe(false);
    expect(hub.log.slice(before).some((l) => l.url.includes("safetensors"))).toBe(false);
  });

  it("say when the network is unreachable", async () => {
    const dead = await TestHub.start();
    const url = dead.url;
    await dead.close();
    await expectUserError(
      installModel({ repo: "test/x", dest: dest() }, options({ env: { HF_ENDPOINT: url } })),
      "network",
      /cannot reach http:\/\/127\.0\.0\.1:\d+ \(ECONNREFUSED\).*check the network connection/,
    );
  });

  it("check free space first; a full disk keeps the partial for --discard-partial or a resume", async () => {
    const s = sources["moe-mlx"]!;
    const to = dest();
    const before = hub.log.length;
    await expectUserError(
      install(s, to, { testHooks: { freeBytes: () => 1000 } }),
      "no_space",
      /not enough free space/,
    );
    expect(
      hub.log
        .slice(before)
        .some((l) => l.server === "cdn" && l.range !== null && !l.range.startsWith("bytes=0-")),
    ).toBe(false);
    let writes = 0;
    const enospc = (): void => {
      if (++writes > 5)
        throw Object.assign(new Error("no space left on device"), { code: "ENOSPC" });
    };
    await expectUserError(
      install(s, to, { testHooks: { beforeWrite: enospc } }),
      "no_space",
      /no space left on the disk.*partial install is kept/,
    );
    await expectNotInstalled(to);
    expect(await hasPartial(to)).toBe(true);
    const removed = await discardPartial(to);
    expect(removed).toEqual([installPaths(to).staging]);
    expect(await hasPartial(to)).toBe(false);
    expect(existsSync(installPaths(to).lock)).toBe(false);
  });

  it("one installer per model; an installed model needs --force", async () => {
    const s = sources["moe-mlx"]!;
    const to = dest();
    slowData(4096, 10);
    const first = install(s, to);
    await new Promise((r) => setTimeout(r, 200));
    await expectUserError(install(s, to), "install_locked", /already being installed/);
    await expectUserError(discardPartial(to), "install_locked", /already being installed/);
    await first;
    hub.faults.length = 0;
    await expectUserError(install(s, to), "destination_exists", /already installed.*--force/);
    const st = await stat(join(to, "weights.bin"));
    await install(s, to, { force: true });
    await expectSameAsImport(to, s);
    expect((await stat(join(to, "weights.bin"))).ino).not.toBe(st.ino);
  });
});

/** Peak growth of this process's RSS while `work` runs, sampled every 10 ms. */
async function rssGrowthDuring<T>(
  work: Promise<T>,
): Promise<{ result: PromiseSettledResult<T>; growth: number }> {
  const base = process.memoryUsage().rss;
  let peak = base;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 10);
  const [result] = await Promise.allSettled([work]);
  clearInterval(timer);
  peak = Math.max(peak, process.memoryUsage().rss);
  return { result, growth: peak - base };
}

describe("a hostile hub", () => {
  it("an endless revision API body ends in a clear error, with bounded memory", async () => {
    hub.faults.push({ on: "api", action: { kind: "endless" } });
    const to = dest();
    const { result, growth } = await rssGrowthDuring(install(sources["moe-mlx"]!, to));
    expect(result.status).toBe("rejected");
    const error = (result as PromiseRejectedResult).reason as UserError;
    expect(error).toBeInstanceOf(UserError);
    expect(error.code).toBe("hub_protocol");
    expect(error.message).toMatch(/sent more than 33554432 bytes for the revision API/);
    // The cap (32 MiB) plus the process's own noise; an unbounded reader grows without end.
    expect(growth).toBeLessThan(200 * 1024 * 1024);
    await expectNotInstalled(to);
  }, 60_000);

  it("a metadata file the listing claims at 2.1 GB is refused before any allocation", async () => {
    hub.faults.push({
      on: "api",
      action: { kind: "claim-size", file: "tokenizer.json", size: 2_100_000_000 },
    });
    const to = dest();
    const before = hub.log.length;
    const { result, growth } = await rssGrowthDuring(install(sources["moe-mlx"]!, to));
    expect(result.status).toBe("rejected");
    const error = (result as PromiseRejectedResult).reason as UserError;
    expect(error).toBeInstanceOf(UserError);
    expect(error.code).toBe("file_too_large");
    expect(error.message).toMatch(/tokenizer\.json at 2100000000 bytes.*at most 67108864/);
    expect(growth).toBeLessThan(200 * 1024 * 1024);
    // Not retried: one listing, no fetch of the file.
    expect(hub.log.slice(before).filter((l) => l.url.includes("tokenizer.json"))).toEqual([]);
    await expectNotInstalled(to);
  });

  it("a redirect to file:// is refused as what it is, not reported as a network error", async () => {
    hub.faults.push({
      on: "resolve",
      path: "config.json",
      action: { kind: "redirect", location: "file:///etc/passwd" },
    });
    const to = dest();
    await expectUserError(
      install(sources["moe-mlx"]!, to),
      "hub_protocol",
      /redirected .*config\.json to file:\/\/\/etc\/passwd, which is not an http\(s\) URL/,
    );
    await expectNotInstalled(to);
  });
});
