import { readFile } from "node:fs/promises";
import { InvalidArgumentError, Option, type Command } from "commander";
import { nativeOneShotBackend, serviceBackend, type Backend } from "../../core/chat/backend.ts";
import { resolveModel, type ResolvedModel } from "../../core/chat/model.ts";
import { formatStats } from "../../core/chat/stats.ts";
import {
  loadChatTemplate,
  parseMessages,
  renderChat,
  type ChatMessage,
} from "../../core/chat/template.ts";
import { loadTokenizer, type ChatTokenizer } from "../../core/chat/tokenizer.ts";
import { DEMO_LABEL } from "../../core/demo/demo.ts";
import { ENGINE_DEFAULTS, GPU_MISSES, SAMPLING_DEFAULTS } from "../../core/defaults.ts";
import { UserError } from "../../core/errors.ts";
import { parseByteSize as parseSize } from "../../core/units.ts";
import { generateAll, type GenerationResult } from "../../core/generation/generate.ts";
import { toProtocolLoad, type EngineFlags } from "../../core/generation/settings.ts";
import { ACTIVATION_KINDS, isActivationPlan } from "../../core/engine/protocol.ts";
import { chatLoop } from "./chat-loop.ts";
import { remoteChat } from "./chat-remote.ts";

/** Options shared by `chat` and `complete`. */
export interface GenerationCliOptions extends EngineFlags {
  model?: string;
  maxNew: number;
  maxContext: number;
  temperature: number;
  topK: number;
  topP: number;
  repetitionPenalty: number;
  seed?: number;
  stop: string[];
  quiet?: boolean;
  json?: boolean;
}

/** A commander parser for a whole-number option from `min` (to `max`, when given). */
export function intArg(min: number, max?: number) {
  return (value: string): number => {
    const n = Number(value);
    if (
      !/^\d+$/.test(value.trim()) ||
      !Number.isSafeInteger(n) ||
      n < min ||
      (max !== undefined && n > max)
    ) {
      throw new InvalidArgumentError(
        max === undefined
          ? `expected an integer >= ${min}`
          : `expected an integer from ${min} to ${max}`,
      );
    }
    return n;
  };
}

function numberArg(min: number, max = Infinity) {
  return (value: string): number => {
    const n = Number(value);
    if (value.trim() === "" || !Number.isFinite(n) || n < min || n > max) {
      throw new InvalidArgumentError(
        max === Infinity
          ? `expected a number >= ${min}`
          : `expected a number from ${min} to ${max}`,
      );
    }
    return n;
  };
}

/** "8G", "8GB", "8GiB", "512M", "1073741824": bytes (K/M/G/T are powers of 1024). */
export function parseByteSize(value: string): number {
  const bytes = parseSize(value);
  if (bytes === undefined)
    throw new InvalidArgumentError("expected a size such as 8G, 512M or a number of bytes");
  return bytes;
}

/** `--backend cpu|metal|vulkan|auto` (docs/gpu.md): where the engine runs the model. */
export function backendOption(): Option {
  return new Option(
    "--backend <name>",
    "where the model runs: cpu, metal (a Mac GPU), vulkan (a GPU) or auto (a GPU when there is one)",
  ).choices(["cpu", "metal", "vulkan", "auto"]);
}

/** `--activations`: an activation plan (exact, int8, or the kinds that take 8-bit inputs). */
export function activationsOption(): Option {
  return new Option(
    "--activations <plan>",
    "input precision of the quantized products: exact, int8 (faster on the CPU, approximate), or the kinds of product on int8, comma-separated, of " +
      ACTIVATION_KINDS.join(", ") +
      " (head: the output head only)",
  )
    .default(ENGINE_DEFAULTS.activations)
    .argParser((value: string) => {
      if (!isActivationPlan(value)) {
        throw new InvalidArgumentError(
          `expected exact, int8, or a comma-separated list of ${ACTIVATION_KINDS.join(", ")}`,
        );
      }
      return value;
    });
}

/**
 * Adds the options of the correctness tools that run forward passes (`logits`, `perplexity`):
 * KV precision, the quantized products' input precision, prefill chunk and threads.
 */
export function addForwardPassOptions(cmd: Command): Command {
  return cmd
    .option("--kv-dtype <dtype>", "KV cache precision: f16 or f32", ENGINE_DEFAULTS.kvDtype)
    .addOption(activationsOption())
    .option("--chunk <n>", "prefill chunk size in tokens", String(ENGINE_DEFAULTS.prefillChunk))
    .option("--threads <n>", "CPU threads (default: all)");
}

/** `--vram-budget SIZE` (docs/gpu.md): GPU memory for the model on a GPU backend. */
export function vramBudgetOption(): Option {
  return new Option(
    "--vram-budget <size>",
    "GPU memory for the model on a GPU backend, e.g. 4G: every expert resident if it fits, else streamed through the expert slots that fit",
  ).argParser(parseByteSize);
}

