// The benchmark's GGUF writer (bench/gguf.ts), read back by a reader written here from the
// format's description (ggml docs/gguf.md): header, typed metadata, tensor directory, aligned
// data. The llama.cpp benchmark loads the full model with llama.cpp itself.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  GgmlType,
  f16Bits,
  f32,
  randomBlocks,
  str,
  tensorBytes,
  u32,
  valuesF32,
  writeGguf,
} from "../bench/gguf.ts";
import { gemma4Gguf, gemma4LayerKinds } from "../bench/gguf-gemma4.ts";

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

/** A minimal GGUF v3 reader (scalars, strings and arrays of them). */
function readGguf(buf: Buffer) {
  let p = 0;
  const u32r = () => ((p += 4), buf.readUInt32LE(p - 4));
  const u64r = () => ((p += 8), Number(buf.readBigUInt64LE(p - 8)));
  const strr = () => {
    const n = u64r();
    p += n;
    return buf.toString("utf8", p - n, p);
  };
  const value = (type: number): unknown => {
    switch (type) {
      case 4:
        return u32r();
      case 5:
        return ((p += 4), buf.readInt32LE(p - 4));
      case 6:
        return ((p += 4), buf.readFloatLE(p - 4));
      case 7:
        return ((p += 1), buf[p - 1] !== 0);
      case 8:
        return strr();
      case 9: {
        const t = u32r();
        const n = u64r();
        return Array.from({ length: n }, () => value(t));
      }
      default:
        throw new Error(`type ${type} not handled by the test reader`);
    }
  };
  expect(buf.toString("latin1", 0, 4)).toBe("GGUF");
  p = 4;
  const version = u32r();
  const nTensors = u64r();
  const nKv = u64r();
  const kv: Record<string, unknown> = {};
  for (let i = 0; i < nKv; i++) {
    const key = strr();
    kv[key] = value(u32r());
  }
  const tensors = [];
  for (let i = 0; i < nTensors; i++) {
    const name = strr();
    const nd = u32r();
    const dims = Array.from({ length: nd }, () => u64r());
    tensors.push({ name, dims, type: u32r(), offset: u64r() });
  }
  const dataStart = Math.ceil(p / 32) * 32;
  return { version, kv, tensors, dataStart };
}

describe("GGUF writer", () => {
  it("rounds floats to IEEE half bits", () => {
    expect(f16Bits(1)).toBe(0x3c00);
    expect(f16Bits(-2)).toBe(0xc000);
    expect(f16Bits(0.1)).toBe(0x2e66);
    expect(f16Bits(65504)).toBe(0x7bff);
    expect(f16Bits(1 + 2 ** -11)).toBe(0x3c00); // a tie rounds to even
    expect(f16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02);
    expect(() => f16Bits(1e6)).toThrow(/f16/);
  });

  it("sizes quantized tensors by block and rejects partial blocks", () => {
    expect(tensorBytes([64, 3], GgmlType.Q4_0)).toBe(2 * 3 * 18);
    expect(tensorBytes([32, 2], GgmlType.Q8_0)).toBe(2 * 34);
    expect(tensorBytes([5], GgmlType.F32)).toBe(20);
    expect(() => tensorBytes([48, 2], GgmlType.Q4_0)).toThrow(/whole number/);
  });

  it("writes a file that a reader following the format description reads back", async () => {
    const dir = await mkdtemp(join(tmpdir(), "redwing-gguf-"));
    dirs.push(dir);
    const path = join(dir, "t.gguf");
    const size = await writeGguf(
      path,
      [
        ["general.architecture", str("test")],
        ["test.count", u32(7)],
        ["test.eps", f32(0.5)],
        ["test.pattern", { kind: "bool[]", value: [true, false, true] }],
        ["test.words", { kind: "string[]", value: ["a", "bc"] }],
      ],
      [
        { name: "v", dims: [3], type: GgmlType.F32, fill: valuesF32([1, 2, 3]) },
        { name: "m", dims: [64, 2], type: GgmlType.Q4_0, fill: randomBlocks(GgmlType.Q4_0, 0.25) },
      ],
    );
    const buf = await readFile(path);
    expect(buf.length).toBe(size);
    const g = readGguf(buf);
    expect(g.version).toBe(3);
    expect(g.kv).toEqual({
      "general.architecture": "test",
      "test.count": 7,
      "test.eps": 0.5,
      "test.pattern": [true, false, true],
      "test.words": ["a", "bc"],
    });
    expect(g.tensors).toEqual([
      { name: "v", dims: [3], type: 0, offset: 0 },
      { name: "m", dims: [64, 2], type: 2, offset: 32 }, // 12 bytes, padded to 32
    ]);
    const v = g.dataStart;
    expect([0, 1, 2].map((i) => buf.readFloatLE(v + 4 * i))).toEqual([1, 2, 3]);
    const m = g.dataStart + 32;
    for (let b = 0; b < 4; b++) expect(buf.readUInt16LE(m + 18 * b)).toBe(f16Bits(0.25));
    expect(buf.length).toBe(m + Math.ceil((4 * 18) / 32) * 32);
  });

  it("rejects a tensor listed twice", async () => {
    const t = { name: "x", dims: [1], type: GgmlType.F32, fill: valuesF32([0]) } as const;
    await expect(writeGguf(join(tmpdir(), "never.gguf"), [], [t, t])).rejects.toThrow(/twice/);
  });
});

describe("Gemma 4 26B-A4B GGUF", () => {
  it("has the synthetic model's shapes in llama.cpp's names", () => {
    expect(gemma4LayerKinds(3)).toEqual(["sliding", "sliding", "full"]);
    const { metadata, tensors } = gemma4Gguf(3);
    const kv = Object.fromEntries(metadata);
    expect(kv["gemma4.block_count"]).toEqual(u32(3));
    expect(kv["gemma4.attention.head_count_kv"]).toEqual({ kind: "u32[]", value: [8, 8, 2] });
    expect(kv["gemma4.attention.sliding_window_pattern"]).toEqual({
      kind: "bool[]",
      value: [true, true, false],
    });
    const byName = new Map(tensors.map((t) => [t.name, t]));
    expect(byName.get("token_embd.weight")?.dims).toEqual([2816, 262144]);
    expect(byName.get("blk.0.attn_q.weight")?.dims).toEqual([2816, 16 * 256]);
    expect(byName.get("blk.0.attn_v.weight")?.dims).toEqual([2816, 8 * 256]);
    expect(byName.has("blk.2.attn_v.weight")).toBe(false); // full layers: K is V
    expect(byName.get("blk.2.attn_k.weight")?.dims).toEqual([2816, 2 * 512]);
    expect(byName.get("blk.1.ffn_gate_up_exps.weight")?.dims).toEqual([2816, 2 * 704, 128]);
    expect(byName.get("blk.1.ffn_down_exps.weight")?.dims).toEqual([704, 2816, 128]);
    expect(byName.get("blk.1.ffn_gate_inp.weight")?.type).toBe(GgmlType.Q8_0);
    // One expert's three matrices at Q4_0: 3 * 704 * 2816 * 18 / 32 bytes, as many weights as
    // Redwing's expert stride holds at 4 bits with scale and bias per 64.
    const experts =
      tensorBytes([2816, 1408, 128], GgmlType.Q4_0) + tensorBytes([704, 2816, 128], GgmlType.Q4_0);
    expect(experts / 128).toBe((3 * 704 * 2816 * 18) / 32);
  });
});
