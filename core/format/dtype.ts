/**
 * Floating-point storage types of the runtime format and exact conversions between them and
 * float32. The conversions round the way MLX's C++ types do (round to nearest, ties to even),
 * because the importer must produce the same scale/bias bytes as MLX.
 */

export type FloatDType = "bf16" | "f16" | "f32";

export const FLOAT_DTYPES: readonly FloatDType[] = ["bf16", "f16", "f32"];

/** Bytes per element. */
export function dtypeSize(dtype: FloatDType): number {
  return dtype === "f32" ? 4 : 2;
}

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** float32 bits of a number (rounded to float32 first). */
export function f32Bits(x: number): number {
  f32Scratch[0] = x;
  return u32Scratch[0]!;
}

/** The float32 whose bits are `bits`. */
export function f32FromBits(bits: number): number {
  u32Scratch[0] = bits >>> 0;
  return f32Scratch[0]!;
}

/**
 * float32 -> bfloat16 bits, as MLX's `_MLX_BFloat16(float)`: NaN becomes 0x7FC0, everything else
 * rounds to nearest even by adding 0x7FFF plus the lowest kept bit (mlx/types/bf16.h).
 */
export function bf16BitsFromF32Bits(u: number): number {
  if ((u & 0x7f800000) === 0x7f800000 && (u & 0x007fffff) !== 0) return 0x7fc0;
  return (((u >>> 0) + ((u >>> 16) & 1) + 0x7fff) >>> 16) & 0xffff;
}

export function bf16FromNumber(x: number): number {
  return bf16BitsFromF32Bits(f32Bits(x));
}

export function bf16ToNumber(bits: number): number {
  return f32FromBits((bits & 0xffff) << 16);
}

/**
 * float32 -> IEEE half bits, round to nearest even (what a C++ `_Float16` cast does), with
 * gradual underflow and overflow to infinity.
 */
export function f16BitsFromF32Bits(u: number): number {
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  let mant = u & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 | (mant >>> 13) : 0);
  // Unbiased exponent re-biased for half (bias 15).
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // Subnormal half (or zero): shift the full significand (implicit 1 included) into place.
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e; // 14..24
    const half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    const rounded = rem > mid || (rem === mid && (half & 1) === 1) ? half + 1 : half;
    return sign | rounded; // a carry into the exponent field is the correct next value
  }
  const half = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  const rounded = rem > 0x1000 || (rem === 0x1000 && (half & 1) === 1) ? half + 1 : half;
  return sign | rounded; // a carry may overflow to 0x7c00 (infinity), which is right
}

export function f16FromNumber(x: number): number {
  return f16BitsFromF32Bits(f32Bits(x));
}

export function f16ToNumber(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >>> 10) & 0x1f;
  const mant = bits & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant !== 0 ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/**
 * Decodes `count` little-endian elements of `dtype` from `src` (starting at byte 0) into
 * float32 values in `out`.
 */
export function decodeToF32(
  src: Uint8Array,
  dtype: FloatDType,
  out: Float32Array,
  count: number,
): void {
  if (src.byteLength < count * dtypeSize(dtype)) {
    throw new RangeError(`decodeToF32: ${src.byteLength} bytes hold fewer than ${count} ${dtype}`);
  }
  if (dtype === "f32") {
    const view = new DataView(src.buffer, src.byteOffset, count * 4);
    for (let i = 0; i < count; i++) out[i] = view.getFloat32(i * 4, true);
    return;
  }
  const outBits = new Uint32Array(out.buffer, out.byteOffset, count);
  if (dtype === "bf16") {
    for (let i = 0; i < count; i++) {
      outBits[i] = ((src[2 * i]! | (src[2 * i + 1]! << 8)) << 16) >>> 0;
    }
    return;
  }
  for (let i = 0; i < count; i++) out[i] = f16ToNumber(src[2 * i]! | (src[2 * i + 1]! << 8));
}

/** Encodes float32 values as `dtype`, little-endian, rounding like MLX's casts. */
export function encodeFromF32(values: Float32Array, dtype: FloatDType): Buffer {
  const out = Buffer.alloc(values.length * dtypeSize(dtype));
  if (dtype === "f32") {
    for (let i = 0; i < values.length; i++) out.writeFloatLE(values[i]!, i * 4);
    return out;
  }
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  for (let i = 0; i < values.length; i++) {
    const h = dtype === "bf16" ? bf16BitsFromF32Bits(bits[i]!) : f16BitsFromF32Bits(bits[i]!);
    out[2 * i] = h & 0xff;
    out[2 * i + 1] = h >>> 8;
  }
  return out;
}
