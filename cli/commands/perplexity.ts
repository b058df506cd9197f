import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Command } from "commander";
import { resolveModel } from "../../core/chat/model.ts";
import { loadTokenizer } from "../../core/chat/tokenizer.ts";
import { DEMO_LABEL } from "../../core/demo/demo.ts";
import { UserError } from "../../core/errors.ts";
import { captureOutput, nativeBinary } from "../../core/native.ts";
import { ENGINE_DEFAULTS, expertCacheSlotsFor, PERPLEXITY_DEFAULTS } from "../../core/defaults.ts";
import { addForwardPassOptions, parseByteSize } from "./chat.ts";

interface PerplexityOptions {
  model?: string;
  file: string;
  context: string;
  stride?: string;
  kvDtype: string;
  activations: string;
  chunk: string;
  threads?: string;
  expertCacheSlots?: string;
  memoryBudget?: string;
  json?: boolean;
}

/** What `redwing-engine perplexity` prints (and `--json` passes on, plus the file). */
export interface PerplexityResult {
  perplexity: number;
  nll_per_token: number;
  tokens: number;
  windows: number;
  positions: number;
  window: number;
  stride: number;
  kv_dtype: string;
  activations: string;
  seconds: number;
  tokens_per_second: number;
}

function positiveInteger(value: string, flag: string, min = 1): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n) || n < min) {
    throw new UserError(`${flag} must be an integer >= ${min}`);
  }
  return n;
}

/**
 * `redwing perplexity`: perplexity and mean negative log-likelihood per token of a text file
 * (`<bos>` plus the file's tokens). The engine scores the tokens itself (`redwing-engine
 * perplexity`, Engine::score_tokens): windows of --context tokens every --stride tokens, each
 * token predicted once from the tokens before it in its window.
 */
export function registerPerplexityCommand(program: Command): void {
  const cmd = program
    .command("perplexity")
    .description("Perplexity of a model on a text file (scored by the engine)")
    .option(
      "--model <name-or-dir>",
      "installed model name or model directory (default: the demo model)",
    )
    .requiredOption("--file <text-file>", "plain UTF-8 text to score")
    .option(
      "--context <n>",
      "tokens a prediction may look back on (window size)",
      String(PERPLEXITY_DEFAULTS.window),
    )
    .option("--stride <n>", "start a new window every n tokens (default: half the context)");
  addForwardPassOptions(cmd)
    .option(
      "--expert-cache-slots <n>",
      `experts kept in memory per MoE layer (default: ${ENGINE_DEFAULTS.expertCacheSlots}; 0: all)`,
    )
    .option("--memory-budget <size>", "memory limit for the engine, e.g. 8G")
    .option("--json", "print one JSON object")
    .action(async (opts: PerplexityOptions) => {
      const context = positiveInteger(opts.context, "--context", 2);
      const stride =
        opts.stride === undefined
          ? Math.max(1, Math.floor(context / 2))
          : positiveInteger(opts.stride, "--stride");
      if (stride >= context) throw new UserError("--stride must be less than --context");
      if (opts.kvDtype !== "f16" && opts.kvDtype !== "f32") {
        throw new UserError("--kv-dtype must be f16 or f32");
      }
      const chunk = positiveInteger(opts.chunk, "--chunk");
      let text: string;
      try {
        text = await readFile(opts.file, "utf8");
      } catch (error) {
        throw new UserError(`cannot read ${opts.file}: ${(error as Error).message}`);
      }
      const model = await resolveModel(opts.model);
      const tokenizer = await loadTokenizer(model.dir);
      const ids = tokenizer.encode(text, { addBos: true });
      if (ids.length < 2) throw new UserError(`${opts.file} holds no text to score`);

      const args = ["perplexity", "--model", model.dir, "--window", String(context)];
      args.push("--stride", String(stride), "--kv-dtype", opts.kvDtype, "--chunk", String(chunk));
      args.push("--activations", opts.activations);
      if (opts.threads !== undefined) {
        args.push("--threads", String(positiveInteger(opts.threads, "--threads")));
      }
      if (model.manifest.architecture.moe) {
        const budget =
          opts.memoryBudget === undefined ? undefined : parseByteSize(opts.memoryBudget);
        const slots = expertCacheSlotsFor(
          opts.expertCacheSlots === undefined
            ? undefined
            : positiveInteger(opts.expertCacheSlots, "--expert-cache-slots", 0),
          budget,
        );
        if (slots !== undefined) args.push("--expert-cache-slots", String(slots));
        if (budget !== undefined) args.push("--memory-budget", String(budget));
      }
      // The ids go through a file: a long text does not fit on a command line.
      const tmp = await mkdtemp(join(tmpdir(), "redwing-perplexity-"));
      let result: PerplexityResult;
      try {
        const idsFile = join(tmp, "tokens.txt");
        await writeFile(idsFile, ids.join(","));
        args.push("--tokens-file", idsFile);
        let out: string;
        try {
          out = await captureOutput([nativeBinary("redwing-engine"), ...args]);
        } catch (error) {
          throw new UserError((error as Error).message, "native_failed");
        }
        result = JSON.parse(out) as PerplexityResult;
      } finally {
        await rm(tmp, { recursive: true, force: true });
      }
      if (opts.json) {
        process.stdout.write(`${JSON.stringify({ ...result, file: opts.file })}\n`);
        return;
      }
      if (model.isDemo) process.stderr.write(`redwing: using the ${DEMO_LABEL}\n`);
      process.stdout.write(
        `perplexity ${result.perplexity.toFixed(4)}  nll/token ${result.nll_per_token.toFixed(5)}  ` +
          `tokens ${result.tokens}  windows ${result.windows} (context ${result.window}, stride ${result.stride}, ` +
          `${result.kv_dtype} KV, ${result.activations} activations)  ${result.seconds.toFixed(2)} s\n`,
      );
    });
}
