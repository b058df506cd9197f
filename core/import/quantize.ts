/**
 * MLX affine quantization, reimplemented so that a float checkpoint imported by Redwing holds
 * the same bytes as the MLX checkpoint made from it. This file is the normative description
 * referred to by docs/format.md.
 *
 * Read from MLX @846d1762 (`mlx/backend/cpu/quantized.cpp` `quantize<T, U>`, which is also what
 * the `fallback` in `mlx/ops.cpp` `affine_quantize` computes). Per group of `g` consecutive
 * elements of a row, all in float32 (`n = 2^bits - 1`, `eps = (float)1e-7`):
 *
 *   w_max = max(w), w_min = min(w)                  (elements widened to float32)
 *   mask  = |w_min| > |w_max|
 *   scale = max((w_max - w_min) / n, eps);  scale = mask ? scale : -scale
 *   edge  = mask ? w_min : w_max
 *   q0    = rint(edge / scale)                      (ties to even)
 *   if q0 != 0: scale = edge / q0; bias = edge      else: bias = 0
 *   q     = clamp(rint((w - bias) / scale), 0, n)
 *   scales = (T)scale, biases = (T)bias             (T = the source dtype, round to nearest even)
 *
 * q is packed into little-endian uint32 words low bits first (element c at bit (c*bits)%32 of
 * word c*bits/32). Every float32 operation is emulated with Math.fround: JavaScript computes
 * +, -, * and / in double, and rounding an exact double result of two float32 operands to float32
 * is the correctly rounded float32 result (53 >= 2*24 + 2), so this matches C++ float arithmetic.
 *
 * The Metal kernel (`mlx/backend/metal/kernels/quantized.h` `affine_quantize`, what MLX uses on
 * Apple GPUs and so what mlx-community checkpoints were made with) differs in two ways: it starts
 * its max at 0 instead of -inf (so an all-negative group gets w_max = 0) and it rounds with Metal
 * `round` (ties away from zero) instead of `rint`. `variant: "metal"` emulates that for diagnosis;
 * the importer uses the CPU algorithm.
 */
import { type FloatDType, decodeToF32, dtypeSize, encodeFromF32 } from "../format/dtype.ts";

export type QuantVariant = "cpu" | "metal";

export interface QuantParams {
  bits: 4 | 8;
  groupSize: 32 | 64 | 128;
}

export interface QuantizedRows {
  /** uint32 words, `[rows, cols * bits / 32]`, little-endian. */
  weight: Buffer;
  /** `[rows, cols / groupSize]` in the source dtype. */
  scales: Buffer;
  biases: Buffer;
}

const EPS = Math.fround(1e-7);
const fr = Math.fround;

/** 1.5 * 2^52: adding it to a double below 2^51 in magnitude leaves an integer in the low bits. */
const RINT_MAGIC = 6755399441055744;

/**
 * C rint() of a float32 value: round to nearest, ties to even. Adding and subtracting 1.5 * 2^52
 * makes the double adder round at the units place with its own ties-to-even rule. This is exact
 * for every float32 input: below 2^51 the sum keeps the units place, and a float32 of 2^24 or
 * more is already an integer whose low bits the larger sum does not lose (its double ulp divides
 * the float32 spacing).
 */
function rintEven(x: number): number {
  return x + RINT_MAGIC - RINT_MAGIC;
}

/** Metal round(): round to nearest, ties away from zero. */
function roundAway(x: number): number {
  return x < 0 ? -Math.round(-x) : Math.round(x);
}

/**
 * Quantizes `rows` rows of `cols` float32 values (row-major in `values`). Returns packed words
 * and float32 scales/biases (not yet rounded to the storage dtype).
 */
