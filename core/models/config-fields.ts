/**
 * Reading a checkpoint's `config.json` fields with clear errors: what every family module uses to
 * turn its config into the normalized architecture. A bad value names the field; a number that
 * would size work or memory is bounded (CONFIG_LIMITS) before anything is allocated from it.
 */
import { UserError } from "../errors.ts";

export type ConfigJson = Record<string, unknown>;

export function unsupported(what: string): UserError {
  return new UserError(
    `this checkpoint uses ${what}, which Redwing does not support`,
    "unsupported_model",
  );
}

export function invalid(what: string): UserError {
  return new UserError(`config.json: ${what}`, "config_invalid");
}

export function isObject(v: unknown): v is ConfigJson {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export function num(cfg: ConfigJson, key: string): number {
  const v = cfg[key];
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw invalid(`${key} must be a number, got ${JSON.stringify(v)}`);
  }
  return v;
}

/**
 * Upper bounds of the config numbers that size work or memory (arrays per layer, per expert,
 * per vocabulary entry...): far above any real model, far below what would exhaust the
 * importer. A hostile or damaged config (`num_hidden_layers: 1e9`) gets a clear error naming the
 * field instead of running the process out of memory.
 */
export const CONFIG_LIMITS: Readonly<Record<string, number>> = {
  num_hidden_layers: 1024,
  hidden_size: 65_536,
  num_attention_heads: 1024,
  num_key_value_heads: 1024,
  num_global_key_value_heads: 1024,
  head_dim: 8192,
  global_head_dim: 8192,
  intermediate_size: 1 << 20,
  moe_intermediate_size: 1 << 20,
  num_experts: 4096,
  top_k_experts: 4096,
  vocab_size: 1 << 22,
  max_position_embeddings: 1 << 24,
  sliding_window: 1 << 24,
};

export function int(cfg: ConfigJson, key: string): number {
  const v = num(cfg, key);
  if (!Number.isSafeInteger(v) || v < 0)
    throw invalid(`${key} must be a non-negative integer, got ${v}`);
  const limit = CONFIG_LIMITS[key];
  if (limit !== undefined && v > limit) {
    throw invalid(
      `${key} is ${v}, more than Redwing accepts (${limit}); the checkpoint's config is damaged or not a real model`,
    );
  }
  return v;
}

export function optNum(cfg: ConfigJson, key: string): number | null {
  const v = cfg[key];
  if (v === null || v === undefined) return null;
  return CONFIG_LIMITS[key] === undefined ? num(cfg, key) : int(cfg, key);
}

export function idList(v: unknown, key: string): number[] | null {
  if (v === null || v === undefined) return null;
  const list = Array.isArray(v) ? v : [v];
  if (!list.every((x) => Number.isSafeInteger(x) && (x as number) >= 0)) {
    throw invalid(`${key} must be a token id or a list of token ids, got ${JSON.stringify(v)}`);
  }
  return [...new Set(list as number[])];
}