/** Adds the engine options (expert cache, memory budget, threads, backend) to a command. */
export function addEngineOptions(cmd: Command): Command {
  return cmd
    .option(
      "--expert-cache-slots <n>",
      `experts kept in memory per MoE layer (default: ${ENGINE_DEFAULTS.expertCacheSlots}, or what --memory-budget allows)`,
      intArg(0),
    )
    .option("--memory-budget <size>", "memory limit for the engine, e.g. 8G", parseByteSize)
    .addOption(vramBudgetOption())
    .addOption(
      new Option(
        "--gpu-misses <where>",
        `with a GPU memory budget too small for the experts, where a missed expert is computed: split (--gpu-expert-copies of a layer's misses copied to the GPU, the rest on the CPU at the same time), cpu, or copy (to the GPU) (default: ${ENGINE_DEFAULTS.gpuMisses})`,
      ).choices(GPU_MISSES),
    )
    .option(
      "--gpu-expert-copies <n>",
      `per MoE layer and token: with --gpu-misses split the misses the GPU computes, with cpu the experts also copied to GPU slots at most (default: ${ENGINE_DEFAULTS.gpuExpertCopies})`,
      intArg(0),
    )
    .option("--threads <n>", "CPU threads (default: all)", intArg(1))
    .addOption(backendOption())
    .addOption(activationsOption());
}

/** Adds the model, sampling, engine and output options to a command. */
export function addGenerationOptions(cmd: Command): Command {
  cmd
    .option(
      "--model <name-or-dir>",
      "installed model name or model directory (default: the demo model)",
    )
    .option("--max-new <n>", "most tokens to generate", intArg(0), SAMPLING_DEFAULTS.maxNewTokens)
    .option(
      "--max-context <n>",
      "context size in tokens (prompt plus output)",
      intArg(1),
      ENGINE_DEFAULTS.context,
    )
    .option(
      "--temperature <t>",
      "sampling temperature; 0 picks the most likely token",
      numberArg(0),
      SAMPLING_DEFAULTS.temperature,
    )
    .option(
      "--top-k <k>",
      "sample from the k most likely tokens (0: all)",
      intArg(0),
      SAMPLING_DEFAULTS.topK,
    )
    .option(
      "--top-p <p>",
      "nucleus sampling probability mass",
      numberArg(0, 1),
      SAMPLING_DEFAULTS.topP,
    )
    .option(
      "--repetition-penalty <r>",
      "penalty for repeated tokens (1: none)",
      numberArg(0),
      SAMPLING_DEFAULTS.repetitionPenalty,
    )
    .option("--seed <n>", "random seed (same seed, same output)", intArg(0))
    .addOption(
      new Option("--stop <text>", "stop when the output contains this text (repeatable)")
        .argParser((v: string, prev: string[]) => [...prev, v])
        .default([]),
    );
  return addEngineOptions(cmd)
    .option("--quiet", "print only the generated text (no banner, no statistics)")
    .option("--json", "print one JSON object with the text and statistics instead of streaming");
}

/** The model and its text side, with the demo banner on stderr. */
export interface LoadedModel {
  model: ResolvedModel;
  tokenizer: ChatTokenizer;
}

export async function loadModel(opts: GenerationCliOptions): Promise<LoadedModel> {
  const quiet = opts.quiet === true || opts.json === true;
  const model = await resolveModel(opts.model, () => {
    if (!quiet) process.stderr.write("redwing: creating the built-in demo model (first use)...\n");
  });
  if (model.isDemo && !quiet) process.stderr.write(`redwing: using the ${DEMO_LABEL}\n`);
  const tokenizer = await loadTokenizer(model.dir);
  return { model, tokenizer };
}

/**
 * The engine behind the commands: the decode service (core/engine) when its binary is built,
 * else one `redwing-engine generate` run per request. REDWING_ENGINE=service or oneshot forces
 * one of them.
 */
export async function openBackend(): Promise<Backend> {
  const choice = process.env.REDWING_ENGINE;
  if (choice === "oneshot") return nativeOneShotBackend();
  try {
    return await serviceBackend();
  } catch (error) {
    if (choice === "service" || !(error instanceof UserError) || error.code !== "native_missing") {
      throw error;
    }
    return nativeOneShotBackend();
  }
}

