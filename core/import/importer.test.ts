import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import {
  mkdtemp,
  readFile,
  readdir,
  rename,
  rm,
  symlink,
  truncate,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  bf16ToNumber,
  decodeToF32,
  encodeFromF32,
  f16ToNumber,
  type FloatDType,
} from "../format/dtype.ts";
import { type Manifest, type QuantizedPart } from "../format/manifest.ts";
import { readModelDir } from "../format/read.ts";
import { UserError } from "../errors.ts";
import { importForTest as imp } from "../../testkit/import.ts";
import {
  TINY_GEMMA3,
  TINY_GEMMA4_DENSE,
  TINY_GEMMA4_MOE,
  tinyTensors,
  writeTinyCheckpoint,
  type CheckpointOptions,
  type StTensor,
  type TinySpec,
} from "../../testkit/checkpoints.ts";

let root: string;
let counter = 0;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-import-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

async function checkpoint(spec: TinySpec, options: CheckpointOptions): Promise<string> {
  const dir = join(root, `ckpt-${counter++}`);
  await writeTinyCheckpoint(dir, spec, options);
  return dir;
}

function out(): string {
  return join(root, `model-${counter++}`);
}

async function files(dir: string): Promise<Map<string, Buffer>> {
  const m = new Map<string, Buffer>();
  for (const f of [
    "weights.bin",
    ...(await readdir(join(dir, "experts"))).map((e) => `experts/${e}`),
  ]) {
    m.set(f, await readFile(join(dir, f)));
  }
  return m;
}

const SPECS: [string, TinySpec][] = [
  ["gemma4 moe", TINY_GEMMA4_MOE],
  ["gemma4 dense", TINY_GEMMA4_DENSE],
  ["gemma3", TINY_GEMMA3],
];

