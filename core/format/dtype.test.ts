import { describe, expect, it } from "vitest";
import {
  bf16BitsFromF32Bits,
  bf16FromNumber,
  bf16ToNumber,
  decodeToF32,
  encodeFromF32,
  f16FromNumber,
  f16ToNumber,
  f32Bits,
} from "./dtype.ts";

describe("bf16", () => {
  it("rounds to nearest, ties to even, like MLX's _MLX_BFloat16", () => {
    // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to the even (1.0).
    expect(bf16ToNumber(bf16FromNumber(1 + 2 ** -8))).toBe(1);
    // 1.0078125 + 2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
    expect(bf16ToNumber(bf16FromNumber(1.0078125 + 2 ** -8))).toBe(1.015625);
    // Just above halfway rounds up.
    expect(bf16ToNumber(bf16FromNumber(1 + 2 ** -8 + 2 ** -20))).toBe(1.0078125);
    expect(bf16FromNumber(-2)).toBe(0xc000);
    expect(bf16BitsFromF32Bits(f32Bits(NaN))).toBe(0x7fc0);
    expect(bf16FromNumber(Infinity)).toBe(0x7f80);
  });
  it("gives 53 for sqrt(2816) and 50.5 for sqrt(2560) (Gemma embed scales)", () => {
    expect(bf16ToNumber(bf16FromNumber(Math.sqrt(2816)))).toBe(53);
    expect(bf16ToNumber(bf16FromNumber(Math.sqrt(2560)))).toBe(50.5);
  });
});

describe("f16", () => {
  it("converts normal, subnormal, overflowing and tie values", () => {
    expect(f16FromNumber(1)).toBe(0x3c00);
    expect(f16FromNumber(65504)).toBe(0x7bff);
    expect(f16FromNumber(65520)).toBe(0x7c00); // halfway to 65536 rounds to even: infinity
    expect(f16FromNumber(2 ** -24)).toBe(0x0001);
    expect(f16FromNumber(2 ** -25)).toBe(0x0000); // tie between 0 and the smallest: even (0)
    expect(f16FromNumber(3 * 2 ** -25)).toBe(0x0002); // tie between 1 and 2 units: even (2)
    expect(f16FromNumber(1 / 3)).toBe(0x3555);
    expect(f16FromNumber(-0)).toBe(0x8000);
    expect(f16ToNumber(0x3555)).toBeCloseTo(1 / 3, 3);
    expect(f16ToNumber(0x0001)).toBe(2 ** -24);
    expect(Number.isNaN(f16ToNumber(f16FromNumber(NaN)))).toBe(true);
  });
  it("round-trips every finite half value", () => {
    const wrong: number[] = [];
    for (let h = 0; h < 0x10000; h++) {
      if ((h & 0x7c00) !== 0x7c00 && f16FromNumber(f16ToNumber(h)) !== h) wrong.push(h);
    }
    expect(wrong).toEqual([]);
  });
});

describe("decode/encode", () => {
  it("round-trips bf16, f16 and f32 bytes", () => {
    const values = new Float32Array([0, 1, -1.5, 0.333251953125, 1024, -(2 ** -14)]);
    for (const dt of ["bf16", "f16", "f32"] as const) {
      const bytes = encodeFromF32(values, dt);
      const back = new Float32Array(values.length);
      decodeToF32(bytes, dt, back, values.length);
      expect(encodeFromF32(back, dt).equals(bytes)).toBe(true);
    }
  });
});
