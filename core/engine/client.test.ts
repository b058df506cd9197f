/**
 * The engine client against the real decode service (redwing-service) on the gemma4-moe fixture
 * model: streaming order, cancellation, prefix reuse (checked against the in-process engine,
 * `redwing-engine generate`, as the cold reference), crash recovery, malformed messages, the
 * per-model lock and exit on parent death.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { greedyGenerateArgs } from "../../bench/generate-report.ts";
import { importCheckpoint } from "../import/index.ts";
import { nativeBinary } from "../native.ts";
import {
  EngineClient,
  EngineCrashError,
  EngineError,
  type EngineClientOptions,
  SERVICE_BINARY,
} from "./client.ts";
import {
  EventSchema,
  type FinishedEvent,
  type GenerateEvent,
  type GenerateParams,
} from "./protocol.ts";

const ROOT = join(import.meta.dirname, "..", "..");
const PROMPT = (
  JSON.parse(readFileSync(join(ROOT, "fixtures", "gemma4-moe", "reference.json"), "utf8")) as {
    prompt: number[];
  }
).prompt;
const THREADS = 2;
const CHUNK = 4; // small chunks: several prefill chunks, and the sliding-window ring wraps

let work = "";
let model = "";
let env: NodeJS.ProcessEnv = {};
const clients: EngineClient[] = [];

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), "redwing-engine-client-"));
  model = join(work, "gemma4-moe");
  await importCheckpoint(join(ROOT, "fixtures", "gemma4-moe", "mlx"), model, { durable: false });
  env = { ...process.env, REDWING_HOME: join(work, "home") };
});

afterEach(async () => {
  await Promise.all(clients.splice(0).map((c) => c.close()));
});

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

async function startClient(options: EngineClientOptions = {}): Promise<EngineClient> {
  const client = await EngineClient.start({ env, ...options });
  clients.push(client);
  return client;
}

async function loadedClient(options: EngineClientOptions = {}): Promise<EngineClient> {
  const client = await startClient(options);
  // Exact products on both sides of the warm/cold comparisons: 8-bit inputs (the default on the
  // head) turn the chunkings' float32 rounding differences into logit changes that can flip a
  // near-tie of this random-weight model.
  await client.load({ model, context: 512, threads: THREADS, chunk: CHUNK, activations: "exact" });
  return client;
}

/** The in-process engine's greedy continuation (the cold reference). */
function coldRun(tokens: number[], maxNew: number): { tokens: number[]; stop_reason: string } {
  const result = spawnSync(
    nativeBinary("redwing-engine"),
    [
      ...greedyGenerateArgs(model, tokens, maxNew),
      ...["--chunk", String(CHUNK), "--threads", String(THREADS), "--activations", "exact"],
    ],
    { encoding: "utf8" },
  );
  if (result.status !== 0) throw new Error(`redwing-engine failed: ${result.stderr}`);
  return JSON.parse(result.stdout) as { tokens: number[]; stop_reason: string };
}

async function collect(
  events: AsyncIterable<GenerateEvent>,
  onEvent?: (event: GenerateEvent, index: number) => void,
): Promise<{ events: GenerateEvent[]; finished: FinishedEvent }> {
  const seen: GenerateEvent[] = [];
  for await (const event of events) {
    onEvent?.(event, seen.length);
    seen.push(event);
  }
  const finished = seen.at(-1);
  if (finished?.type !== "finished") throw new Error("no finished event");
  return { events: seen, finished };
}

const greedy = (
  tokens: number[],
  maxNew: number,
  extra: Partial<GenerateParams> = {},
): GenerateParams => ({
  tokens,
  max_new_tokens: maxNew,
  sampling: { temperature: 0 },
  ...extra,
});

