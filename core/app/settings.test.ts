/**
 * Settings through the real conf store in a temporary directory: defaults, patches, the v0
 * migration, damaged files, and when a reload is needed.
 */
import { existsSync } from "node:fs";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AppInfoSchema, DEFAULT_SETTINGS, SettingsPatchSchema, SettingsSchema } from "./api.ts";
import { createAppController } from "./controller.ts";
import {
  applyPatch,
  engineSettingsDiffer,
  installedModelDefaults,
  modelDefaults,
  openSettingsStore,
  readSettings,
  saveChanged,
  settingsStoreOptions,
  switchModel,
} from "./settings.ts";
import { CATALOG } from "../catalog/catalog.ts";
import type { Manifest } from "../format/manifest.ts";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "redwing-settings-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function fileJson(): Promise<Record<string, unknown>> {
  return JSON.parse(await readFile(join(dir, "settings.json"), "utf8")) as Record<string, unknown>;
}

describe("settings store", () => {
  it("starts from the defaults and keeps a patch across reopening", () => {
    const first = openSettingsStore(dir);
    expect(first.recoveredFrom).toBeNull();
    const { settings, repaired } = readSettings(first.store);
    expect(repaired).toEqual([]);
    expect(settings).toEqual(DEFAULT_SETTINGS);

    const next = applyPatch(settings, {
      sampling: { temperature: 0.7, seed: 42 },
      engine: { context: 8192 },
      server: { port: 9090 },
    });
    // Nested sections are merged, not replaced.
    expect(next.sampling).toEqual({ ...DEFAULT_SETTINGS.sampling, temperature: 0.7, seed: 42 });
    expect(next.server).toEqual({ enabled: false, port: 9090 });
    saveChanged(first.store, settings, next);

    const again = readSettings(openSettingsStore(dir).store);
    expect(again.settings).toEqual(next);
    expect(SettingsSchema.parse(again.settings)).toEqual(next);
  });

  it("rejects a patch that breaks the schema", () => {
    expect(() => applyPatch(DEFAULT_SETTINGS, { sampling: { topP: 3 } })).toThrow();
  });

  it("migrates the v0 flat shape into sections", async () => {
    await writeFile(
      join(dir, "settings.json"),
      JSON.stringify({ temperature: 1.3, topK: 7, contextLength: 2048, model: "gemma-3-4b-it" }),
    );
    const { settings } = readSettings(openSettingsStore(dir).store);
    expect(settings.sampling.temperature).toBe(1.3);
    expect(settings.sampling.topK).toBe(7);
    expect(settings.sampling.topP).toBe(DEFAULT_SETTINGS.sampling.topP);
    expect(settings.engine.context).toBe(2048);
    expect(settings.activeModel).toBe("gemma-3-4b-it");
    const json = await fileJson();
    expect(json).not.toHaveProperty("temperature");
    expect(json).not.toHaveProperty("contextLength");
    // conf records the migration, so it does not run again.
    expect(json.__internal__).toEqual({
      migrations: { version: settingsStoreOptions().projectVersion },
    });
  });

  it("fills fields a section lacks (a file from an older version) with defaults", async () => {
    await writeFile(
      join(dir, "settings.json"),
      JSON.stringify({
        sampling: { temperature: 0.5 },
        __internal__: { migrations: { version: "0.1.0" } },
      }),
    );
    const { settings, repaired } = readSettings(openSettingsStore(dir).store);
    expect(repaired).toEqual([]);
    expect(settings.sampling).toEqual({ ...DEFAULT_SETTINGS.sampling, temperature: 0.5 });
  });

  it("keeps a GPU memory budget, reads a file without one as none, and refuses a negative size", async () => {
    const beforeVram: Partial<typeof DEFAULT_SETTINGS.engine> = { ...DEFAULT_SETTINGS.engine };
    delete beforeVram.vramBudgetBytes;
    await writeFile(
      join(dir, "settings.json"),
      JSON.stringify({
        engine: { ...beforeVram, context: 8192 },
        __internal__: { migrations: { version: "0.1.0" } },
      }),
    );
    const opened = openSettingsStore(dir);
    const { settings, repaired } = readSettings(opened.store);
    expect(repaired).toEqual([]);
    expect(settings.engine.vramBudgetBytes).toBeNull();
    expect(settings.engine.context).toBe(8192);
    const next = applyPatch(settings, { engine: { vramBudgetBytes: 4 * 1024 ** 3 } });
    saveChanged(opened.store, settings, next);
    expect(readSettings(openSettingsStore(dir).store).settings.engine.vramBudgetBytes).toBe(
      4 * 1024 ** 3,
    );
    expect(SettingsPatchSchema.safeParse({ engine: { vramBudgetBytes: -1 } }).success).toBe(false);
    expect(() => applyPatch(next, { engine: { vramBudgetBytes: -1 } })).toThrow();
    // A patch that leaves it out keeps it; null clears it.
    expect(applyPatch(next, { engine: { context: 4096 } }).engine.vramBudgetBytes).toBe(
      4 * 1024 ** 3,
    );
    expect(applyPatch(next, { engine: { vramBudgetBytes: null } }).engine.vramBudgetBytes).toBe(
      null,
    );
  });

  it("keeps where the GPU's misses run, reads a file without it as the engine's default, and refuses a bad count", async () => {
    const before: Partial<typeof DEFAULT_SETTINGS.engine> = { ...DEFAULT_SETTINGS.engine };
    delete before.gpuMisses;
    delete before.gpuExpertCopies;
    await writeFile(
      join(dir, "settings.json"),
      JSON.stringify({
        engine: { ...before, backend: "vulkan", vramBudgetBytes: 2 * 1024 ** 3 },
        models: { other: { engine: before, sampling: DEFAULT_SETTINGS.sampling } },
        __internal__: { migrations: { version: "0.1.0" } },
      }),
    );
    const opened = openSettingsStore(dir);
    const { settings, repaired } = readSettings(opened.store);
    expect(repaired).toEqual([]);
    // The engine's defaults: the misses split between the GPU (two a layer) and the CPU.
    expect(settings.engine).toMatchObject({
      backend: "vulkan",
      vramBudgetBytes: 2 * 1024 ** 3,
      gpuMisses: "split",
      gpuExpertCopies: 2,
    });
    // Another model's saved settings too (the store's defaults do not reach into them).
    expect(settings.models.other?.engine).toMatchObject({ gpuMisses: "split", gpuExpertCopies: 2 });
    // Each of the engine's choices is taken and saved.
    for (const gpuMisses of ["cpu", "split"] as const) {
      const chosen = applyPatch(settings, { engine: { gpuMisses, gpuExpertCopies: 3 } });
      saveChanged(opened.store, settings, chosen);
      expect(readSettings(openSettingsStore(dir).store).settings.engine).toMatchObject({
        gpuMisses,
        gpuExpertCopies: 3,
      });
    }
    const next = applyPatch(settings, { engine: { gpuMisses: "copy", gpuExpertCopies: 0 } });
    saveChanged(opened.store, settings, next);
    expect(readSettings(openSettingsStore(dir).store).settings.engine).toMatchObject({
      gpuMisses: "copy",
      gpuExpertCopies: 0,
    });
    // A patch that leaves them out keeps them.
    const patch = SettingsPatchSchema.parse({ engine: { context: 8192 } });
    expect(applyPatch(next, patch).engine).toMatchObject({ gpuMisses: "copy", gpuExpertCopies: 0 });
    // A bad count or choice is refused, with a message that says what is wrong.
    const refused = (engine: Record<string, unknown>): string => {
      const r = SettingsPatchSchema.safeParse({ engine });
      expect(r.success, JSON.stringify(engine)).toBe(false);
      return r.error?.issues[0]?.message ?? "";
    };
    expect(refused({ gpuExpertCopies: -1 })).toBe("experts copied to the GPU cannot be negative");
    expect(refused({ gpuExpertCopies: 1.5 })).toBe(
      "experts copied to the GPU must be a whole number",
    );
    expect(refused({ gpuExpertCopies: 129 })).toBe("experts copied to the GPU are at most 128");
    for (const gpuMisses of ["gpu", "Split", "", null, 1]) {
      expect(refused({ gpuMisses })).toBe('Invalid option: expected one of "copy"|"cpu"|"split"');
    }
    expect(() => applyPatch(next, { engine: { gpuExpertCopies: -1 } })).toThrow(/negative/);
    const bad = { engine: { gpuMisses: "gpu" } } as unknown as Parameters<typeof applyPatch>[1];
    expect(() => applyPatch(next, bad)).toThrow(/"engine",\s*"gpuMisses"/);
  });

  it("keeps the stop strings across a sampling patch that leaves them out; a file without them has none", async () => {
    await writeFile(
      join(dir, "settings.json"),
      JSON.stringify({
        sampling: { ...DEFAULT_SETTINGS.sampling, temperature: 0.4, stop: undefined },
        __internal__: { migrations: { version: "0.1.0" } },
      }),
    );
    const opened = openSettingsStore(dir);
    const { settings } = readSettings(opened.store);
    expect(settings.sampling).toEqual({ ...DEFAULT_SETTINGS.sampling, temperature: 0.4, stop: [] });
    const withStop = applyPatch(settings, { sampling: { stop: ["\n\n", "END"] } });
    saveChanged(opened.store, settings, withStop);
    const patch = SettingsPatchSchema.parse({ sampling: { temperature: 0.9 } });
    const next = applyPatch(withStop, patch);
    expect(next.sampling.stop).toEqual(["\n\n", "END"]);
    saveChanged(opened.store, withStop, next);
    expect(readSettings(openSettingsStore(dir).store).settings.sampling).toMatchObject({
      temperature: 0.9,
      stop: ["\n\n", "END"],
    });
  });

  it("keeps every saved engine setting across an engine patch that leaves it out", () => {
    // The API parses each patch: a field with a default must not come back from the parse as
    // that default, or the patch would reset it.
    for (const [key, value] of Object.entries(DEFAULT_SETTINGS.engine)) {
      const parsed = SettingsPatchSchema.parse({ engine: { [key]: value } });
      expect(Object.keys(parsed.engine ?? {}), key).toEqual([key]);
    }
    const exact = applyPatch(DEFAULT_SETTINGS, { engine: { activations: "exact" } });
    const patch = SettingsPatchSchema.parse({ engine: { context: 2048 } });
    expect(applyPatch(exact, patch).engine).toMatchObject({ context: 2048, activations: "exact" });
  });

  it("keeps a damaged file aside and starts from the defaults", async () => {
    for (const bad of ["{ not json", JSON.stringify({ sampling: { temperature: "hot" } })]) {
      await rm(dir, { recursive: true, force: true });
      dir = await mkdtemp(join(tmpdir(), "redwing-settings-"));
      await writeFile(join(dir, "settings.json"), bad);
      const opened = openSettingsStore(dir);
      expect(opened.recoveredFrom).toMatch(/settings\.json\.corrupt-/);
      expect(opened.problem).toBeTruthy();
      expect(await readFile(opened.recoveredFrom!, "utf8")).toBe(bad);
      expect(readSettings(opened.store).settings).toEqual(DEFAULT_SETTINGS);
      expect((await readdir(dir)).filter((f) => f.includes("corrupt"))).toHaveLength(1);
      expect(existsSync(join(dir, "settings.json"))).toBe(true);
    }
  });

  it("replaces an invalid section read through another store with its default", () => {
    const values: Record<string, unknown> = {
      ...structuredClone(DEFAULT_SETTINGS),
      engine: { context: 12 },
    };
    const store = {
      get: (k: string) => values[k],
      set: (k: string, v: unknown) => void (values[k] = v),
    };
    const { settings, repaired } = readSettings(store);
    expect(repaired).toEqual(["engine"]);
    expect(settings.engine).toEqual(DEFAULT_SETTINGS.engine);
  });
});