export function quantizeF32(
  values: Float32Array,
  rows: number,
  cols: number,
  params: QuantParams,
  variant: QuantVariant = "cpu",
): { words: Uint32Array; scales: Float32Array; biases: Float32Array } {
  const { bits, groupSize } = params;
  checkParams(cols, params);
  if (values.length < rows * cols) throw new RangeError("quantizeF32: not enough values");
  const nBins = (1 << bits) - 1;
  const perWord = 32 / bits;
  const groupsPerRow = cols / groupSize;
  const nGroups = rows * groupsPerRow;
  const words = new Uint32Array((rows * cols) / perWord);
  const scales = new Float32Array(nGroups);
  const biases = new Float32Array(nGroups);
  const round = variant === "cpu" ? rintEven : roundAway;
  for (let gi = 0; gi < nGroups; gi++) {
    const base = gi * groupSize;
    let wMin = Infinity;
    let wMax = variant === "cpu" ? -Infinity : 0;
    for (let j = 0; j < groupSize; j++) {
      const v = values[base + j]!;
      if (v > wMax) wMax = v; // std::max(w_max, v): keeps w_max unless v is larger
      if (v < wMin) wMin = v;
    }
    const mask = Math.abs(wMin) > Math.abs(wMax);
    let scale = fr(fr(wMax - wMin) / nBins);
    if (!(scale >= EPS) && !Number.isNaN(scale)) scale = EPS; // std::max(x, eps)
    scale = mask ? scale : -scale;
    const edge = mask ? wMin : wMax;
    const q0 = round(fr(edge / scale));
    let bias = 0;
    if (q0 !== 0) {
      scale = fr(edge / q0);
      bias = edge;
    }
    scales[gi] = scale;
    biases[gi] = bias;
    // Pack: groupSize is a multiple of perWord, so a group fills whole words.
    let w = base / perWord;
    for (let j = 0; j < groupSize; j += perWord) {
      let word = 0;
      for (let k = 0; k < perWord; k++) {
        let q = round(fr(fr(values[base + j + k]! - bias) / scale));
        // Metal converts to uint8 without a lower clamp; a conversion saturates, which is the
        // same as clamping at 0 (only an exact -0.5 can round below 0 there).
        q = q < 0 ? 0 : q > nBins ? nBins : q;
        word |= q << (k * bits);
      }
      words[w++] = word >>> 0;
    }
  }
  return { words, scales, biases };
}

function checkParams(cols: number, { bits, groupSize }: QuantParams): void {
  if (bits !== 4 && bits !== 8) throw new RangeError(`unsupported bits ${String(bits)}`);
  if (groupSize !== 32 && groupSize !== 64 && groupSize !== 128) {
    throw new RangeError(`unsupported group size ${String(groupSize)}`);
  }
  if (cols % groupSize !== 0) {
    throw new RangeError(`${cols} columns are not a multiple of the group size ${groupSize}`);
  }
}

let scratch = new Float32Array(0);

/**
 * Quantizes `rows` rows of a row-major matrix stored as `dtype` bytes in `src`. Scales and
 * biases come back in `dtype`, as MLX stores them.
 */
export function quantizeRows(
  src: Uint8Array,
  dtype: FloatDType,
  rows: number,
  cols: number,
  params: QuantParams,
  variant: QuantVariant = "cpu",
): QuantizedRows {
  const count = rows * cols;
  if (src.byteLength !== count * dtypeSize(dtype)) {
    throw new RangeError(
      `quantizeRows: ${src.byteLength} bytes is not ${rows}x${cols} ${dtype} values`,
    );
  }
  // Reuse one float32 scratch buffer: blocks are quantized one after another, and a fresh
  // 64 MB array per block would leave the garbage collector far behind.
  if (scratch.length < count) scratch = new Float32Array(count);
  const values = scratch.subarray(0, count);
  decodeToF32(src, dtype, values, count);
  const { words, scales, biases } = quantizeF32(values, rows, cols, params, variant);
  return {
    weight: Buffer.from(words.buffer, words.byteOffset, words.byteLength),
    scales: encodeFromF32(scales, dtype),
    biases: encodeFromF32(biases, dtype),
  };
}

/** Byte sizes of the three regions of a quantized `[rows, cols]` matrix. */
export function quantizedSizes(
  rows: number,
  cols: number,
  bits: number,
  groupSize: number,
  scaleDtype: FloatDType,
): { weight: number; scales: number; biases: number } {
  const scales = rows * (cols / groupSize) * dtypeSize(scaleDtype);
  return { weight: (rows * cols * bits) / 8, scales, biases: scales };
}

/** Dequantizes one element, for tests and diagnostics: `s * q + b` in float32. */
export function dequantizeElement(
  words: Uint32Array,
  scales: Float32Array,
  biases: Float32Array,
  cols: number,
  params: QuantParams,
  r: number,
  c: number,
): number {
  const { bits, groupSize } = params;
  const bit = (r * cols + c) * bits;
  const q = (words[Math.floor(bit / 32)]! >>> (bit % 32)) & ((1 << bits) - 1);
  const g = r * (cols / groupSize) + Math.floor(c / groupSize);
  return fr(fr(scales[g]! * q) + biases[g]!);
}
