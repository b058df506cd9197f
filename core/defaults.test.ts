/**
 * The defaults live in core/defaults.ts; the README and docs state them in prose, the CLI shows
 * them in its help, the app starts from them. These tests fail when any of them drifts.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { describe, expect, it } from "vitest";
import { registerCommands } from "../cli/commands/index.ts";
import { DEFAULT_SETTINGS } from "./app/api.ts";
import { nativeBinary } from "./native.ts";
import {
  ENGINE_DEFAULTS,
  expertCacheSlotsFor,
  GPU_MISSES,
  OPENAI_SAMPLING_DEFAULTS,
  PERPLEXITY_DEFAULTS,
  SAMPLING_DEFAULTS,
  SERVER_DEFAULTS,
} from "./defaults.ts";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** Each document's default statements: a pattern whose first group is the value, and the value. */
const STATED: Record<string, [RegExp, string | number][]> = {
  "README.md": [
    [/`--temperature` ([\d.]+)/, SAMPLING_DEFAULTS.temperature],
    [/`--top-k` (\d+)/, SAMPLING_DEFAULTS.topK],
    [/`--top-p` ([\d.]+)/, SAMPLING_DEFAULTS.topP],
    [/`--repetition-penalty` ([\d.]+)/, SAMPLING_DEFAULTS.repetitionPenalty],
    [/`--max-new`\s+(\d+)/, SAMPLING_DEFAULTS.maxNewTokens],
    [/`--max-context` (\d+)/, ENGINE_DEFAULTS.context],
    [/`--expert-cache-slots` (\d+) or/, ENGINE_DEFAULTS.expertCacheSlots],
    [/OpenAI-compatible server \(`bin\/redwing serve`, ([\d.]+:\d+)\)/, hostPort()],
  ],
  "docs/server.md": [
    [/\[--host ([\d.]+)\]/, SERVER_DEFAULTS.host],
    [/\[--port (\d+)\]/, SERVER_DEFAULTS.port],
    [/Binds to ([\d.]+:\d+) by default/, hostPort()],
    [/`--queue-limit` \(default (\d+)\)/, SERVER_DEFAULTS.queueLimit],
    [/`--max-body` \(default (\d+) MiB/, SERVER_DEFAULTS.bodyLimitBytes / 2 ** 20],
    [/`--max-context` \(default (\d+)\)/, ENGINE_DEFAULTS.context],
    [/`--expert-cache-slots` \(default (\d+),/, ENGINE_DEFAULTS.expertCacheSlots],
    [/OpenAI's defaults, `temperature` ([\d.]+)/, OPENAI_SAMPLING_DEFAULTS.temperature],
    [/and `top_p` ([\d.]+)/, OPENAI_SAMPLING_DEFAULTS.topP],
    [/with `top_k` (\d+) \(off\)/, OPENAI_SAMPLING_DEFAULTS.topK],
    [/`repetition_penalty` ([\d.]+) \(none\)/, OPENAI_SAMPLING_DEFAULTS.repetitionPenalty],
  ],
};

function hostPort(): string {
  return `${SERVER_DEFAULTS.host}:${SERVER_DEFAULTS.port}`;
}

describe("defaults stated in the README and docs", () => {
  for (const [file, statements] of Object.entries(STATED)) {
    const text = readFileSync(join(ROOT, file), "utf8").replace(/\s+/g, " ");
    for (const [pattern, value] of statements) {
      it(`${file}: ${pattern.source} states ${value}`, () => {
        const m = pattern.exec(text);
        expect(m, `${file} no longer states this default`).not.toBeNull();
        const stated = typeof value === "number" ? Number(m![1]) : m![1];
        expect(stated).toBe(value);
      });
    }
  }
});

/** The default of `--flag` of `redwing <command>`, as commander holds it. */
function optionDefault(command: string, flag: string): unknown {
  const program = new Command();
  registerCommands(program);
  const cmd = program.commands.find((c) => c.name() === command);
  const option = cmd?.options.find((o) => o.long === flag);
  if (!option) throw new Error(`redwing ${command} has no ${flag}`);
  return option.defaultValue;
}

describe("CLI option defaults", () => {
  const cases: [string, string, unknown][] = [
    ["chat", "--temperature", SAMPLING_DEFAULTS.temperature],
    ["chat", "--top-k", SAMPLING_DEFAULTS.topK],
    ["chat", "--top-p", SAMPLING_DEFAULTS.topP],
    ["chat", "--repetition-penalty", SAMPLING_DEFAULTS.repetitionPenalty],
    ["chat", "--max-new", SAMPLING_DEFAULTS.maxNewTokens],
    ["chat", "--max-context", ENGINE_DEFAULTS.context],
    ["complete", "--temperature", SAMPLING_DEFAULTS.temperature],
    ["complete", "--max-context", ENGINE_DEFAULTS.context],
    ["serve", "--host", SERVER_DEFAULTS.host],
    ["serve", "--port", SERVER_DEFAULTS.port],
    ["serve", "--queue-limit", SERVER_DEFAULTS.queueLimit],
    ["serve", "--max-body", SERVER_DEFAULTS.bodyLimitBytes],
    ["serve", "--max-context", ENGINE_DEFAULTS.context],
    ["perplexity", "--context", String(PERPLEXITY_DEFAULTS.window)],
    ["perplexity", "--kv-dtype", ENGINE_DEFAULTS.kvDtype],
    ["perplexity", "--chunk", String(ENGINE_DEFAULTS.prefillChunk)],
    ["logits", "--kv-dtype", ENGINE_DEFAULTS.kvDtype],
    ["perplexity", "--activations", ENGINE_DEFAULTS.activations],
    ["logits", "--activations", ENGINE_DEFAULTS.activations],
    ["chat", "--activations", ENGINE_DEFAULTS.activations],
    ["complete", "--activations", ENGINE_DEFAULTS.activations],
    ["serve", "--activations", ENGINE_DEFAULTS.activations],
    ["logits", "--chunk", String(ENGINE_DEFAULTS.prefillChunk)],
  ];
  for (const [command, flag, value] of cases) {
    it(`redwing ${command} ${flag} defaults to ${value}`, () => {
      expect(optionDefault(command, flag)).toBe(value);
    });
  }

  it("--gpu-misses takes the engine's choices, its help and --gpu-expert-copies' naming the defaults", () => {
    const program = new Command();
    registerCommands(program);
    for (const name of ["chat", "complete", "serve"]) {
      const cmd = program.commands.find((c) => c.name() === name)!;
      const misses = cmd.options.find((o) => o.long === "--gpu-misses")!;
      expect(misses.argChoices).toEqual(["copy", "cpu", "split"]);
      // No commander default: left out, the engine's own applies (the same value).
      expect(misses.defaultValue).toBeUndefined();
      expect(misses.description).toContain(`(default: ${ENGINE_DEFAULTS.gpuMisses})`);
      const copies = cmd.options.find((o) => o.long === "--gpu-expert-copies")!;
      expect(copies.description).toContain(`(default: ${ENGINE_DEFAULTS.gpuExpertCopies})`);
    }
  });

  it("the expert-slot help text names the default", () => {
    const program = new Command();
    registerCommands(program);
    for (const name of ["chat", "complete", "serve", "perplexity"]) {
      const cmd = program.commands.find((c) => c.name() === name)!;
      const slots = cmd.options.find((o) => o.long === "--expert-cache-slots")!;
      expect(slots.description).toContain(`default: ${ENGINE_DEFAULTS.expertCacheSlots}`);
    }
  });
});

describe("the app's default settings", () => {
  it("are the module's", () => {
    expect(DEFAULT_SETTINGS.sampling).toMatchObject(SAMPLING_DEFAULTS);
    expect(DEFAULT_SETTINGS.engine).toMatchObject({
      context: ENGINE_DEFAULTS.context,
      expertCacheSlots: ENGINE_DEFAULTS.expertCacheSlots,
      threads: ENGINE_DEFAULTS.threads,
      backend: ENGINE_DEFAULTS.backend,
      kvDtype: ENGINE_DEFAULTS.kvDtype,
      activations: ENGINE_DEFAULTS.activations,
    });
    expect(DEFAULT_SETTINGS.server.port).toBe(SERVER_DEFAULTS.port);
  });
});

describe("expertCacheSlotsFor", () => {
  it("takes the count asked for, else the default, else none under a memory budget", () => {
    expect(expertCacheSlotsFor(0, undefined)).toBe(0);
    expect(expertCacheSlotsFor(8, 1e9)).toBe(8);
    expect(expertCacheSlotsFor(undefined, undefined)).toBe(ENGINE_DEFAULTS.expertCacheSlots);
    expect(expertCacheSlotsFor(undefined, null)).toBe(ENGINE_DEFAULTS.expertCacheSlots);
    expect(expertCacheSlotsFor(undefined, 1e9)).toBeUndefined();
  });
});

describe("the native engine's defaults (native/src/runtime/defaults.h)", () => {
  it("equal the module's: `redwing-engine defaults --json`", () => {
    const out = execFileSync(nativeBinary("redwing-engine"), ["defaults", "--json"], {
      encoding: "utf8",
    });
    const native = JSON.parse(out) as Record<string, unknown> & {
      sampling: Record<string, unknown>;
    };
    expect({
      context: native.context,
      expertCacheSlots: native.expert_cache_slots,
      threads: native.threads,
      backend: native.backend,
      kvDtype: native.kv_dtype,
      prefillChunk: native.prefill_chunk,
      budgetPrefillChunk: native.budget_prefill_chunk,
      activations: native.activations,
      gpuMisses: native.gpu_misses,
      gpuExpertCopies: native.gpu_expert_copies,
    }).toEqual({
      context: ENGINE_DEFAULTS.context,
      expertCacheSlots: ENGINE_DEFAULTS.expertCacheSlots,
      threads: ENGINE_DEFAULTS.threads,
      backend: ENGINE_DEFAULTS.backend,
      kvDtype: ENGINE_DEFAULTS.kvDtype,
      prefillChunk: ENGINE_DEFAULTS.prefillChunk,
      budgetPrefillChunk: ENGINE_DEFAULTS.budgetPrefillChunk,
      activations: ENGINE_DEFAULTS.activations,
      gpuMisses: ENGINE_DEFAULTS.gpuMisses,
      gpuExpertCopies: ENGINE_DEFAULTS.gpuExpertCopies,
    });
    expect(GPU_MISSES).toContain(native.gpu_misses);
    expect({
      temperature: native.sampling.temperature,
      topK: native.sampling.top_k,
      topP: native.sampling.top_p,
      repetitionPenalty: native.sampling.repetition_penalty,
      maxNewTokens: native.max_new_tokens,
    }).toEqual({
      temperature: SAMPLING_DEFAULTS.temperature,
      topK: SAMPLING_DEFAULTS.topK,
      topP: SAMPLING_DEFAULTS.topP,
      repetitionPenalty: SAMPLING_DEFAULTS.repetitionPenalty,
      maxNewTokens: SAMPLING_DEFAULTS.maxNewTokens,
    });
  });
});