describe("the controller's settings", () => {
  it("reports a damaged settings file in app.info and starts from the defaults", async () => {
    await writeFile(join(dir, "settings.json"), "{ damaged");
    const lines: string[] = [];
    const app = await createAppController({
      shell: "web",
      dataDir: dir,
      modelsDir: join(dir, "models"),
      autoLoad: false,
      power: null,
      log: (l) => lines.push(l),
    });
    try {
      const info = AppInfoSchema.parse(await app.call("app.info", {}));
      expect(info.notices?.[0]).toMatch(
        /settings file could not be read.*settings\.json\.corrupt-/,
      );
      expect(lines.join("\n")).toMatch(/corrupt-/);
      expect(await app.call("settings.get", {})).toEqual(DEFAULT_SETTINGS);
      const r = await app.call("settings.update", { sampling: { topK: 5 } });
      expect(r).toEqual({
        settings: { ...DEFAULT_SETTINGS, sampling: { ...DEFAULT_SETTINGS.sampling, topK: 5 } },
        reloadNeeded: false, // nothing loaded
      });
      const reset = await app.call("settings.reset", {});
      expect(reset).toEqual(DEFAULT_SETTINGS);
      await expect(app.call("settings.memoryPlan", { model: "absent" })).rejects.toMatchObject({
        error: { code: "model_not_found" },
      });
    } finally {
      await app.close();
    }
  });
});