describe("importCheckpoint", () => {
  for (const [label, spec] of SPECS) {
    it(`imports ${label} in both config forms, float and MLX, with identical bytes`, async () => {
      const results: {
        form: string;
        kind: string;
        manifest: Manifest;
        files: Map<string, Buffer>;
      }[] = [];
      for (const form of ["nested", "flat"] as const) {
        for (const kind of ["float", "mlx"] as const) {
          const src = await checkpoint(spec, {
            form,
            kind,
            vision: true,
            shards: form === "flat" ? 3 : 1,
          });
          const { dir } = await imp(src, out());
          const { manifest } = await readModelDir(dir, { verifyHashes: true });
          expect(manifest.source.kind).toBe(kind === "mlx" ? "mlx-affine" : "hf-float");
          expect(Object.keys(manifest.tensors).some((n) => n.includes("vision"))).toBe(false);
          results.push({ form, kind, manifest, files: await files(dir) });
        }
      }
      const first = results[0]!;
      expect(first.files.size).toBe(spec.moe ? 1 + spec.types.length : 1);
      for (const r of results.slice(1)) {
        expect(r.manifest.architecture).toEqual(first.manifest.architecture);
        expect(r.manifest.tensors).toEqual(first.manifest.tensors);
        expect(r.manifest.experts).toEqual(first.manifest.experts);
        for (const [path, bytes] of first.files) {
          expect(r.files.get(path)?.equals(bytes), `${r.form}/${r.kind} ${path}`).toBe(true);
        }
      }
    });
  }

  it("writes quantized matrices and experts that dequantize back to the source weights", async () => {
    const spec = TINY_GEMMA4_MOE;
    const src = await checkpoint(spec, { form: "nested", kind: "float", dtype: "bf16", seed: 4 });
    const { dir, manifest } = await imp(src, out());
    const weights = await readFile(join(dir, "weights.bin"));
    const source = new Map(tinyTensors(spec, 4).map((t) => [t.name, t]));
    // Round the source to bf16 as the checkpoint holds it.
    const bf16 = (v: Float32Array): Float32Array => {
      const back = new Float32Array(v.length);
      decodeToF32(encodeFromF32(v, "bf16"), "bf16", back, v.length);
      return back;
    };
    const check = (
      part: QuantizedPart,
      blob: Buffer,
      base: number,
      expected: Float32Array,
    ): void => {
      const [rows, cols] = part.shape;
      expect(expected.length).toBe(rows * cols);
      let worst = 0;
      for (let r = 0; r < rows; r++) {
        for (let c = 0; c < cols; c++) {
          const w = dequant(part, blob, base, r, c);
          const g = r * (cols / part.group_size) + Math.floor(c / part.group_size);
          const s = Math.abs(readScale(blob, base + part.scales.offset, g, part.scale_dtype));
          worst = Math.max(worst, Math.abs(w - expected[r * cols + c]!) / s);
        }
      }
      // One step (the edge snap), plus the rounding of the scale to bf16 (relative 2^-8)
      // multiplied by q <= 2^bits - 1.
      expect(worst).toBeLessThanOrEqual(1 + ((1 << part.bits) - 1) * 2 ** -8 + 0.01);
    };
    const embed = manifest.tensors["embed_tokens"] as QuantizedPart;
    check(embed, weights, 0, bf16(source.get("embed_tokens")!.values));
    const router = manifest.tensors["layers.1.router.proj"] as QuantizedPart;
    expect(router.bits).toBe(8);
    check(router, weights, 0, bf16(source.get("layers.1.router.proj")!.values));
    // Experts: expert 2 of layer 1, gate = first I rows of gate_up_proj[2], up = the rest.
    const layer = manifest.experts!.layers["1"]!;
    const expertFile = await readFile(join(dir, layer.file));
    expect(expertFile.length).toBe(layer.count * layer.stride);
    expect(layer.stride % 16384).toBe(0);
    const { intermediate: mi } = spec.moe!;
    const h = spec.hidden;
    const gateUp = bf16(source.get("layers.1.experts.gate_up_proj")!.values);
    const down = bf16(source.get("layers.1.experts.down_proj")!.values);
    const e = 2;
    check(
      layer.parts.gate_proj,
      expertFile,
      e * layer.stride,
      gateUp.subarray(e * 2 * mi * h, (e * 2 + 1) * mi * h),
    );
    check(
      layer.parts.up_proj,
      expertFile,
      e * layer.stride,
      gateUp.subarray((e * 2 + 1) * mi * h, (e + 1) * 2 * mi * h),
    );
    check(
      layer.parts.down_proj,
      expertFile,
      e * layer.stride,
      down.subarray(e * h * mi, (e + 1) * h * mi),
    );
  });

  it("copies norms and scalars byte for byte in the source dtype (f32, f16)", async () => {
    for (const dtype of ["f32", "f16"] as const) {
      const src = await checkpoint(TINY_GEMMA3, { form: "flat", kind: "float", dtype });
      const { dir, manifest } = await imp(src, out());
      const norm = manifest.tensors["layers.2.input_layernorm"]!;
      expect(norm.dtype).toBe(dtype);
      const weights = await readFile(join(dir, "weights.bin"));
      const t = tinyTensors(TINY_GEMMA3).find((x) => x.name === "layers.2.input_layernorm")!;
      const bytes = weights.subarray(
        (norm as { offset: number }).offset,
        (norm as { offset: number }).offset + (norm as { nbytes: number }).nbytes,
      );
      expect(bytes.equals(encodeFromF32(t.values, dtype))).toBe(true);
      expect((manifest.tensors["embed_tokens"] as QuantizedPart).scale_dtype).toBe(dtype);
    }
  });

  it("gives the same bytes whatever the row-block size", async () => {
    const src = await checkpoint(TINY_GEMMA4_DENSE, { form: "flat", kind: "float" });
    const a = await imp(src, out());
    const b = await imp(src, out(), { blockBytes: 700 });
    expect(
      (await readFile(join(b.dir, "weights.bin"))).equals(
        await readFile(join(a.dir, "weights.bin")),
      ),
    ).toBe(true);
  });

  it("records the source files, repo and revision, and copies tokenizer files and the template", async () => {
    const src = await checkpoint(TINY_GEMMA3, { form: "nested", kind: "mlx", shards: 2 });
    const { dir, manifest } = await imp(src, out(), {
      repo: "mlx-community/tiny",
      revision: "abc123",
    });
    expect(manifest.source.repo).toBe("mlx-community/tiny");
    expect(manifest.source.revision).toBe("abc123");
    const names = manifest.source.files.map((f) => f.path).sort();
    expect(names).toEqual(
      [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
      ].sort(),
    );
    for (const f of manifest.source.files) {
      const bytes = await readFile(join(src, f.path));
      expect(f.size).toBe(bytes.length);
      expect(f.sha256).toBe(createHash("sha256").update(bytes).digest("hex"));
    }
    const template = await readFile(join(dir, "chat_template.jinja"), "utf8");
    expect(template).toBe(
      JSON.parse(await readFile(join(src, "tokenizer_config.json"), "utf8")).chat_template,
    );
    expect(await readFile(join(dir, "tokenizer.json"), "utf8")).toBe(
      await readFile(join(src, "tokenizer.json"), "utf8"),
    );
    expect(manifest.architecture.eos_token_ids).toEqual([1, 106, 50]); // generation_config.json wins
    expect(manifest.quantization).toEqual({ group_size: 64, bits: 4 });
  });

  it("derives MLX bits from shapes without a quantization block, or reads quantization_config", async () => {
    const plain = await checkpoint(TINY_GEMMA4_MOE, { form: "flat", kind: "mlx" });
    const reference = await imp(plain, out());
    const variants: ((c: Record<string, unknown>) => void)[] = [
      (c) => {
        delete c.quantization;
        delete c.quantization_config;
      },
      (c) => delete c.quantization,
    ];
    for (const editConfig of variants) {
      const src = await checkpoint(TINY_GEMMA4_MOE, { form: "flat", kind: "mlx", editConfig });
      const { dir, manifest } = await imp(src, out());
      expect((manifest.tensors["layers.0.router.proj"] as QuantizedPart).bits).toBe(8);
      expect(manifest.quantization).toEqual({ group_size: 64, bits: 4 });
      expect(
        (await readFile(join(dir, "weights.bin"))).equals(
          await readFile(join(reference.dir, "weights.bin")),
        ),
      ).toBe(true);
    }
  });

  it("imports a checkpoint without tokenizer files (they are optional)", async () => {
    const src = await checkpoint(TINY_GEMMA3, { form: "flat", kind: "float", tokenizer: false });
    const { manifest } = await imp(src, out());
    expect(manifest.files.map((f) => f.path)).toEqual(["weights.bin"]);
    expect(manifest.architecture.eos_token_ids).toEqual([1, 106]);
  });
});

