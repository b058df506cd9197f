import { mkdtemp, open, readFile, rm } from "node:fs/promises";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dataDir, modelsDir } from "../paths.ts";
import { UserError } from "../errors.ts";
import { type ImportUnit } from "../import/importer.ts";
import { gitBlobId, hubEndpoint, hubToken, normalizeEtag } from "./hub.ts";
import { Journal, readJournal } from "./journal.ts";
import { acquireLock } from "./lock.ts";
import { buildRanges } from "./plan.ts";
import { RetryableError, parseRetryAfter, retryDelay, withRetry } from "./retry.ts";

let root: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-install-units-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("retry", () => {
  it("parses Retry-After as seconds or an HTTP date", () => {
    expect(parseRetryAfter("3")).toBe(3000);
    const now = Date.parse("Wed, 21 Oct 2026 07:28:00 GMT");
    expect(parseRetryAfter("Wed, 21 Oct 2026 07:28:05 GMT", now)).toBe(5000);
    expect(parseRetryAfter("Wed, 21 Oct 2026 07:27:00 GMT", now)).toBe(0);
    expect(parseRetryAfter("soon")).toBeNull();
    expect(parseRetryAfter(null)).toBeNull();
  });

  it("backs off exponentially with full jitter, capped, unless the server said when", () => {
    const p = { attempts: 5, baseDelayMs: 100, maxDelayMs: 1000, maxRetryAfterMs: 5000 };
    expect(retryDelay(p, 1, null, () => 0.999)).toBe(99);
    expect(retryDelay(p, 3, null, () => 0.5)).toBe(200);
    expect(retryDelay(p, 10, null, () => 0.999)).toBe(999);
    expect(retryDelay(p, 1, null, () => 0)).toBe(0);
    expect(retryDelay(p, 2, 2500, () => 0.5)).toBe(2500);
  });

  it("retries retryable errors only, up to the attempt limit", async () => {
    const p = { attempts: 3, baseDelayMs: 1, maxDelayMs: 2, maxRetryAfterMs: 10 };
    /** How many attempts withRetry makes at a call that always throws `error`. */
    const attemptsAt = async (error: Error): Promise<number> => {
      let n = 0;
      await expect(
        withRetry(async () => {
          n++;
          throw error;
        }, p),
      ).rejects.toThrow(error.message);
      return n;
    };
    expect(await attemptsAt(new RetryableError("x"))).toBe(3);
    expect(await attemptsAt(new Error("fatal"))).toBe(1);
    // A Retry-After beyond the limit is not waited for.
    expect(await attemptsAt(new RetryableError("busy", 60_000))).toBe(1);
    expect(
      await withRetry(async (a) => (a < 2 ? Promise.reject(new RetryableError("")) : a), p),
    ).toBe(2);
  });
});

describe("ranges", () => {
  const unit = (start: number, length: number): ImportUnit =>
    ({
      src: { name: "t", dtype: "U8", shape: [length], file: "f", start: 0, nbytes: 1 << 30 },
      offset: start,
      length,
      op: { kind: "copy", file: "weights.bin", at: 0 },
    }) as ImportUnit;

  it("cover the whole file in full mode, never split a unit, never exceed the limit", () => {
    const units = [unit(100, 40), unit(140, 60), unit(400, 30), unit(430, 90), unit(900, 50)];
    const ranges = buildRanges(1000, [0, 1, 2, 3, 4], units, true, 128, 16);
    let pos = 0;
    for (const r of ranges) {
      expect(r.start).toBe(pos);
      expect(r.length).toBeLessThanOrEqual(128);
      pos += r.length;
      for (const id of r.units) {
        const u = units[id]!;
        expect(u.offset).toBeGreaterThanOrEqual(r.start);
        expect(u.offset + u.length).toBeLessThanOrEqual(r.start + r.length);
      }
    }
    expect(pos).toBe(1000);
    expect(ranges.flatMap((r) => r.units)).toEqual([0, 1, 2, 3, 4]);
  });

  it("fetch only needed bytes in ranges mode, bridging small gaps", () => {
    const units = [unit(100, 40), unit(150, 60), unit(400, 30), unit(900, 50)];
    const ranges = buildRanges(1000, [0, 1, 2, 3], units, false, 256, 16);
    expect(ranges.map((r) => [r.start, r.length, r.units])).toEqual([
      [100, 110, [0, 1]],
      [400, 30, [2]],
      [900, 50, [3]],
    ]);
  });
});

