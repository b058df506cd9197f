/**
 * How the chat commands reach the engine. A `Backend` hands out the engine with a model loaded
 * (core/generation's TokenEngine, which the one generation loop drives):
 * - `serviceBackend`: the decode service (core/engine's EngineClient), which streams tokens as
 *   they are made, stops early on a stop string (cancel), and reports peak memory and the expert
 *   cache hit rate. The model is loaded on first use and kept for the next requests with the same
 *   settings.
 * - `nativeOneShotBackend`: one `redwing-engine generate` run per request
 *   (native/tools/redwing-engine.cpp), which needs no service but gives all tokens at the end and
 *   cannot stop early on a stop string.
 */
import { spawn, spawnSync } from "node:child_process";
import type { GenerateEvent, GenerateParams, LoadParams } from "../engine/protocol.ts";
import { UserError } from "../errors.ts";
import type { MemoryReading, TokenEngine } from "../generation/generate.ts";
import { nativeBinary } from "../native.ts";

/** An engine with a model loaded, and its memory figures after a generation. */
export interface BackendEngine extends TokenEngine {
  readMemory(): Promise<MemoryReading | null>;
}

export interface Backend {
  /** A short name for messages ("service", "redwing-engine generate"). */
  readonly name: string;
  /** The engine with `load.model` loaded with these settings. */
  engine(load: LoadParams): Promise<BackendEngine>;
  /** Releases the engine (stops a service); safe to call twice. */
  close(): Promise<void>;
}

interface OneShotOutput {
  tokens: number[];
  stop_reason: string;
  prompt_tokens: number;
  prefill_seconds: number;
  decode_seconds: number;
  /** Present in builds with expert streaming. */
  peak_rss_bytes?: number;
  hit_rate?: number;
  expert_cache_slots?: number;
}

/** True when this build of `redwing-engine` takes the expert streaming flags. */
function supportsStreamingFlags(binary: string): boolean {
  const r = spawnSync(binary, ["--help"], { encoding: "utf8", timeout: 10_000 });
  return typeof r.stdout === "string" && r.stdout.includes("--expert-cache-slots");
}

/** Runs `redwing-engine generate` and returns its JSON; errors name the binary and its stderr. */
async function runOneShot(args: string[], signal?: AbortSignal): Promise<OneShotOutput> {
  const binary = nativeBinary("redwing-engine");
  return await new Promise((resolvePromise, reject) => {
    const child = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"], signal });
    let out = "";
    let err = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
    child.on("error", (error) =>
      reject(new UserError(`cannot run ${binary}: ${error.message}`, "native_failed")),
    );
    child.on("close", (code) => {
      if (code !== 0) {
        reject(
          new UserError(
            `${binary} generate failed (exit ${code ?? "signal"}): ${err.trim() || "no message"}`,
            "native_failed",
          ),
        );
        return;
      }
      try {
        resolvePromise(JSON.parse(out) as OneShotOutput);
      } catch {
        reject(
          new UserError(
            `${binary} generate printed no JSON: ${out.slice(0, 200)}`,
            "native_failed",
          ),
        );
      }
    });
  });
}

/** The command line of `redwing-engine generate` for a load and a generate request. */
function oneShotArgs(load: LoadParams, params: GenerateParams, streaming: boolean): string[] {
  const s = params.sampling ?? {};
  const args = ["generate", "--model", load.model, "--tokens", params.tokens.join(",")];
  if (params.max_new_tokens !== undefined) args.push("--max-new", String(params.max_new_tokens));
  const flags: [string, number | undefined][] = [
    ["--temperature", s.temperature],
    ["--top-k", s.top_k],
    ["--top-p", s.top_p],
    ["--repetition-penalty", s.repetition_penalty],
    ["--seed", s.seed],
    ["--threads", load.threads],
  ];
  for (const [flag, value] of flags) if (value !== undefined) args.push(flag, String(value));
  if (load.backend !== undefined) args.push("--backend", load.backend);
  if (streaming) {
    const more: [string, number | undefined][] = [
      ["--context", load.context],
      ["--expert-cache-slots", load.expert_cache_slots],
      ["--memory-budget", load.memory_budget],
      ["--vram-budget", load.vram_budget],
      ["--gpu-expert-copies", load.gpu_expert_copies],
    ];
    for (const [flag, value] of more) if (value !== undefined) args.push(flag, String(value));
    if (load.gpu_misses !== undefined) args.push("--gpu-misses", load.gpu_misses);
  }
  return args;
}

/** The fallback backend: one `redwing-engine generate` process per request. */
export function nativeOneShotBackend(): Backend {
  let streaming: boolean | undefined;
  return {
    name: "redwing-engine generate",
    async engine(load: LoadParams): Promise<BackendEngine> {
      streaming ??= supportsStreamingFlags(nativeBinary("redwing-engine"));
      let memory: MemoryReading | null = null;
      return {
        async *generate(params, options = {}): AsyncIterable<GenerateEvent> {
          memory = null;
          const r = await runOneShot(oneShotArgs(load, params, streaming!), options.signal);
          memory = {
            peakMemoryBytes: r.peak_rss_bytes ?? null,
            // A resident MoE (0 slots) or a dense model has no expert cache to report.
            cacheHitRate: r.expert_cache_slots ? (r.hit_rate ?? null) : null,
          };
          yield { type: "tokens", id: null, tokens: r.tokens };
          const decoded = Math.max(0, r.tokens.length - 1);
          yield {
            type: "finished",
            id: null,
            reason: r.stop_reason === "length" ? "length" : "eos",
            tokens: r.tokens,
            prompt_tokens: r.prompt_tokens,
            cached_tokens: 0,
            prefill_tokens: r.prompt_tokens,
            timings: {
              prefill_seconds: r.prefill_seconds,
              ttft_seconds: r.prefill_seconds,
              decode_seconds: r.decode_seconds,
              prefill_tokens_per_second:
                r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0,
              decode_tokens_per_second: r.decode_seconds > 0 ? decoded / r.decode_seconds : 0,
            },
          };
        },
        readMemory: async () => memory,
      };
    },
    async close() {},
  };
}

/** The decode service through core/engine's EngineClient. */
export async function serviceBackend(onLog?: (line: string) => void): Promise<Backend> {
  const { EngineClient } = await import("../engine/index.ts");
  const client = await EngineClient.start({ restart: false, onLog });
  let loadedKey: string | null = null;
  return {
    name: "service",
    async engine(load: LoadParams): Promise<BackendEngine> {
      const key = JSON.stringify(load);
      if (loadedKey !== key) {
        if (loadedKey !== null) await client.unload();
        await client.load(load);
        loadedKey = key;
      }
      return {
        generate: (params, options) => client.generate(params, options),
        async readMemory() {
          const stats = await client.stats();
          return {
            peakMemoryBytes: stats.memory.peak_rss_bytes,
            cacheHitRate: stats.expert_cache.hit_rate,
          };
        },
      };
    },
    async close() {
      await client.close();
    },
  };
}