describe("importCheckpoint errors", () => {
  const drop = (pattern: RegExp) => (ts: StTensor[]) => ts.filter((t) => !pattern.test(t.name));
  const reshape = (name: string, shape: number[], nbytes?: number) => (ts: StTensor[]) =>
    ts.map((t) =>
      t.name === name
        ? { ...t, shape, data: nbytes === undefined ? t.data : Buffer.alloc(nbytes) }
        : t,
    );

  async function expectImportError(
    spec: TinySpec,
    options: CheckpointOptions,
    pattern: RegExp,
  ): Promise<void> {
    const src = await checkpoint(spec, options);
    const dest = out();
    await expect(imp(src, dest)).rejects.toThrow(pattern);
    // Nothing is left behind: no model and no partial directory.
    expect((await readdir(root)).filter((e) => e.includes(dest.split("/").pop()!))).toEqual([]);
  }

  it("names missing tensors", async () => {
    await expectImportError(
      TINY_GEMMA4_MOE,
      {
        form: "nested",
        kind: "float",
        edit: drop(/layers\.1\.self_attn\.k_norm|layers\.2\.experts\.down_proj/),
      },
      /missing 2 tensor\(s\).*model\.language_model\.layers\.1\.self_attn\.k_norm\.weight.*layers\.2\.experts\.down_proj/,
    );
    await expectImportError(
      TINY_GEMMA4_MOE,
      {
        form: "nested",
        kind: "mlx",
        edit: drop(/layers\.0\.experts\.switch_glu\.up_proj\.scales/),
      },
      /missing 1 tensor.*language_model\.model\.layers\.0\.experts\.switch_glu\.up_proj\.scales/,
    );
  });

  it("names misshapen tensors", async () => {
    await expectImportError(
      TINY_GEMMA3,
      {
        form: "flat",
        kind: "float",
        edit: reshape("model.layers.1.mlp.up_proj.weight", [128, 192]),
      },
      /model\.layers\.1\.mlp\.up_proj\.weight has shape \[128,192\], expected \[192,128\]/,
    );
    await expectImportError(
      TINY_GEMMA4_MOE,
      {
        form: "nested",
        kind: "float",
        edit: reshape(
          "model.language_model.layers.0.experts.gate_up_proj",
          [4, 64, 128],
          4 * 64 * 128 * 2,
        ),
      },
      /experts\.gate_up_proj has shape \[4,64,128\], expected \[4,128,128\]/,
    );
    await expectImportError(
      TINY_GEMMA3,
      {
        form: "flat",
        kind: "float",
        edit: (ts) =>
          ts.map((t) =>
            t.name === "model.norm.weight"
              ? { ...t, dtype: "I32", shape: [128], data: Buffer.alloc(512) }
              : t,
          ),
      },
      /model\.norm\.weight has dtype I32/,
    );
  });

  it("stops on unsupported features named in the config", async () => {
    await expectImportError(
      TINY_GEMMA4_DENSE,
      { form: "flat", kind: "float", editConfig: (c) => (c.hidden_size_per_layer_input = 64) },
      /per-layer embeddings \(hidden_size_per_layer_input: 64\)/,
    );
    await expectImportError(
      TINY_GEMMA3,
      { form: "flat", kind: "float", editConfig: (c) => (c.model_type = "qwen3") },
      /model_type qwen3/,
    );
  });

  it("stops on tensors it does not know", async () => {
    await expectImportError(
      TINY_GEMMA4_DENSE,
      {
        form: "flat",
        kind: "float",
        edit: (ts) => [
          ...ts,
          {
            name: "model.layers.0.per_layer_input_gate.weight",
            dtype: "BF16",
            shape: [2],
            data: Buffer.alloc(4),
          },
        ],
      },
      /tensors Redwing does not know.*model\.layers\.0\.per_layer_input_gate\.weight/,
    );
  });

  it("checks MLX bits and group size against the config and the engine", async () => {
    // The router is 8-bit; a config without the override says 4-bit.
    await expectImportError(
      TINY_GEMMA4_MOE,
      {
        form: "nested",
        kind: "mlx",
        editConfig: (c) => {
          const q = c.quantization as Record<string, unknown>;
          for (const k of Object.keys(q)) if (k.includes("router")) delete q[k];
        },
      },
      /language_model\.model\.layers\.0\.router\.proj is stored as 8-bit group 64 but config\.json says 4-bit group 64/,
    );
    // 3-bit: packed width 128 * 3 / 32 = 12 words.
    await expectImportError(
      TINY_GEMMA3,
      {
        form: "flat",
        kind: "mlx",
        prefix: "language_model.model.",
        edit: reshape(
          "language_model.model.layers.0.mlp.gate_proj.weight",
          [192, 12],
          192 * 12 * 4,
        ),
        editConfig: (c) => {
          (c.quantization as Record<string, unknown>)[
            "language_model.model.layers.0.mlp.gate_proj"
          ] = { bits: 3, group_size: 64 };
        },
      },
      /layers\.0\.mlp\.gate_proj uses 3-bit quantization; the Redwing engine supports 4 and 8 bits/,
    );
    await expectImportError(
      TINY_GEMMA3,
      {
        form: "flat",
        kind: "mlx",
        editConfig: (c) => ((c.quantization as Record<string, unknown>).group_size = 32),
      },
      /stored as 4-bit group 64 but config\.json says 4-bit group 32/,
    );
  });

  it("rejects float checkpoints quantized by other methods", async () => {
    await expectImportError(
      TINY_GEMMA3,
      {
        form: "flat",
        kind: "float",
        editConfig: (c) => (c.quantization_config = { quant_method: "fp8" }),
      },
      /declares fp8 quantization/,
    );
  });

  it("needs config.json and safetensors", async () => {
    const empty = join(root, `empty-${counter++}`);
    await writeTinyCheckpoint(empty, TINY_GEMMA3, { form: "flat", kind: "float" });
    await rm(join(empty, "model.safetensors"));
    await expect(imp(empty, out())).rejects.toThrow(/no \.safetensors files/);
    await rm(join(empty, "config.json"));
    await expect(imp(empty, out())).rejects.toThrow(/has no config\.json/);
    await writeFile(join(empty, "config.json"), "{not json");
    await expect(imp(empty, out())).rejects.toThrow(/config\.json is not valid JSON/);
    await expect(imp(join(root, "nope"), out())).rejects.toThrow(/does not exist/);
  });
});