/** Runs one generation from prompt ids, streaming text to stdout unless --json. */
export async function generateText(
  backend: Backend,
  loaded: LoadedModel,
  promptTokens: number[],
  opts: GenerationCliOptions,
  signal?: AbortSignal,
): Promise<GenerationResult> {
  if (promptTokens.length >= opts.maxContext) {
    throw new UserError(
      `the prompt has ${promptTokens.length} tokens, which does not fit --max-context ${opts.maxContext}`,
      "context_overflow",
    );
  }
  const engine = await backend.engine(
    toProtocolLoad(loaded.model.dir, { ...opts, context: opts.maxContext }),
  );
  const result = await generateAll(
    engine,
    loaded.tokenizer,
    {
      tokens: promptTokens,
      maxNewTokens: Math.min(opts.maxNew, opts.maxContext - promptTokens.length),
      sampling: opts,
      stopIds: loaded.model.manifest.architecture.eos_token_ids,
      stopStrings: opts.stop,
    },
    {
      signal,
      readMemory: () => engine.readMemory(),
      onText: (text) => {
        if (!opts.json) process.stdout.write(text);
      },
    },
  );
  if (!opts.json && !opts.quiet) {
    // End the text's line (--quiet keeps the text exactly as generated), then the statistics.
    if (!result.text.endsWith("\n")) process.stdout.write("\n");
    if (result.stats) process.stderr.write(`${formatStats(result.stats)}\n`);
  }
  return result;
}

/** The JSON printed by --json. */
export function resultJson(result: GenerationResult, promptTokens: number): string {
  const s = result.stats;
  return (
    JSON.stringify({
      text: result.text,
      tokens: result.tokens,
      finish_reason: result.finishReason,
      prompt_tokens: promptTokens,
      stats: s && {
        generated_tokens: s.generatedTokens,
        ttft_seconds: s.ttftSeconds,
        decode_seconds: s.decodeSeconds,
        decode_tokens_per_second:
          s.decodeSeconds > 0 ? Math.max(0, s.generatedTokens - 1) / s.decodeSeconds : 0,
        peak_memory_bytes: s.peakMemoryBytes ?? null,
        expert_cache_hit_rate: s.cacheHitRate ?? null,
      },
    }) + "\n"
  );
}

interface ChatOptions extends GenerationCliOptions {
  messagesFile?: string;
  system?: string;
  endpoint?: string;
  apiKeyEnv?: string;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

export async function readMessages(path: string): Promise<ChatMessage[]> {
  let text: string;
  try {
    text = path === "-" ? await readStdin() : await readFile(path, "utf8");
  } catch (error) {
    throw new UserError(`cannot read --messages-file ${path}: ${(error as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new UserError(`${path} is not valid JSON: ${(error as Error).message}`);
  }
  return parseMessages(value, path === "-" ? "stdin" : path);
}

function promptIds(loaded: LoadedModel, template: string, messages: ChatMessage[]): number[] {
  const text = renderChat(template, messages, {
    bosToken: loaded.tokenizer.bosToken,
    eosToken: loaded.tokenizer.eosToken,
  });
  return loaded.tokenizer.encode(text, { addBos: true });
}

/** `redwing chat`: a conversation with the model's chat template. */
export function registerChatCommand(program: Command): void {
  const cmd = program
    .command("chat")
    .description("Chat with a model (messages from a file, or interactively on a terminal)")
    .option(
      "--messages-file <file>",
      'JSON array of {"role", "content"} messages ("-": stdin); the reply is printed',
    )
    .option("--system <text>", "system prompt")
    .option(
      "--endpoint <url>",
      "chat with a model on an OpenAI-compatible server instead (e.g. http://gpu-box:8000/v1; --model names its model; docs/remote.md)",
    )
    .option(
      "--api-key-env <var>",
      "with --endpoint: the environment variable that holds the server's API key",
    );
  addGenerationOptions(cmd).action(async (opts: ChatOptions) => {
    const messages: ChatMessage[] = opts.messagesFile ? await readMessages(opts.messagesFile) : [];
    if (opts.system !== undefined) {
      if (messages[0]?.role === "system") messages[0] = { role: "system", content: opts.system };
      else messages.unshift({ role: "system", content: opts.system });
    }
    if (!opts.messagesFile && !process.stdin.isTTY) {
      throw new UserError(
        "chat needs --messages-file, or a terminal for an interactive conversation; for raw text use `redwing complete --prompt`",
      );
    }
    if (opts.endpoint !== undefined) {
      await remoteChat({ ...opts, endpoint: opts.endpoint }, messages);
      return;
    }
    if (opts.apiKeyEnv !== undefined) {
      throw new UserError("--api-key-env goes with --endpoint (a server's API key)");
    }
    const loaded = await loadModel(opts);
    const template = await loadChatTemplate(
      loaded.model.dir,
      loaded.tokenizer.configTemplate,
      loaded.model.manifest.architecture.family,
    );
    const backend = await openBackend();
    try {
      if (!opts.messagesFile) {
        await chatLoop(
          messages,
          (history, signal) =>
            generateText(
              backend,
              loaded,
              promptIds(loaded, template, history),
              { ...opts, json: false },
              signal,
            ),
          opts,
        );
        return;
      }
      const ids = promptIds(loaded, template, messages);
      const result = await generateText(backend, loaded, ids, opts);
      if (opts.json) process.stdout.write(resultJson(result, ids.length));
    } finally {
      await backend.close();
    }
  });
}
