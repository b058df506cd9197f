/**
 * Sampling settings, one shape for the CLI options, the app's settings and the server's request
 * fields, and the one conversion to the decode protocol's `sampling` object (snake_case,
 * docs/protocol.md).
 */
import type { Sampling } from "../engine/protocol.ts";

export interface SamplingSettings {
  /** 0: the most likely token. */
  temperature: number;
  /** 0: no top-k. */
  topK: number;
  topP: number;
  /** 1: none. */
  repetitionPenalty: number;
  /** Omitted or null: a random seed. */
  seed?: number | null;
}

/** The protocol's sampling fields for `s`; no seed field when the seed is random. */
export function toProtocolSampling(s: SamplingSettings): Sampling {
  return {
    temperature: s.temperature,
    top_k: s.topK,
    top_p: s.topP,
    repetition_penalty: s.repetitionPenalty,
    ...(s.seed !== undefined && s.seed !== null ? { seed: s.seed } : {}),
  };
}