describe("engine client and decode service", () => {
  it("says hello, loads with progress and streams prefill, tokens, finished in order", async () => {
    const client = await startClient();
    expect(client.hello.protocol).toBe(1);
    expect(client.hello.backends).toContain("cpu");
    expect(client.hello.pid).toBe(client.pid);
    const phases: string[] = [];
    const ready = await client.load({ model, context: 512, threads: THREADS, chunk: CHUNK }, (e) =>
      phases.push(e.phase),
    );
    expect(phases[0]).toBe("lock");
    expect(ready.model.vocab_size).toBe(512);
    expect(ready.memory.kv_bytes).toBeGreaterThan(0);
    expect(ready.memory.estimate_bytes).toBeGreaterThan(ready.memory.kv_bytes);

    const { events, finished } = await collect(client.generate(greedy(PROMPT, 12)));
    const kinds = events.map((e) => e.type).filter((t) => t !== "stats");
    const firstToken = kinds.indexOf("tokens");
    expect(kinds.lastIndexOf("prefill")).toBeLessThan(firstToken);
    expect(kinds.at(-1)).toBe("finished");
    const prefill = events.filter((e) => e.type === "prefill");
    expect(prefill.map((e) => e.done)).toEqual(
      Array.from({ length: Math.ceil(PROMPT.length / CHUNK) }, (_, i) =>
        Math.min((i + 1) * CHUNK, PROMPT.length),
      ),
    );
    const streamed = events.flatMap((e) => (e.type === "tokens" ? e.tokens : []));
    expect(streamed).toEqual(finished.tokens);
    const cold = coldRun(PROMPT, 12);
    expect(finished.tokens).toEqual(cold.tokens);
    expect(finished.reason).toBe(cold.stop_reason);
    expect(finished.prefill_tokens).toBe(PROMPT.length);

    const stats = await client.stats();
    expect(stats.generations).toBe(1);
    expect(stats.generated_tokens).toBe(finished.tokens.length);
    expect(stats.memory.rss_bytes).toBeGreaterThan(0);
  });

  it("plans memory without loading, at once while generating, equal to what a load plans", async () => {
    const client = await startClient();
    const settings = { context: 512, chunk: CHUNK, expert_cache_slots: 2, prefix_slack: 8 };
    const plan = await client.plan({ model, ...settings });
    expect(plan.model).toBe(model);
    expect(plan.backend).toBe("cpu");
    expect(plan.slots).toBe(2);
    expect(plan.expert_bytes).toBe(2 * plan.moe_layers * plan.expert_bytes_each);
    expect(plan.core_bytes + plan.kv_bytes + plan.expert_bytes + plan.work_bytes).toBe(
      plan.total_bytes,
    );
    expect((await client.stats()).model).toBeNull(); // nothing was loaded

    // The ring slack and the context reach the KV cache part; the load's figures are the plan's.
    const ready = await client.load({ model, threads: THREADS, ...settings });
    expect(ready.memory.estimate_bytes).toBe(plan.total_bytes);
    expect(ready.memory.kv_bytes).toBe(plan.kv_bytes);
    const noSlack = await client.plan({ model, ...settings, prefix_slack: 0 });
    expect(noSlack.kv_bytes).toBeLessThan(plan.kv_bytes);

    // Answered by the reader while a generation runs: the generation is cancelled only once the
    // plan has come back, so "plan" before "finished" proves it did not wait for the worker.
    const order: string[] = [];
    const abort = new AbortController();
    for await (const e of client.generate(
      { ...greedy(PROMPT, 400), ignore_eos: true },
      { signal: abort.signal },
    )) {
      if (e.type === "tokens" && order.length === 0) {
        order.push("tokens");
        void client.plan({ model, ...settings }).then(() => {
          order.push("plan");
          abort.abort();
        });
      } else if (e.type === "finished") order.push(`finished ${e.reason}`);
    }
    expect(order).toEqual(["tokens", "plan", "finished cancelled"]);

    await expect(client.plan({ model: join(work, "absent") })).rejects.toMatchObject({
      code: "plan_failed",
    });
  });

  it("reuses the longest common prefix, and recomputes when the ring lost it", async () => {
    const client = await loadedClient();
    const first = await client.generateAll(greedy(PROMPT, 8, { ignore_eos: true }));
    expect(first.tokens.length).toBe(8);
    // Continue the conversation: the cache holds PROMPT + the first 7 generated tokens.
    const second = [...PROMPT, ...first.tokens, 17, 99, 4];
    const warm = await client.generateAll(greedy(second, 10));
    expect(warm.cached_tokens).toBe(PROMPT.length + 7);
    expect(warm.prefill_tokens).toBe(second.length - warm.cached_tokens);
    expect(warm.tokens).toEqual(coldRun(second, 10).tokens);

    // Diverging at position 10: the sliding layers' rings (window 4 + chunk 4 = 8 rows) no
    // longer hold positions 7..9, so the whole prompt is recomputed.
    const third = [...PROMPT.slice(0, 10), 5, 6, 7, 8];
    const recomputed = await client.generateAll(greedy(third, 1));
    expect(recomputed.cached_tokens).toBe(0);
    expect(recomputed.prefill_tokens).toBe(third.length);
    expect(recomputed.tokens).toEqual(coldRun(third, 1).tokens);

    // The cache holds exactly `third` (a sampled token is not run): the same prompt again
    // reuses all but its last token, which is run to get the logits.
    const again = await client.generateAll(greedy(third, 6, { ignore_eos: true }));
    expect(again.cached_tokens).toBe(third.length - 1);
    expect(again.prefill_tokens).toBe(1);
    const cold = coldRun(third, 6).tokens; // stops at an EOS, which ignore_eos runs past
    expect(again.tokens.slice(0, cold.length)).toEqual(cold);
    expect(again.tokens.slice(0, 1)).toEqual(recomputed.tokens);

    // Now the cache runs 5 positions past `third`: backing up to position 13 needs positions
    // 10..12, but the 8-row ring holds only 11..18, so the rule recomputes.
    const rerun = await client.generateAll(greedy(third, 6, { ignore_eos: true }));
    expect(rerun.cached_tokens).toBe(0);
    expect(rerun.tokens).toEqual(again.tokens);

    // With 8 rows of slack the rings hold 16 positions: the same back-up reuses the prefix.
    await client.unload();
    const roomy = await client.load({
      model,
      context: 512,
      threads: THREADS,
      chunk: CHUNK,
      prefix_slack: 8,
    });
    expect(roomy.memory.kv_bytes).toBeGreaterThan(0);
    await client.generateAll(greedy(third, 6, { ignore_eos: true }));
    const reused = await client.generateAll(greedy(third, 6, { ignore_eos: true }));
    expect(reused.cached_tokens).toBe(third.length - 1);
    expect(reused.tokens).toEqual(again.tokens);
  });

  it("streams experts from SSD when asked, with the same output and cache statistics", async () => {
    const client = await startClient();
    const ready = await client.load({
      model,
      context: 512,
      threads: THREADS,
      chunk: CHUNK,
      expert_cache_slots: 2,
    });
    expect(ready.expert_cache_slots).toBe(2);
    const before = await client.stats();
    expect(before.expert_cache.hit_rate).toBeNull();
    const finished = await client.generateAll(greedy(PROMPT, 12));
    expect(finished.tokens).toEqual(coldRun(PROMPT, 12).tokens);
    const stats = await client.stats();
    expect(stats.expert_cache.slots).toBe(2);
    expect(stats.expert_cache.hit_rate).toBeGreaterThan(0);
    expect(stats.expert_cache.hit_rate).toBeLessThan(1); // 2 of 8 experts fit: there are misses
    expect(stats.expert_cache.read_bytes_per_token).toBeGreaterThan(0);
    // Waiting on reads is measured (>= 0 ms; the fixture's experts are tiny, so it may round to 0).
    expect(stats.expert_cache.io_wait_ms_per_token).toBeGreaterThanOrEqual(0);
    expect(before.expert_cache.io_wait_ms_per_token).toBeNull();
    // The tiers on the CPU: no GPU slots, every hit a RAM hit, nothing copied to a GPU.
    expect(ready.gpu_expert_slots).toBe(0);
    expect(stats.expert_cache.gpu_slots).toBe(0);
    expect(stats.expert_cache.gpu_hit_rate).toBe(0);
    expect(stats.expert_cache.ram_hit_rate).toBeCloseTo(stats.expert_cache.hit_rate!, 12);
    expect(stats.expert_cache.gpu_copy_bytes_per_token).toBe(0);

    // Periodic stats while decoding, with a growing token count.
    const { events } = await collect(
      client.generate(greedy(PROMPT, 300, { ignore_eos: true, stats_interval_ms: 1 })),
    );
    const periodic = events.filter((e) => e.type === "stats");
    expect(periodic.length).toBeGreaterThan(0);
    const counts = periodic.map((e) => e.tokens_so_far ?? -1);
    expect(counts).toEqual([...counts].sort((a, b) => a - b));
    expect(periodic.every((e) => e.generating && e.expert_cache.slots === 2)).toBe(true);
  });

  it("cancels a running generation through an AbortSignal, and the next one is correct", async () => {
    const client = await loadedClient();
    const controller = new AbortController();
    const { finished } = await collect(
      client.generate(greedy(PROMPT, 400, { ignore_eos: true }), { signal: controller.signal }),
      (event) => {
        if (event.type === "tokens") controller.abort();
      },
    );
    expect(finished.reason).toBe("cancelled");
    expect(finished.tokens.length).toBeGreaterThan(0);
    expect(finished.tokens.length).toBeLessThan(400);
    // The cancelled sequence is a valid cache state: the next request reuses it and is exact.
    const next = [...PROMPT, ...finished.tokens, 11];
    const after = await client.generateAll(greedy(next, 8));
    // Cancelled between tokens: every streamed token was already run through the model.
    expect(after.cached_tokens).toBe(PROMPT.length + finished.tokens.length);
    expect(after.tokens).toEqual(coldRun(next, 8).tokens);

    // Leaving the loop early cancels too; the next request is served normally.
    for await (const event of client.generate(greedy(PROMPT, 400, { ignore_eos: true }))) {
      if (event.type === "tokens") break;
    }
    const last = await client.generateAll(greedy(PROMPT, 5));
    expect(last.tokens).toEqual(coldRun(PROMPT, 5).tokens);
  });

  it("cancels during prefill, between chunks", async () => {
    const client = await startClient();
    await client.load({ model, context: 4096, threads: THREADS, chunk: 1 });
    const long = Array.from({ length: 4000 }, (_, i) => PROMPT[i % PROMPT.length]!);
    const controller = new AbortController();
    const { events, finished } = await collect(
      client.generate(greedy(long, 4), { signal: controller.signal }),
      (event) => {
        if (event.type === "prefill") controller.abort();
      },
    );
    expect(finished.reason).toBe("cancelled");
    expect(finished.tokens).toEqual([]);
    expect(finished.prefill_tokens).toBeLessThan(long.length);
    expect(events.some((e) => e.type === "tokens")).toBe(false);
  });

  it("reports a kill -9 of the service mid-generation, restarts it and serves the next request", async () => {
    const crashes: EngineCrashError[] = [];
    const client = await loadedClient({
      onCrash: (e) => crashes.push(e),
      restart: { initialDelayMs: 50 },
    });
    const firstPid = client.pid!;
    let caught: unknown;
    try {
      await collect(client.generate(greedy(PROMPT, 4000, { ignore_eos: true })), (event) => {
        if (event.type === "tokens") process.kill(firstPid, "SIGKILL");
      });
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(EngineCrashError);
    expect((caught as EngineCrashError).signal).toBe("SIGKILL");
    expect((caught as EngineCrashError).message).toContain("SIGKILL");
    expect(crashes).toHaveLength(1);
    // The restarted service reloads the model by itself.
    const finished = await client.generateAll(greedy(PROMPT, 6));
    expect(client.pid).not.toBe(firstPid);
    expect(finished.tokens).toEqual(coldRun(PROMPT, 6).tokens);
  });

  it("answers malformed messages with coded errors and keeps serving", async () => {
    const child = spawn(nativeBinary(SERVICE_BINARY), [], { env, stdio: ["pipe", "pipe", "pipe"] });
    try {
      const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
      const next = async () => EventSchema.parse(JSON.parse((await lines.next()).value as string));
      const send = (line: string) => child.stdin.write(`${line}\n`);
      send("{this is not json");
      expect(await next()).toMatchObject({ type: "error", code: "bad_json", id: null });
      send('{"type":"fly","id":"a"}');
      expect(await next()).toMatchObject({ type: "error", code: "unknown_type", id: "a" });
      send('{"type":"generate","id":"b","tokens":[1,2]}');
      expect(await next()).toMatchObject({ type: "error", code: "not_loaded", id: "b" });
      send('{"type":"load","id":"c","model":42}');
      expect(await next()).toMatchObject({ type: "error", code: "bad_request", id: "c" });
      send('{"type":"hello","id":"d","protocol":99}');
      expect(await next()).toMatchObject({ type: "error", code: "unsupported_version", id: "d" });
      send("[1,2,3]");
      expect(await next()).toMatchObject({ type: "error", code: "bad_request" });
      send('{"type":"hello","id":"e","protocol":1}');
      expect(await next()).toMatchObject({ type: "hello", id: "e", pid: child.pid });
    } finally {
      child.kill("SIGKILL");
    }
  });

  it("refuses a second engine on the same model, naming the owner's pid", async () => {
    const owner = await loadedClient();
    const other = await startClient();
    const refused = await other.load({ model, context: 64, threads: 1 }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(EngineError);
    expect((refused as EngineError).code).toBe("model_locked");
    expect((refused as EngineError).ownerPid).toBe(owner.pid);
    expect((refused as EngineError).message).toContain(String(owner.pid));
    // Once the owner unloads, the lock is free.
    await owner.unload();
    const ready = await other.load({ model, context: 64, threads: 1 });
    expect(ready.model.dir).toBe(model);
  });

  it("exits when its parent dies (kill -9 of an intermediate process)", async () => {
    // The intermediate starts the service with the test's pipe as its stdin, so the service's
    // input stays open: only the parent-death watch can end it.
    const script = `
      const { spawn } = require("node:child_process");
      const child = spawn(${JSON.stringify(nativeBinary(SERVICE_BINARY))}, [], { stdio: ["inherit", "ignore", "inherit"] });
      child.on("spawn", () => process.stdout.write(child.pid + "\\n"));
      setInterval(() => {}, 1000);`;
    const intermediate: ChildProcess = spawn(process.execPath, ["-e", script], {
      env,
      stdio: ["pipe", "pipe", "inherit"],
    });
    try {
      const lines = createInterface({ input: intermediate.stdout! });
      const line = await lines[Symbol.asyncIterator]().next();
      const servicePid = Number(line.value);
      expect(alive(servicePid)).toBe(true);
      intermediate.kill("SIGKILL");
      const deadline = Date.now() + 5000;
      while (alive(servicePid) && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 50));
      expect(alive(servicePid)).toBe(false);
    } finally {
      intermediate.kill("SIGKILL");
      intermediate.stdin?.end();
    }
  });
});

/** Whether a process exists and is not a zombie (a reaper may be slow to collect it). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return process.platform !== "linux";
  }
}