describe("engineSettingsDiffer", () => {
  const base = DEFAULT_SETTINGS.engine;
  it("is false for equal settings and true for each field a load uses", () => {
    expect(engineSettingsDiffer(base, { ...base })).toBe(false);
    expect(engineSettingsDiffer({ ...base, context: 8192 }, base)).toBe(true);
    expect(engineSettingsDiffer({ ...base, kvDtype: "f32" }, base)).toBe(true);
    expect(engineSettingsDiffer({ ...base, threads: 2 }, base)).toBe(true);
    expect(engineSettingsDiffer({ ...base, expertCacheSlots: 8 }, base)).toBe(true);
    expect(engineSettingsDiffer({ ...base, memoryBudgetBytes: 2e9 }, base)).toBe(true);
  });
  it("ignores the slot count while a memory budget picks it", () => {
    const budget = { ...base, memoryBudgetBytes: 2e9 };
    expect(engineSettingsDiffer({ ...budget, expertCacheSlots: 32 }, budget)).toBe(false);
  });
  it("reloads for a GPU memory budget on a GPU backend, not on the CPU (which ignores it)", () => {
    const vulkan = { ...base, backend: "vulkan" as const };
    expect(engineSettingsDiffer({ ...vulkan, vramBudgetBytes: 4e9 }, vulkan)).toBe(true);
    expect(
      engineSettingsDiffer(
        { ...vulkan, vramBudgetBytes: 4e9 },
        { ...vulkan, vramBudgetBytes: 2e9 },
      ),
    ).toBe(true);
    const auto = { ...base, backend: "auto" as const };
    expect(engineSettingsDiffer({ ...auto, vramBudgetBytes: 4e9 }, auto)).toBe(true);
    const cpu = { ...base, backend: "cpu" as const };
    expect(engineSettingsDiffer({ ...cpu, vramBudgetBytes: 4e9 }, cpu)).toBe(false);
    // On a GPU the budget picks the slots, as the memory budget does.
    const budget = { ...vulkan, vramBudgetBytes: 4e9 };
    expect(engineSettingsDiffer({ ...budget, expertCacheSlots: 32 }, budget)).toBe(false);
    expect(engineSettingsDiffer({ ...cpu, expertCacheSlots: 32, vramBudgetBytes: 4e9 }, cpu)).toBe(
      true,
    );
  });
  it("reloads for where the GPU's misses run only where a load sends it: a GPU memory budget on a GPU", () => {
    const streamed = {
      ...base,
      backend: "vulkan" as const,
      vramBudgetBytes: 2e9,
      gpuMisses: "copy" as const,
    };
    const hybrid = { ...streamed, gpuMisses: "cpu" as const };
    expect(engineSettingsDiffer(hybrid, streamed)).toBe(true);
    expect(engineSettingsDiffer({ ...hybrid, gpuExpertCopies: 0 }, hybrid)).toBe(true);
    expect(
      engineSettingsDiffer({ ...hybrid, backend: "metal" }, { ...streamed, backend: "metal" }),
    ).toBe(true);
    // Split computes on the GPU what cpu computes on the CPU: a load of its own, and its count
    // (the misses the GPU takes) asks for one too.
    const split = { ...streamed, gpuMisses: "split" as const };
    expect(engineSettingsDiffer(split, hybrid)).toBe(true);
    expect(engineSettingsDiffer(split, streamed)).toBe(true);
    expect(engineSettingsDiffer({ ...split, gpuExpertCopies: 3 }, split)).toBe(true);
    expect(engineSettingsDiffer({ ...split }, split)).toBe(false);
    // The copies count only with "cpu" and "split".
    expect(engineSettingsDiffer({ ...streamed, gpuExpertCopies: 4 }, streamed)).toBe(false);
    // The CPU and a GPU without a budget ignore both.
    for (const other of [
      { ...base, backend: "cpu" as const, vramBudgetBytes: 2e9 },
      { ...base, backend: "vulkan" as const },
    ]) {
      for (const gpuMisses of ["cpu", "split"] as const) {
        expect(engineSettingsDiffer({ ...other, gpuMisses, gpuExpertCopies: 3 }, other)).toBe(
          false,
        );
      }
    }
  });
});

