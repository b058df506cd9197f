import { describe, expect, it } from "vitest";
import { SamplingSchema } from "../engine/protocol.ts";
import { toProtocolSampling } from "./sampling.ts";

describe("toProtocolSampling", () => {
  it("names every field as the protocol does, and the protocol's schema accepts it", () => {
    const out = toProtocolSampling({
      temperature: 0.7,
      topK: 40,
      topP: 0.9,
      repetitionPenalty: 1.15,
      seed: 7,
    });
    expect(out).toEqual({
      temperature: 0.7,
      top_k: 40,
      top_p: 0.9,
      repetition_penalty: 1.15,
      seed: 7,
    });
    expect(SamplingSchema.strict().parse(out)).toEqual(out);
  });

  it("leaves the seed out when it is random (null or absent), and keeps seed 0", () => {
    const base = { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1 };
    expect(toProtocolSampling({ ...base, seed: null })).not.toHaveProperty("seed");
    expect(toProtocolSampling(base)).not.toHaveProperty("seed");
    expect(toProtocolSampling({ ...base, seed: 0 })).toHaveProperty("seed", 0);
  });
});
