/**
 * A small GGUF writer (version 3), written from the format's documentation (ggml's
 * docs/gguf.md): a header, typed key-value metadata, a directory of tensors, then the tensor
 * data, each tensor at an offset that is a multiple of the alignment (32 unless
 * `general.alignment` says otherwise). Everything is little-endian; strings are a uint64 length
 * followed by UTF-8 bytes; a tensor's dimensions are listed innermost first (ne0 = columns).
 *
 * Only what the llama.cpp comparison benchmark needs: scalar, string and array metadata, and
 * F32, F16, Q4_0 and Q8_0 tensors whose data is produced in chunks, so that a 14 GB model is
 * written without holding it in memory.
 */
import { randomFillSync } from "node:crypto";
import { open } from "node:fs/promises";

/** ggml tensor types (the numbers are part of the format). */
export const GgmlType = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 8 } as const;
export type GgmlType = (typeof GgmlType)[keyof typeof GgmlType];

/** Elements per block and bytes per block of each type. */
const BLOCK: Record<GgmlType, { elements: number; bytes: number }> = {
  [GgmlType.F32]: { elements: 1, bytes: 4 },
  [GgmlType.F16]: { elements: 1, bytes: 2 },
  // Q4_0: an f16 scale d, then 16 bytes holding 32 4-bit codes q; x = d * (q - 8).
  [GgmlType.Q4_0]: { elements: 32, bytes: 18 },
  // Q8_0: an f16 scale d, then 32 int8 codes q; x = d * q.
  [GgmlType.Q8_0]: { elements: 32, bytes: 34 },
};

/** Metadata value types (the numbers are part of the format). */
const ValueType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

export type GgufValue =
  | { kind: "u32"; value: number }
  | { kind: "i32"; value: number }
  | { kind: "f32"; value: number }
  | { kind: "bool"; value: boolean }
  | { kind: "string"; value: string }
  | { kind: "u32[]"; value: readonly number[] }
  | { kind: "i32[]"; value: readonly number[] }
  | { kind: "f32[]"; value: readonly number[] }
  | { kind: "bool[]"; value: readonly boolean[] }
  | { kind: "string[]"; value: readonly string[] };

export const u32 = (value: number): GgufValue => ({ kind: "u32", value });
export const i32 = (value: number): GgufValue => ({ kind: "i32", value });
export const f32 = (value: number): GgufValue => ({ kind: "f32", value });
export const bool = (value: boolean): GgufValue => ({ kind: "bool", value });
export const str = (value: string): GgufValue => ({ kind: "string", value });

export interface GgufTensor {
  name: string;
  /** Innermost first: [columns, rows, ...]. */
  dims: readonly number[];
  type: GgmlType;
  /**
   * Fills `out` with the tensor's bytes from byte `offset` on. Called with consecutive ranges
   * that together cover the tensor; each range is a whole number of blocks.
   */
  fill: (out: Uint8Array, offset: number) => void;
}

/** The tensor's size in bytes; throws if the rows are not whole blocks. */
export function tensorBytes(dims: readonly number[], type: GgmlType): number {
  const { elements, bytes } = BLOCK[type];
  if (dims.length === 0 || dims.some((d) => !Number.isInteger(d) || d < 1))
    throw new RangeError(`bad tensor shape [${dims.join(", ")}]`);
  if (dims[0]! % elements !== 0)
    throw new RangeError(`a row of ${dims[0]} is not a whole number of ${elements}-element blocks`);
  return (dims.reduce((a, b) => a * b, 1) / elements) * bytes;
}

/** Little-endian byte sink that grows as needed (for the header and directory). */
class Bytes {
  private buf = new Uint8Array(1 << 16);
  private view = new DataView(this.buf.buffer);
  length = 0;

  private room(n: number): void {
    if (this.length + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.length + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.length));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u8(v: number): void {
    this.room(1);
    this.view.setUint8(this.length, v);
    this.length += 1;
  }
  u32(v: number): void {
    this.room(4);
    this.view.setUint32(this.length, v, true);
    this.length += 4;
  }
  i32(v: number): void {
    this.room(4);
    this.view.setInt32(this.length, v, true);
    this.length += 4;
  }
  f32(v: number): void {
    this.room(4);
    this.view.setFloat32(this.length, v, true);
    this.length += 4;
  }
  u64(v: number): void {
    this.room(8);
    this.view.setBigUint64(this.length, BigInt(v), true);
    this.length += 8;
  }
  string(s: string): void {
    const b = Buffer.from(s, "utf8");
    this.u64(b.length);
    this.room(b.length);
    this.buf.set(b, this.length);
    this.length += b.length;
  }
  pad(alignment: number): void {
    while (this.length % alignment !== 0) this.u8(0);
  }
  bytes(): Uint8Array {
    return this.buf.subarray(0, this.length);
  }
}

