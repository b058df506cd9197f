/**
 * Engine benchmark: prefill and decode tokens/s for a Gemma 4 26B-A4B-shaped model held fully in
 * memory (a synthetic random-weight model with the real layer shapes and fewer layers, made once
 * with `redwing synth` and kept in the benchmark cache). Runs `redwing-engine generate` several
 * times, reports medians, and writes bench/results/engine.json.
 *
 *   node --import tsx bench/engine.ts [--layers 4] [--prompt 128] [--new 32] [--runs 3]
 */
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { captureOutput, nativeBinary } from "../core/native.ts";
import { synthesizeModel } from "../core/synth/synth.ts";
import { greedyGenerateArgs, parseGenerateReport } from "./generate-report.ts";
import { flag, median, writeResult } from "./stats.ts";

/** The synthetic model, made on first use (about 2 GB for 4 layers). */
async function benchModel(layers: number): Promise<string> {
  const cache = process.env.REDWING_BENCH_DIR ?? join(tmpdir(), "redwing-bench");
  const dir = join(cache, `gemma-4-26b-a4b-${layers}l`);
  if (!existsSync(join(dir, "manifest.json"))) {
    console.error(`engine bench: writing synthetic model ${dir}`);
    await synthesizeModel({ preset: "gemma-4-26b-a4b", out: dir, layers, force: true });
  }
  return dir;
}

/** A fixed prompt of `length` spread-out token ids, the same in every engine benchmark. */
export function syntheticPrompt(length: number): number[] {
  return Array.from({ length }, (_, i) => 1000 + ((i * 7919) % 200000));
}

export async function runEngineBench(): Promise<void> {
  const layers = flag("layers", 4);
  const promptLength = flag("prompt", 128);
  const maxNew = flag("new", 32);
  const runs = flag("runs", 3);
  const model = await benchModel(layers);
  // Token ids away from the control range; the synthetic model's eos ids (1, 106, 50) may still
  // be sampled, so rates use the tokens actually produced.
  const prompt = syntheticPrompt(promptLength);
  const rows: { threads: number; prefill: number[]; decode: number[] }[] = [];
  for (const threads of [1, 2]) {
    const row = { threads, prefill: [] as number[], decode: [] as number[] };
    for (let i = 0; i < runs; i++) {
      const out = await captureOutput(
        [
          nativeBinary("redwing-engine"),
          ...greedyGenerateArgs(model, prompt, maxNew),
          "--threads",
          String(threads),
        ],
        { inheritStderr: true },
      );
      const report = parseGenerateReport(out);
      row.prefill.push(report.prompt_tokens / report.prefill_seconds);
      if (report.tokens.length > 1)
        row.decode.push((report.tokens.length - 1) / report.decode_seconds);
    }
    rows.push(row);
  }
  const result = {
    model: `synthetic gemma-4-26b-a4b, ${layers} of 30 layers, all experts in memory`,
    prompt_tokens: promptLength,
    max_new: maxNew,
    runs,
    results: rows.map((r) => ({
      threads: r.threads,
      prefill_tokens_per_s: median(r.prefill),
      decode_tokens_per_s: r.decode.length ? median(r.decode) : null,
    })),
  };
  console.log(result.model);
  console.log("threads  prefill tok/s  decode tok/s  (medians of", runs, "runs)");
  for (const r of result.results) {
    console.log(
      `${String(r.threads).padStart(7)}  ${r.prefill_tokens_per_s.toFixed(1).padStart(13)}  ${(r.decode_tokens_per_s?.toFixed(2) ?? "-").padStart(12)}`,
    );
  }
  await writeResult("engine", result);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await runEngineBench();
}