describe("a hostile checkpoint", () => {
  async function expectRefused(src: string, code: string, pattern: RegExp): Promise<void> {
    const dest = out();
    let error: unknown = null;
    try {
      await imp(src, dest);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(UserError);
    expect((error as UserError).code).toBe(code);
    expect((error as Error).message).toMatch(pattern);
    expect(existsSync(dest)).toBe(false);
  }

  it("a symlinked chat_template.jinja (to a secret) is refused, not copied", async () => {
    const src = await checkpoint(TINY_GEMMA3, { form: "flat", kind: "float" });
    const secret = join(root, `secret-${counter++}`);
    await writeFile(secret, "the secret");
    await rm(join(src, "chat_template.jinja"), { force: true });
    await symlink(secret, join(src, "chat_template.jinja"));
    await expectRefused(src, "checkpoint_invalid", /chat_template\.jinja .* is a symbolic link/);
  });

  it("a symlinked tokenizer.json or shard is refused too", async () => {
    for (const name of ["tokenizer.json", "model.safetensors"]) {
      const src = await checkpoint(TINY_GEMMA3, { form: "flat", kind: "float" });
      const real = join(root, `real-${counter++}`);
      await rename(join(src, name), real);
      await symlink(real, join(src, name));
      await expectRefused(src, "checkpoint_invalid", new RegExp(`${name} .* is a symbolic link`));
    }
  });

  it.skipIf(process.platform === "win32")(
    "a FIFO as a shard is refused without opening it (no hang)",
    async () => {
      const src = await checkpoint(TINY_GEMMA3, { form: "flat", kind: "float" });
      await rm(join(src, "model.safetensors"));
      execFileSync("mkfifo", [join(src, "model.safetensors")]);
      await expectRefused(src, "checkpoint_invalid", /model\.safetensors .* is a FIFO/);
    },
    10_000,
  );

  it("a config.json of 100 MB is refused before reading it whole", async () => {
    const src = await checkpoint(TINY_GEMMA3, { form: "flat", kind: "float" });
    // Sparse: no disk space used.
    await truncate(join(src, "config.json"), 100 * 1024 * 1024);
    await expectRefused(src, "file_too_large", /config\.json .* has 104857600 bytes/);
  });
});

/** Element (r, c) of a quantized part stored at `base` in `blob`, per docs/format.md. */
function dequant(part: QuantizedPart, blob: Buffer, base: number, r: number, c: number): number {
  const [, cols] = part.shape;
  const bit = (r * cols + c) * part.bits;
  const word = blob.readUInt32LE(base + part.weight.offset + Math.floor(bit / 32) * 4);
  const q = (word >>> (bit % 32)) & ((1 << part.bits) - 1);
  const g = r * (cols / part.group_size) + Math.floor(c / part.group_size);
  const s = readScale(blob, base + part.scales.offset, g, part.scale_dtype);
  const b = readScale(blob, base + part.biases.offset, g, part.scale_dtype);
  return Math.fround(Math.fround(s * q) + b);
}

function readScale(blob: Buffer, at: number, i: number, dtype: FloatDType): number {
  if (dtype === "f32") return blob.readFloatLE(at + 4 * i);
  const bits = blob.readUInt16LE(at + 2 * i);
  return dtype === "bf16" ? bf16ToNumber(bits) : f16ToNumber(bits);
}
