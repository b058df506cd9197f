/**
 * How the chat commands reach the engine. `Backend` is the small surface they need (generate a
 * token stream from prompt ids); `nativeOneShotBackend` implements it by running
 * `redwing-engine generate` once per request (native/tools/redwing-engine.cpp), which needs no
 * service but gives all tokens at the end and cannot stop early on a stop string.
 */
import { spawn, spawnSync } from "node:child_process";
import { UserError } from "../errors.ts";
import { nativeBinary } from "../native.ts";
import type { GenerationStats } from "./stats.ts";

export interface SamplingParams {
  temperature: number;
  topK: number;
  topP: number;
  repetitionPenalty: number;
  /** Omitted: a random seed. */
  seed?: number;
}

export interface LoadParams {
  /** KV cache positions. */
  context: number;
  threads?: number;
  /** Where the model runs (docs/gpu.md); omitted: the CPU. */
  backend?: "cpu" | "metal" | "vulkan" | "auto";
  expertCacheSlots?: number;
  /** Bytes. */
  memoryBudget?: number;
}

export interface GenerateRequest {
  modelDir: string;
  tokens: number[];
  maxNew: number;
  sampling: SamplingParams;
  stopTokenIds: number[];
  load: LoadParams;
  signal?: AbortSignal;
}

export type BackendEvent =
  | { type: "tokens"; tokens: number[] }
  | {
      type: "finished";
      reason: "eos" | "stop" | "length" | "cancelled";
      stats: GenerationStats;
    };

export interface Backend {
  /** A short name for messages ("service", "redwing-engine generate"). */
  readonly name: string;
  generate(request: GenerateRequest): AsyncIterable<BackendEvent>;
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

/** The fallback backend: one `redwing-engine generate` process per request. */
export function nativeOneShotBackend(): Backend {
  let streaming: boolean | undefined;
  return {
    name: "redwing-engine generate",
    async *generate(req: GenerateRequest): AsyncIterable<BackendEvent> {
      const s = req.sampling;
      const args = [
        "generate",
        "--model",
        req.modelDir,
        "--tokens",
        req.tokens.join(","),
        "--max-new",
        String(req.maxNew),
        "--temperature",
        String(s.temperature),
        "--top-k",
        String(s.topK),
        "--top-p",
        String(s.topP),
        "--repetition-penalty",
        String(s.repetitionPenalty),
      ];
      if (s.seed !== undefined) args.push("--seed", String(s.seed));
      if (req.load.threads !== undefined) args.push("--threads", String(req.load.threads));
      if (req.load.backend !== undefined) args.push("--backend", req.load.backend);
      if (streaming === undefined)
        streaming = supportsStreamingFlags(nativeBinary("redwing-engine"));
      if (streaming) {
        args.push("--context", String(req.load.context));
        if (req.load.expertCacheSlots !== undefined) {
          args.push("--expert-cache-slots", String(req.load.expertCacheSlots));
        }
        if (req.load.memoryBudget !== undefined) {
          args.push("--memory-budget", String(req.load.memoryBudget));
        }
      }
      const r = await runOneShot(args, req.signal);
      yield { type: "tokens", tokens: r.tokens };
      yield {
        type: "finished",
        reason: r.stop_reason === "length" ? "length" : "eos",
        stats: {
          promptTokens: r.prompt_tokens,
          generatedTokens: r.tokens.length,
          ttftSeconds: r.prefill_seconds,
          decodeSeconds: r.decode_seconds,
          peakMemoryBytes: r.peak_rss_bytes ?? null,
          // A resident MoE (0 slots) or a dense model has no expert cache to report.
          cacheHitRate: r.expert_cache_slots ? (r.hit_rate ?? null) : null,
        },
      };
    },
    async close() {},
  };
}

/**
 * The decode service (core/engine's EngineClient): streams tokens as they are made, stops
 * early on a stop string (cancel), and reports peak memory and the expert cache hit rate. The
 * model is loaded on the first request and kept for the next ones with the same settings.
 */
export async function serviceBackend(onLog?: (line: string) => void): Promise<Backend> {
  const { EngineClient } = await import("../engine/index.ts");
  const client = await EngineClient.start({ restart: false, onLog });
  let loadedKey: string | null = null;
  return {
    name: "service",
    async *generate(req: GenerateRequest): AsyncIterable<BackendEvent> {
      const load = {
        model: req.modelDir,
        context: req.load.context,
        threads: req.load.threads,
        backend: req.load.backend,
        expert_cache_slots: req.load.expertCacheSlots,
        memory_budget: req.load.memoryBudget,
      };
      const key = JSON.stringify(load);
      if (loadedKey !== key) {
        if (loadedKey !== null) await client.unload();
        await client.load(load);
        loadedKey = key;
      }
      const s = req.sampling;
      for await (const event of client.generate(
        {
          tokens: req.tokens,
          max_new_tokens: req.maxNew,
          sampling: {
            temperature: s.temperature,
            top_k: s.topK,
            top_p: s.topP,
            repetition_penalty: s.repetitionPenalty,
            seed: s.seed,
          },
          stop_token_ids: req.stopTokenIds,
          stats_interval_ms: 0,
        },
        { signal: req.signal },
      )) {
        if (event.type === "tokens") {
          yield { type: "tokens", tokens: event.tokens };
        } else if (event.type === "finished") {
          const stats = await client.stats();
          const t = event.timings;
          yield {
            type: "finished",
            reason: event.reason,
            stats: {
              promptTokens: event.prompt_tokens,
              generatedTokens: event.tokens.length,
              ttftSeconds: t?.ttft_seconds ?? 0,
              decodeSeconds: t?.decode_seconds ?? 0,
              peakMemoryBytes: stats.memory.peak_rss_bytes,
              cacheHitRate: stats.expert_cache.hit_rate,
            },
          };
        }
      }
    },
    async close() {
      await client.close();
    },
  };
}