describe("hub helpers", () => {
  it("git blob ids match git's (empty blob, hello)", () => {
    expect(gitBlobId(new Uint8Array())).toBe("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    expect(gitBlobId(Buffer.from("hello\n"))).toBe("ce013625030ba8dba906f756967f9e9ca394464a");
  });

  it("normalize ETags; read HF_ENDPOINT and HF_TOKEN like huggingface_hub", async () => {
    expect(normalizeEtag('W/"abc"')).toBe("abc");
    expect(normalizeEtag('"abc"')).toBe("abc");
    expect(normalizeEtag(null)).toBeNull();
    expect(hubEndpoint({})).toBe("https://huggingface.co");
    expect(hubEndpoint({ HF_ENDPOINT: "https://hf-mirror.com/" })).toBe("https://hf-mirror.com");
    expect(() => hubEndpoint({ HF_ENDPOINT: "ftp://x" })).toThrow(UserError);
    expect(hubToken({ HF_TOKEN: " hf_a ", HF_HOME: root })).toBe("hf_a");
    expect(hubToken({ HUGGING_FACE_HUB_TOKEN: "hf_b", HF_HOME: root })).toBe("hf_b");
    expect(hubToken({ HF_HOME: root })).toBeNull();
    const h = await open(join(root, "token"), "w");
    await h.writeFile("hf_file\n");
    await h.close();
    expect(hubToken({ HF_HOME: root })).toBe("hf_file");
  });
});

describe("paths", () => {
  it("REDWING_HOME, XDG_DATA_HOME, macOS and Windows data directories", () => {
    expect(dataDir({ REDWING_HOME: "/data/rw" }, "linux", "/home/u")).toBe("/data/rw");
    expect(dataDir({}, "linux", "/home/u")).toBe("/home/u/.local/share/redwing");
    expect(dataDir({ XDG_DATA_HOME: "/x" }, "linux", "/home/u")).toBe("/x/redwing");
    expect(dataDir({ XDG_DATA_HOME: "rel" }, "linux", "/home/u")).toBe(
      "/home/u/.local/share/redwing",
    );
    expect(dataDir({}, "darwin", "/Users/u")).toBe("/Users/u/Library/Application Support/Redwing");
    expect(modelsDir({}, "linux", "/home/u")).toBe("/home/u/.local/share/redwing/models");
  });
});

describe("journal and lock", () => {
  it("ignore a torn last journal line and continue after it", async () => {
    const path = join(root, "journal.jsonl");
    const j = await Journal.create(path, { v: 1, repo: "r", commit: "c", plan: "p" }, true);
    await j.add({ r: 0, src: "a", out: "b" });
    await j.close();
    const h = await open(path, "a");
    await h.write('{"r":1,"src":"tor');
    await h.close();
    expect((await readJournal(path))!.entries).toEqual([{ r: 0, src: "a", out: "b" }]);
    const j2 = await Journal.append(path, true);
    await j2.add({ r: 1, src: "c", out: "d" });
    await j2.close();
    const back = await readJournal(path);
    expect(back!.header.plan).toBe("p");
    expect(back!.entries).toEqual([
      { r: 0, src: "a", out: "b" },
      { r: 1, src: "c", out: "d" },
    ]);
  });

  it("refuses a live owner and takes over a dead one's lock", async () => {
    const path = join(root, "x.lock");
    // The parent process is alive and is not us.
    const h = await open(path, "w");
    await h.writeFile(JSON.stringify({ pid: process.ppid, host: hostname(), started: "then" }));
    await h.close();
    await expect(acquireLock(path, "x")).rejects.toThrow(
      /another installer \(pid \d+, started then\)/,
    );
    // A pid that cannot exist (above the kernel's pid_max): stale.
    const h2 = await open(path, "w");
    await h2.writeFile(JSON.stringify({ pid: 2 ** 30, host: hostname(), started: "then" }));
    await h2.close();
    const lock = await acquireLock(path, "x");
    expect(JSON.parse(await readFile(path, "utf8")).pid).toBe(process.pid);
    await expect(acquireLock(path, "x")).rejects.toThrow(/already being installed by this process/);
    await lock.release();
    await expect(readFile(path)).rejects.toThrow();
  });
});
