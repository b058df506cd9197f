// bench/llama-cpu-moe.ts: how llama.cpp --n-cpu-moe is sized to a GPU budget and run beside
// `npm run bench -- gpu-streaming`. No llama.cpp here: a stand-in llama-bench (a Node script)
// records its arguments and answers in llama-bench's JSON.
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import {
  cpuMoeLayers,
  ggufGpuBytes,
  LLAMA_GPU_ALLOWANCE_BYTES,
  llamaBenchBinary,
  parseLlamaBenchJson,
  runLlamaCpuMoe,
} from "../bench/llama-cpu-moe.ts";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const GIB = 1024 ** 3;
const MIB = 1024 ** 2;
const dir = mkdtempSync(join(tmpdir(), "redwing-llama-cpu-moe-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("llama.cpp --n-cpu-moe beside the GPU streaming bench", () => {
  it("sizes the GGUF's GPU share from its tensors: 1,292 MiB of core weights, 408 MiB of experts a layer", () => {
    // The CUDA buffers llama.cpp logged for this GGUF at -ncmoe 30 on the H200 (docs/gpu.md):
    // weights 1,292 MiB; each layer's experts 408 MiB.
    const { coreBytes, layerExpertBytes } = ggufGpuBytes(30);
    expect(coreBytes / MIB).toBeCloseTo(1292.3, 0);
    expect(layerExpertBytes / MIB).toBeCloseTo(408.4, 0);
    // The core does not depend on how many layers' experts there are, only on the layers.
    expect(ggufGpuBytes(6).layerExpertBytes).toBe(layerExpertBytes);
    expect(ggufGpuBytes(6).coreBytes).toBeLessThan(coreBytes);
  });

  it("keeps on the CPU the fewest layers whose experts let the rest fit the budget", () => {
    // The N the hand-sized runs of docs/gpu.md used at 2, 4 and 8 GiB.
    expect(cpuMoeLayers(2 * GIB, 30)).toBe(30);
    expect(cpuMoeLayers(4 * GIB, 30)).toBe(25);
    expect(cpuMoeLayers(8 * GIB, 30)).toBe(15);
    // Enough for everything: no layer on the CPU; less than the core: every layer.
    expect(cpuMoeLayers(64 * GIB, 30)).toBe(0);
    expect(cpuMoeLayers(256 * MIB, 30)).toBe(30);
    // Exactly one more layer's experts of room moves one layer to the GPU.
    const sizes = { coreBytes: 1000 * MIB, layerExpertBytes: 100 * MIB };
    const base = 1000 * MIB + LLAMA_GPU_ALLOWANCE_BYTES;
    expect(cpuMoeLayers(base + 99 * MIB, 10, sizes)).toBe(10);
    expect(cpuMoeLayers(base + 100 * MIB, 10, sizes)).toBe(9);
    expect(cpuMoeLayers(base + 350 * MIB, 10, sizes)).toBe(7);
  });

  it("reads llama-bench's JSON: the generation rows, their -ncmoe and rate", () => {
    const rows = parseLlamaBenchJson(
      JSON.stringify([
        { n_cpu_moe: 30, n_prompt: 512, n_gen: 0, avg_ts: 900.5, stddev_ts: 3, model_type: "x" },
        { n_cpu_moe: 30, n_prompt: 0, n_gen: 32, avg_ts: 39.72, stddev_ts: 0.04, model_type: "x" },
        { n_cpu_moe: 15, n_prompt: 0, n_gen: 32, avg_ts: 69.74, stddev_ts: 6.48 },
      ]),
    );
    expect(rows).toEqual([
      { n_cpu_moe: 30, n_gen: 32, avg_ts: 39.72, stddev_ts: 0.04 },
      { n_cpu_moe: 15, n_gen: 32, avg_ts: 69.74, stddev_ts: 6.48 },
    ]);
    // What a real llama-bench (the source node-llama-cpp 3.22.1 bundles, CUDA, on the H200)
    // printed for `-ngl 99 -ncmoe 30,25 -p 0 -n 16 -r 1 -t 16 -o json` on the synthetic GGUF
    // (its whitespace reformatted by prettier).
    const real = readFileSync(
      join(ROOT, "bench", "testdata", "llama-bench-ncmoe-h200.json"),
      "utf8",
    );
    expect(parseLlamaBenchJson(real).map((r) => [r.n_cpu_moe, r.n_gen, r.avg_ts])).toEqual([
      [30, 16, 42.376346],
      [25, 16, 52.35673],
    ]);
    expect(() => parseLlamaBenchJson("[{}]")).toThrow();
    expect(() => parseLlamaBenchJson("| model | size |")).toThrow();
  });

  it("runs one llama-bench over every N, and names a missing or failing binary", async () => {
    const argsFile = join(dir, "args.json");
    const fake = join(dir, "llama-bench");
    writeFileSync(
      fake,
      `#!/usr/bin/env node
const a = process.argv.slice(2);
require("node:fs").writeFileSync(${JSON.stringify(argsFile)}, JSON.stringify(a));
if (a.includes("fail")) { process.stderr.write("CUDA error: out of memory"); process.exit(1); }
const n = a[a.indexOf("-ncmoe") + 1].split(",").map(Number);
const gen = Number(a[a.indexOf("-n") + 1]);
process.stdout.write(JSON.stringify(n.map((x) => ({ n_cpu_moe: x, n_gen: gen, avg_ts: 100 - x, stddev_ts: 1 }))));
`,
    );
    chmodSync(fake, 0o755);
    const got = await runLlamaCpuMoe({
      llamaBench: fake,
      gguf: "/models/m.gguf",
      ncmoe: [30, 25, 30, 15],
      decode: 32,
      runs: 2,
      threads: 16,
    });
    const args = JSON.parse(readFileSync(argsFile, "utf8")) as string[];
    expect(args).toEqual([
      "-m",
      "/models/m.gguf",
      "-ngl",
      "99",
      "-ncmoe",
      "30,25,15",
      "-p",
      "0",
      "-n",
      "32",
      "-r",
      "2",
      "-o",
      "json",
      "-t",
      "16",
    ]);
    expect(got.map((r) => [r.n_cpu_moe, r.avg_ts])).toEqual([
      [30, 70],
      [25, 75],
      [15, 85],
    ]);
    await expect(
      runLlamaCpuMoe({ llamaBench: fake, gguf: "fail", ncmoe: [1], decode: 8, runs: 1 }),
    ).rejects.toThrow(/exited with 1: CUDA error: out of memory/);
    expect(() => llamaBenchBinary(join(dir, "none"))).toThrow(/no llama-bench at/);
    expect(llamaBenchBinary(fake)).toBe(fake);
  });
});
