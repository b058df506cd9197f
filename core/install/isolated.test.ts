/**
 * Installs on a worker thread (the app's downloads): the same model as in the app's own thread,
 * progress and cancel across the thread boundary, and a worker that runs out of memory ends its
 * install with a clear error while this process carries on.
 */
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { UserError } from "../errors.ts";
import { readModelDir } from "../format/read.ts";
import { TINY_GEMMA4_MOE, writeTinyCheckpoint } from "../../testkit/checkpoints.ts";
import { hasPartial, type InstallProgress } from "./installer.ts";
import { startInstallInWorker, type IsolatedInstallOptions } from "./isolated.ts";
import { TestHub } from "../../testkit/test-hub.ts";

let root: string;
let hub: TestHub;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-isolated-"));
  hub = await TestHub.start();
  const ckpt = join(root, "ckpt");
  await writeTinyCheckpoint(ckpt, TINY_GEMMA4_MOE, { form: "nested", kind: "float", shards: 2 });
  await hub.addRepoFromDir("test/tiny", ckpt);
});

afterAll(async () => {
  await hub?.close();
  await rm(root, { recursive: true, force: true });
});

function options(extra: IsolatedInstallOptions = {}): IsolatedInstallOptions {
  return {
    createdBy: "redwing test",
    maxRangeBytes: 64 * 1024,
    unitBytes: 16 * 1024,
    reserveBytes: 0,
    durable: false,
    env: { HF_ENDPOINT: hub.url },
    hub: {
      retry: { attempts: 3, baseDelayMs: 5, maxDelayMs: 20, maxRetryAfterMs: 1000 },
      stallTimeoutMs: 1500,
    },
    ...extra,
  };
}

describe("startInstallInWorker", () => {
  it("installs a verified model and reports progress from the worker", async () => {
    const dest = join(root, "models", "a");
    const progress: InstallProgress[] = [];
    const result = await startInstallInWorker(
      { repo: "test/tiny", dest },
      options({ onProgress: (p) => progress.push(p) }),
    ).result;
    expect(result.dir).toBe(dest);
    expect(result.manifest.source.repo).toBe("test/tiny");
    await readModelDir(dest, { verifyHashes: true });
    expect(progress.some((p) => p.phase === "downloading")).toBe(true);
  }, 60_000);

  it("cancel stops it and keeps the partial download", async () => {
    hub.faults.push({
      on: "data",
      minStart: 1,
      action: { kind: "trickle", chunkBytes: 2048, delayMs: 5 },
    });
    const dest = join(root, "models", "b");
    let started = (): void => undefined;
    const downloading = new Promise<void>((resolve) => (started = resolve));
    const task = startInstallInWorker(
      { repo: "test/tiny", dest },
      options({ onProgress: (p) => p.bytesDone > 0 && started() }),
    );
    const result = task.result;
    result.catch(() => undefined);
    await downloading;
    task.cancel();
    await expect(result).rejects.toBeInstanceOf(Error);
    hub.faults.length = 0;
    expect(await hasPartial(dest)).toBe(true);
    expect(existsSync(dest)).toBe(false);
  }, 60_000);

  it("a worker that runs out of memory ends its install with a clear error; this process goes on", async () => {
    const dest = join(root, "models", "c");
    let error: unknown = null;
    try {
      // 8 MiB of heap: not even enough to load the installer.
      await startInstallInWorker({ repo: "test/tiny", dest }, options({ heapLimitMb: 8 })).result;
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(UserError);
    expect((error as UserError).code).toBe("install_out_of_memory");
    expect((error as Error).message).toMatch(/ran out of memory/);
    expect(existsSync(dest)).toBe(false);
    // Still here, and still able to install.
    const ok = await startInstallInWorker(
      { repo: "test/tiny", dest: join(root, "models", "d") },
      options(),
    ).result;
    expect(ok.manifest.architecture.num_layers).toBe(TINY_GEMMA4_MOE.layers);
  }, 60_000);
});
