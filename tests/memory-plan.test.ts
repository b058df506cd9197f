/**
 * One memory plan (issue 15): `redwing-engine memory`, `redwing models` and the app's Tuning
 * view (settings.memoryPlan) print the same figures for the same model and settings, because
 * all three come from native/src/runtime/memory_plan.cpp (the CLI and the app through the
 * service's plan request). Each is run as a user runs it: the engine binary, the real
 * `bin/redwing` with a private REDWING_HOME, and the app controller.
 */
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { API, type EngineSettings, type MemoryPlan } from "../core/app/api.ts";
import { createAppController, type AppController } from "../core/app/controller.ts";
import { ensureDemoModel } from "../core/demo/demo.ts";
import { nativeBinary } from "../core/native.ts";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const BIN = join(ROOT, "bin", "redwing");
const ENGINE = nativeBinary("redwing-engine");
const haveEngine = existsSync(ENGINE) && existsSync(nativeBinary("redwing-service"));
const run = promisify(execFile);

/** The parts every front end lists, which must add up to the total. */
interface Parts {
  weights: number;
  kv: number;
  experts: number;
  work: number;
  total: number;
  slots: number;
}

interface Case {
  name: string;
  engine: string[];
  cli: string[];
  app: Partial<EngineSettings>;
}

const BUDGET = 75 * 1024 * 1024;
const CASES: Case[] = [
  {
    name: "context 512, 4 expert slots, f32 KV cache",
    engine: ["--context", "512", "--expert-cache-slots", "4", "--kv-dtype", "f32"],
    cli: ["--context", "512", "--expert-cache-slots", "4", "--kv-dtype", "f32"],
    app: { context: 512, expertCacheSlots: 4, kvDtype: "f32", memoryBudgetBytes: null },
  },
  {
    name: "the defaults: context 4096, 16 slots, f16",
    engine: ["--context", "4096", "--expert-cache-slots", "16"],
    cli: [],
    app: { context: 4096, expertCacheSlots: 16, kvDtype: "f16", memoryBudgetBytes: null },
  },
  {
    // 75 MiB: the demo's core, KV cache and working memory with some slots, not all 32.
    name: "a 75 MiB memory budget picks the slots",
    engine: ["--context", "1024", "--memory-budget", "75M"],
    cli: ["--context", "1024", "--memory-budget", "75M"],
    app: { context: 1024, memoryBudgetBytes: BUDGET },
  },
];

let home: string;
let dir: string;
let app: AppController;

beforeAll(async () => {
  if (!haveEngine) return;
  home = await mkdtemp(join(tmpdir(), "redwing-plan-"));
  dir = await ensureDemoModel(join(home, "models", "demo"));
  app = await createAppController({
    shell: "web",
    dataDir: join(home, "app"),
    modelsDir: join(home, "models"),
    autoLoad: false,
    power: null,
    log: () => {},
  });
}, 120_000);

afterAll(async () => {
  await app?.close();
  if (home) await rm(home, { recursive: true, force: true });
});

async function fromEngine(args: string[]): Promise<Parts> {
  const { stdout } = await run(ENGINE, ["memory", "--model", dir, ...args]);
  const p = JSON.parse(stdout) as Record<string, number>;
  return {
    weights: p.core_bytes!,
    kv: p.kv_bytes!,
    experts: p.expert_bytes!,
    work: p.work_bytes!,
    total: p.total_bytes!,
    slots: p.slots!,
  };
}

async function fromCli(args: string[]): Promise<Parts> {
  const { stdout } = await run(BIN, ["models", "--json", ...args], {
    env: { ...process.env, REDWING_HOME: home },
  });
  const rows = JSON.parse(stdout) as {
    name: string;
    memory_estimate_bytes: number;
    memory_plan: Record<string, number>;
  }[];
  expect(rows.map((r) => r.name)).toEqual(["demo"]);
  const p = rows[0]!.memory_plan;
  expect(rows[0]!.memory_estimate_bytes).toBe(p.total_bytes);
  return {
    weights: p.weights_bytes!,
    kv: p.kv_bytes!,
    experts: p.expert_bytes!,
    work: p.work_bytes!,
    total: p.total_bytes!,
    slots: p.expert_cache_slots!,
  };
}

async function fromApp(engine: Partial<EngineSettings>): Promise<Parts> {
  const params = API["settings.memoryPlan"].params.parse({ model: "demo", engine });
  const plan: MemoryPlan = API["settings.memoryPlan"].result.parse(
    await app.call("settings.memoryPlan", params),
  );
  return {
    weights: plan.weightsBytes,
    kv: plan.kvBytes,
    experts: plan.expertCacheBytes,
    work: plan.workBytes,
    total: plan.totalBytes,
    slots: plan.expertCacheSlots!,
  };
}

describe.skipIf(!haveEngine)("one memory plan: engine, CLI and app agree", () => {
  const seen: Parts[] = [];
  for (const c of CASES) {
    it(
      c.name,
      async () => {
        const engine = await fromEngine(c.engine);
        const cli = await fromCli(c.cli);
        const ui = await fromApp(c.app);
        expect(cli).toEqual(engine);
        expect(ui).toEqual(engine);
        // Every part is listed: the parts add up to the total.
        expect(engine.weights + engine.kv + engine.experts + engine.work).toBe(engine.total);
        expect(engine.weights).toBeGreaterThan(0);
        expect(engine.work).toBeGreaterThan(0);
        seen.push(engine);
      },
      60_000,
    );
  }

  it("the settings reach the plan (the cases differ where they should)", () => {
    expect(seen).toHaveLength(CASES.length);
    const [small, defaults, budget] = seen as [Parts, Parts, Parts];
    expect(small.slots).toBe(4);
    expect(defaults.slots).toBe(16);
    expect(defaults.kv).not.toBe(small.kv);
    expect(small.experts * 4).toBe(defaults.experts);
    // The budget picked the most slots that fit it: one more would not.
    expect(budget.slots).toBeGreaterThan(1);
    expect(budget.slots).toBeLessThan(32);
    expect(budget.total).toBeLessThanOrEqual(BUDGET);
    expect(budget.total + budget.experts / budget.slots).toBeGreaterThan(BUDGET);
  });
});