function writeValue(out: Bytes, v: GgufValue): void {
  const array = (type: number, n: number, each: (i: number) => void) => {
    out.u32(ValueType.ARRAY);
    out.u32(type);
    out.u64(n);
    for (let i = 0; i < n; i++) each(i);
  };
  switch (v.kind) {
    case "u32":
      out.u32(ValueType.UINT32);
      return out.u32(v.value);
    case "i32":
      out.u32(ValueType.INT32);
      return out.i32(v.value);
    case "f32":
      out.u32(ValueType.FLOAT32);
      return out.f32(v.value);
    case "bool":
      out.u32(ValueType.BOOL);
      return out.u8(v.value ? 1 : 0);
    case "string":
      out.u32(ValueType.STRING);
      return out.string(v.value);
    case "u32[]":
      return array(ValueType.UINT32, v.value.length, (i) => out.u32(v.value[i]!));
    case "i32[]":
      return array(ValueType.INT32, v.value.length, (i) => out.i32(v.value[i]!));
    case "f32[]":
      return array(ValueType.FLOAT32, v.value.length, (i) => out.f32(v.value[i]!));
    case "bool[]":
      return array(ValueType.BOOL, v.value.length, (i) => out.u8(v.value[i]! ? 1 : 0));
    case "string[]":
      return array(ValueType.STRING, v.value.length, (i) => out.string(v.value[i]!));
  }
}

const ALIGNMENT = 32;
/** Tensor data is produced and written in chunks of about this many bytes. */
const CHUNK_BYTES = 32 << 20;

/**
 * Writes a GGUF file. `metadata` keys are written in the given order; `general.alignment` must
 * not be among them (the default, 32, is used). Returns the file's size in bytes.
 */
export async function writeGguf(
  path: string,
  metadata: ReadonlyArray<readonly [string, GgufValue]>,
  tensors: readonly GgufTensor[],
): Promise<number> {
  const names = new Set<string>();
  for (const t of tensors) {
    if (names.has(t.name)) throw new Error(`tensor ${t.name} is listed twice`);
    names.add(t.name);
  }
  if (metadata.some(([k]) => k === "general.alignment"))
    throw new Error("general.alignment is fixed at 32 by this writer");

  const head = new Bytes();
  head.u32(0x46554747); // "GGUF" read as a little-endian uint32
  head.u32(3);
  head.u64(tensors.length);
  head.u64(metadata.length);
  for (const [key, value] of metadata) {
    head.string(key);
    writeValue(head, value);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    const size = tensorBytes(t.dims, t.type);
    head.string(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(t.type);
    head.u64(offset);
    offsets.push(offset);
    offset += Math.ceil(size / ALIGNMENT) * ALIGNMENT;
  }
  head.pad(ALIGNMENT);

  const file = await open(path, "w");
  try {
    await file.write(head.bytes());
    let position = head.length;
    const chunk = new Uint8Array(CHUNK_BYTES);
    for (const [i, t] of tensors.entries()) {
      const size = tensorBytes(t.dims, t.type);
      const block = BLOCK[t.type].bytes;
      const step = Math.floor(CHUNK_BYTES / block) * block;
      for (let done = 0; done < size; done += step) {
        const n = Math.min(step, size - done);
        const part = chunk.subarray(0, n);
        t.fill(part, done);
        await file.write(part, 0, n, position);
        position += n;
      }
      const end = head.length + offsets[i]! + Math.ceil(size / ALIGNMENT) * ALIGNMENT;
      if (position < end) {
        await file.write(new Uint8Array(end - position), 0, end - position, position);
        position = end;
      }
    }
    return position;
  } finally {
    await file.close();
  }
}

/** IEEE half bits of a float (round to nearest; normal range only, which is all we write). */
export function f16Bits(x: number): number {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer)[0]!;
  const sign = (u >>> 16) & 0x8000;
  const exp = ((u >>> 23) & 0xff) - 127 + 15;
  if (x === 0) return sign;
  if (exp <= 0 || exp >= 31) throw new RangeError(`${x} is outside the normal f16 range`);
  let mant = (u & 0x7fffff) >>> 13;
  let e = exp;
  if ((u & 0x1fff) > 0x1000 || ((u & 0x1fff) === 0x1000 && mant & 1)) {
    mant += 1;
    if (mant === 0x400) {
      mant = 0;
      e += 1;
    }
  }
  return sign | (e << 10) | mant;
}

/**
 * Random quantized blocks (Q4_0 or Q8_0) with every block's scale set to `scale`: the codes are
 * uniform random bytes, so the weights have mean about 0 and standard deviation about
 * 4.6 * scale (Q4_0) or 74 * scale (Q8_0).
 */
export function randomBlocks(type: GgmlType, scale: number): GgufTensor["fill"] {
  if (type !== GgmlType.Q4_0 && type !== GgmlType.Q8_0)
    throw new Error("randomBlocks makes Q4_0 or Q8_0 data");
  const block = BLOCK[type].bytes;
  const d = f16Bits(scale);
  return (out) => {
    randomFillSync(out);
    for (let i = 0; i < out.length; i += block) {
      out[i] = d & 0xff;
      out[i + 1] = d >>> 8;
    }
  };
}

/** An F32 tensor whose every element is `value`. */
export function constantF32(value: number): GgufTensor["fill"] {
  return (out) => {
    new Float32Array(out.buffer, out.byteOffset, out.length / 4).fill(value);
  };
}

/** An F32 tensor holding `values`. */
export function valuesF32(values: readonly number[]): GgufTensor["fill"] {
  return (out, offset) => {
    const f = new Float32Array(out.buffer, out.byteOffset, out.length / 4);
    for (let i = 0; i < f.length; i++) f[i] = values[offset / 4 + i]!;
  };
}
