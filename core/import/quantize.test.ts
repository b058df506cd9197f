import { describe, expect, it } from "vitest";
import { bf16ToNumber, decodeToF32, encodeFromF32 } from "../format/dtype.ts";
import { dequantizeElement, quantizeF32, quantizeRows } from "./quantize.ts";
import { randomValues, rng } from "../../testkit/checkpoints.ts";

const G64 = { bits: 4, groupSize: 64 } as const;

function unpack(words: Uint32Array, bits: number, count: number): number[] {
  const out: number[] = [];
  for (let c = 0; c < count; c++) {
    const bit = c * bits;
    out.push((words[Math.floor(bit / 32)]! >>> (bit % 32)) & ((1 << bits) - 1));
  }
  return out;
}

describe("MLX affine quantization", () => {
  it("matches a hand-computed group (max edge, negative scale)", () => {
    // w_j = (j % 16) / 2: min 0, max 7.5. |min| > |max| is false, so the edge is the max and
    // the scale is negated: s = -(7.5 - 0) / 15 = -0.5, q0 = rint(7.5 / -0.5) = -15 != 0, so
    // s = 7.5 / -15 = -0.5 and b = 7.5; q = rint((w - 7.5) / -0.5) = 15 - (j % 16).
    const w = new Float32Array(64).map((_, j) => (j % 16) / 2);
    const { words, scales, biases } = quantizeF32(w, 1, 64, G64);
    expect(scales[0]).toBe(-0.5);
    expect(biases[0]).toBe(7.5);
    expect(unpack(words, 4, 64)).toEqual(Array.from({ length: 64 }, (_, j) => 15 - (j % 16)));
  });

  it("uses the min as edge when it has the larger magnitude", () => {
    // min -3, max 1.5: s = 4.5 / 15 = 0.3, q0 = rint(-3 / 0.3) = -10, s = -3 / -10 = 0.3, b = -3.
    const w = new Float32Array(64).fill(0);
    w[0] = -3;
    w[1] = 1.5;
    const { words, scales, biases } = quantizeF32(w, 1, 64, G64);
    expect(scales[0]).toBe(Math.fround(Math.fround(-3) / -10));
    expect(biases[0]).toBe(-3);
    const q = unpack(words, 4, 64);
    expect(q[0]).toBe(0);
    expect(q[1]).toBe(15);
    expect(q[2]).toBe(10); // 0 = -3 + 10 * 0.3
  });

  it("gives bias 0 and scale eps for an all-zero group", () => {
    const { words, scales, biases } = quantizeF32(new Float32Array(64), 1, 64, G64);
    expect(scales[0]).toBe(-Math.fround(1e-7));
    expect(biases[0]).toBe(0);
    expect(unpack(words, 4, 64).every((q) => q === 0)).toBe(true);
  });

  it("rounds ties to even (rint) on the CPU path and away from zero on Metal", () => {
    // min 0, max 15: s = -1, b = 15; w = 12.5 gives (12.5 - 15) / -1 = 2.5.
    const w = new Float32Array(64).fill(0);
    w[1] = 15;
    w[2] = 12.5;
    w[3] = 11.5; // 3.5 -> 4 either way
    expect(unpack(quantizeF32(w, 1, 64, G64, "cpu").words, 4, 4)).toEqual([15, 0, 2, 4]);
    expect(unpack(quantizeF32(w, 1, 64, G64, "metal").words, 4, 4)).toEqual([15, 0, 3, 4]);
  });

  it("differs on Metal for an all-negative group (its max starts at 0)", () => {
    const w = new Float32Array(64).map((_, j) => -1 - j / 64);
    const cpu = quantizeF32(w, 1, 64, G64, "cpu");
    const metal = quantizeF32(w, 1, 64, G64, "metal");
    // Metal: range [min, 0], so s = 2/15-ish and b = min; CPU: range [min, max].
    expect(metal.biases[0]).toBe(cpu.biases[0]);
    expect(metal.scales[0]).not.toBe(cpu.scales[0]);
  });

  it("packs 8-bit values one per byte, little-endian", () => {
    const w = new Float32Array(64).map((_, j) => j);
    const { words, scales, biases } = quantizeF32(w, 1, 64, { bits: 8, groupSize: 64 });
    // min 0, max 63: s = -63/255 -> q0 = rint(63 / s) = -255, s = 63 / -255, b = 63.
    expect(biases[0]).toBe(63);
    expect(scales[0]).toBe(Math.fround(63 / -255));
    const bytes = Buffer.from(words.buffer, words.byteOffset, words.byteLength);
    expect(bytes[0]).toBe(255); // element 0 (w = 0) is q = 255 in the lowest byte
    expect(bytes[63]).toBe(0); // element 63 (w = 63) is q = 0
    expect(words.length).toBe(16);
  });

  it("reconstructs random weights within one step per group, for 4 and 8 bits", () => {
    const rows = 16;
    const cols = 256;
    const w = randomValues(rows * cols, rng(3));
    for (const bits of [4, 8] as const) {
      for (const groupSize of [32, 64, 128] as const) {
        const params = { bits, groupSize };
        const q = quantizeF32(w, rows, cols, params);
        let worst = 0;
        for (let r = 0; r < rows; r++) {
          for (let c = 0; c < cols; c++) {
            const g = r * (cols / groupSize) + Math.floor(c / groupSize);
            const err = Math.abs(
              dequantizeElement(q.words, q.scales, q.biases, cols, params, r, c) - w[r * cols + c]!,
            );
            worst = Math.max(worst, err / Math.abs(q.scales[g]!));
          }
        }
        // Half a step for values inside the range; up to one step at the far end, because
        // snapping the edge to an integer multiple of the scale can shrink the range.
        expect(worst).toBeLessThanOrEqual(1 + 1e-3);
        expect(worst).toBeGreaterThan(0.3);
      }
    }
  });

  it("stores scales and biases rounded to the source dtype", () => {
    const rows = 4;
    const cols = 128;
    const w = randomValues(rows * cols, rng(5));
    const src = encodeFromF32(w, "bf16");
    const values = new Float32Array(rows * cols);
    decodeToF32(src, "bf16", values, rows * cols);
    const exact = quantizeF32(values, rows, cols, G64);
    const q = quantizeRows(src, "bf16", rows, cols, G64);
    expect(q.weight.length).toBe((rows * cols) / 2);
    expect(q.scales.length).toBe(rows * 2 * 2);
    for (let i = 0; i < exact.scales.length; i++) {
      expect(bf16ToNumber(q.scales.readUInt16LE(2 * i))).toBeCloseTo(exact.scales[i]!, 2);
      expect(q.scales.readUInt16LE(2 * i)).toBe(
        encodeFromF32(exact.scales.subarray(i, i + 1), "bf16").readUInt16LE(0),
      );
    }
    // f32 sources keep float32 scales exactly.
    const q32 = quantizeRows(encodeFromF32(values, "f32"), "f32", rows, cols, G64);
    expect(q32.scales.readFloatLE(0)).toBe(exact.scales[0]);
    expect(q32.weight.equals(q.weight)).toBe(true);
  });

  it("quantizes row blocks independently (blocking does not change the result)", () => {
    const rows = 10;
    const cols = 64;
    const src = encodeFromF32(randomValues(rows * cols, rng(9)), "f16");
    const whole = quantizeRows(src, "f16", rows, cols, G64);
    const a = quantizeRows(src.subarray(0, 3 * cols * 2), "f16", 3, cols, G64);
    const b = quantizeRows(src.subarray(3 * cols * 2), "f16", 7, cols, G64);
    expect(Buffer.concat([a.weight, b.weight]).equals(whole.weight)).toBe(true);
    expect(Buffer.concat([a.scales, b.scales]).equals(whole.scales)).toBe(true);
  });

  it("rejects unsupported parameters and shapes", () => {
    expect(() => quantizeF32(new Float32Array(64), 1, 64, { bits: 3 as 4, groupSize: 64 })).toThrow(
      /bits/,
    );
    expect(() => quantizeF32(new Float32Array(96), 1, 96, G64)).toThrow(
      /multiple of the group size/,
    );
  });
});