describe("settings per model", () => {
  it("an older file without per-model settings reads with none; they go to its model at the first switch", async () => {
    const old = { ...structuredClone(DEFAULT_SETTINGS), activeModel: "a" } as Partial<
      typeof DEFAULT_SETTINGS
    >;
    delete old.models;
    old.engine = { ...DEFAULT_SETTINGS.engine, context: 8192 };
    await writeFile(join(dir, "settings.json"), JSON.stringify(old));
    const { settings, repaired } = readSettings(openSettingsStore(dir).store);
    expect(repaired).toEqual([]);
    expect(settings.models).toEqual({});
    const defaults = await modelDefaults(dir, 2048);
    const switched = switchModel(settings, "a", "b", defaults);
    expect(switched.models.a?.engine.context).toBe(8192);
    expect(switched.engine.context).toBe(2048);
    // And back: "a" gets its own settings again, "b" keeps what it had.
    const back = switchModel(
      applyPatch(switched, { engine: { kvDtype: "f32" } }),
      "b",
      "a",
      defaults,
    );
    expect(back.engine.context).toBe(8192);
    expect(back.models.b?.engine.kvDtype).toBe("f32");
  });

  it("defaults come from the model's generation_config.json where its values are in range", async () => {
    await writeFile(
      join(dir, "generation_config.json"),
      JSON.stringify({ temperature: 0.6, top_k: 20, top_p: 0.95, repetition_penalty: 7 }),
    );
    const own = await modelDefaults(dir, 131072);
    expect(own.sampling.temperature).toBe(0.6);
    expect(own.sampling.topK).toBe(20);
    expect(own.sampling.topP).toBe(0.95);
    // Out of range (1..2): the default stands.
    expect(own.sampling.repetitionPenalty).toBe(DEFAULT_SETTINGS.sampling.repetitionPenalty);
    expect(own.engine.context).toBe(DEFAULT_SETTINGS.engine.context);
    const none = await modelDefaults(join(dir, "missing"), 1024);
    expect(none.sampling).toEqual(DEFAULT_SETTINGS.sampling);
    expect(none.engine.context).toBe(1024);
  });

  it("the catalog entry's recommended sampling comes first, then generation_config, then the defaults", async () => {
    await writeFile(
      join(dir, "generation_config.json"),
      JSON.stringify({ temperature: 0.6, top_k: 20, top_p: 0.9 }),
    );
    // The catalog recommends temperature and top-k (one out of range: the file's value stands).
    const own = await modelDefaults(dir, 4096, { temperature: 1.0, topK: 5000 });
    expect(own.sampling.temperature).toBe(1.0);
    expect(own.sampling.topK).toBe(20);
    expect(own.sampling.topP).toBe(0.9);
    expect(own.sampling.repetitionPenalty).toBe(DEFAULT_SETTINGS.sampling.repetitionPenalty);
    const catalogOnly = await modelDefaults(join(dir, "missing"), 4096, { topP: 0.5 });
    expect(catalogOnly.sampling).toEqual({ ...DEFAULT_SETTINGS.sampling, topP: 0.5 });
  });

  it("an installed Gemma from the catalog starts from Google's recommended sampling", async () => {
    const gemma = CATALOG.find((c) => c.id === "gemma-3-4b-it");
    expect(gemma?.kind).toBe("hub");
    const manifest = {
      created_by: "redwing install",
      source: { kind: "hub", repo: gemma!.kind === "hub" ? gemma!.repo : "" },
      architecture: { max_position_embeddings: 131072 },
    } as unknown as Manifest;
    const own = await installedModelDefaults("gemma-3-4b-it-4bit", dir, manifest);
    expect(own.sampling).toMatchObject({ temperature: 1.0, topK: 64, topP: 0.95 });
    // Anything not from the catalog: generation_config and the defaults only.
    const other = await installedModelDefaults("mine", dir, {
      ...manifest,
      source: { kind: "hub", repo: "someone/else" },
    } as unknown as Manifest);
    expect(other.sampling).toEqual(DEFAULT_SETTINGS.sampling);
  });
});
