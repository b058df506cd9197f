/**
 * Schema of `manifest.json` (docs/format.md, format version 1) and its consistency check against
 * the tensors the architecture's family requires (core/models). The importer writes manifests that pass `parseManifest`; readers
 * (the CLI, the installer, the engine's loader via the CLI) use it before trusting a directory.
 */
import { z } from "zod";
import { FLOAT_DTYPES, type FloatDType, dtypeSize } from "./dtype.ts";
import { isSafeRelativePath } from "./paths.ts";
import { FAMILY_IDS, expectedTensors } from "../models/index.ts";

export const FORMAT_NAME = "redwing-model";
export const FORMAT_VERSION = 1;
/** Alignment of every tensor region in weights.bin and inside an expert blob. */
export const TENSOR_ALIGNMENT = 64;
/** Expert blobs are padded to a multiple of this, so one aligned read fetches one expert. */
export const EXPERT_ALIGNMENT = 16384;
export const MANIFEST_FILE = "manifest.json";
export const WEIGHTS_FILE = "weights.bin";
export const EXPERTS_DIR = "experts";
/** Files copied from the checkpoint when present (docs/format.md). */
export const AUXILIARY_FILES = [
  "tokenizer.json",
  "tokenizer_config.json",
  "chat_template.jinja",
  "generation_config.json",
  "special_tokens_map.json",
] as const;

export function expertFileName(layer: number): string {
  return `${EXPERTS_DIR}/layer_${String(layer).padStart(3, "0")}.bin`;
}

/*
 * Bounds shared with the native reader (native/src/format/model_dir.cpp; the two are held equal
 * by fixtures/manifest-corpus): counts and ids fit the engine's 32-bit ints, sizes and offsets
 * are safe integers (z.number().int() already refuses others), and the float fields that scale
 * activations are finite and within a range no real model leaves, so a manifest cannot make every
 * activation inf or NaN.
 */
export const MAX_COUNT = 2 ** 31 - 1;
export const SCALE_RANGE = [1e-6, 1e6] as const;
export const EPS_RANGE = [1e-12, 1] as const;
export const THETA_RANGE = [1, 1e12] as const;

const int = z.number().int();
const nonNeg = int.nonnegative();
const pos = int.positive();
/** A count or id the engine holds in a 32-bit int. */
const count = pos.max(MAX_COUNT);
const countOrZero = nonNeg.max(MAX_COUNT);
const inRange = ([lo, hi]: readonly [number, number]) => z.number().min(lo).max(hi);
const floatDType = z.enum(FLOAT_DTYPES as [FloatDType, ...FloatDType[]]);
const sha256 = z.string().regex(/^[0-9a-f]{64}$/, "sha256 must be 64 lower-case hex digits");
const relPath = z.string().refine(isSafeRelativePath, {
  message: "path must be relative, use '/', and not contain '..' or start with '/'",
});

export const RopeSchema = z.object({
  theta: inRange(THETA_RANGE),
  rotary_pairs: countOrZero,
  freq_dim: count,
  scale: inRange(SCALE_RANGE),
});

export const LayerSchema = z
  .object({
    attention: z.enum(["sliding", "full"]),
    sliding_window: count.nullable(),
    head_dim: count,
    num_kv_heads: count,
    k_eq_v: z.boolean(),
    moe: z.boolean(),
    rope: RopeSchema,
  })
  .superRefine((layer, ctx) => {
    if ((layer.attention === "sliding") !== (layer.sliding_window !== null)) {
      ctx.addIssue({ code: "custom", message: "sliding_window is set exactly on sliding layers" });
    }
    if (layer.head_dim % 2 !== 0) ctx.addIssue({ code: "custom", message: "head_dim is odd" });
    if (layer.rope.rotary_pairs > layer.head_dim / 2) {
      ctx.addIssue({ code: "custom", message: "rope.rotary_pairs exceeds head_dim / 2" });
    }
  });

export const MoeSchema = z.object({
  num_experts: count,
  top_k: count,
  intermediate_size: count,
});

export const ArchitectureSchema = z
  .object({
    family: z.enum(FAMILY_IDS),
    vocab_size: count,
    hidden_size: count,
    num_layers: count,
    num_attention_heads: count,
    intermediate_size: count,
    rms_norm_eps: inRange(EPS_RANGE),
    norm_weight_offset: z.union([z.literal(0), z.literal(1)]),
    embed_scale: inRange(SCALE_RANGE),
    attention_scale: inRange(SCALE_RANGE),
    final_logit_softcap: inRange(SCALE_RANGE).nullable(),
    activation: z.literal("gelu_tanh"),
    tie_word_embeddings: z.literal(true),
    v_norm: z.boolean(),
    moe: MoeSchema.nullable(),
    bos_token_id: countOrZero.nullable(),
    eos_token_ids: z.array(countOrZero).min(1),
    pad_token_id: countOrZero.nullable(),
    max_position_embeddings: pos,
    layers: z.array(LayerSchema),
  })
  .superRefine((arch, ctx) => {
    if (arch.layers.length !== arch.num_layers) {
      ctx.addIssue({ code: "custom", message: "layers has num_layers entries" });
    }
    if (arch.layers.some((l) => l.moe) && arch.moe === null) {
      ctx.addIssue({ code: "custom", message: "a layer has moe: true but moe is null" });
    }
    if (arch.moe && arch.moe.top_k > arch.moe.num_experts) {
      ctx.addIssue({ code: "custom", message: "moe.top_k exceeds moe.num_experts" });
    }
  });

export const RegionSchema = z.object({ offset: nonNeg, nbytes: nonNeg });

export const PlainTensorSchema = z.object({
  dtype: floatDType,
  shape: z.array(nonNeg),
  offset: nonNeg,
  nbytes: nonNeg,
});

export const QuantizedPartSchema = z.object({
  bits: z.union([z.literal(4), z.literal(8)]),
  group_size: z.union([z.literal(32), z.literal(64), z.literal(128)]),
  scale_dtype: floatDType,
  shape: z.tuple([pos, pos]),
  weight: RegionSchema,
  scales: RegionSchema,
  biases: RegionSchema,
});

export const QuantizedTensorSchema = QuantizedPartSchema.extend({ dtype: z.literal("affine") });

export const TensorSchema = z.union([PlainTensorSchema, QuantizedTensorSchema]);

export const ExpertLayerSchema = z.object({
  file: relPath,
  count,
  stride: pos,
  parts: z.object({
    gate_proj: QuantizedPartSchema,
    up_proj: QuantizedPartSchema,
    down_proj: QuantizedPartSchema,
  }),
});

export const FileEntrySchema = z.object({ path: relPath, size: nonNeg, sha256 });

export const SourceSchema = z.object({
  kind: z.enum(["mlx-affine", "hf-float", "synthetic"]),
  repo: z.string().nullable(),
  revision: z.string().nullable(),
  files: z.array(z.object({ path: z.string(), size: nonNeg, sha256 })),
});

export const ManifestSchema = z.object({
  format: z.literal(FORMAT_NAME),
  format_version: z.literal(FORMAT_VERSION),
  created_by: z.string(),
  architecture: ArchitectureSchema,
  source: SourceSchema,
  quantization: z.object({ group_size: pos, bits: pos }),
  tensors: z.record(z.string(), TensorSchema),
  experts: z
    .object({
      alignment: z.literal(EXPERT_ALIGNMENT),
      layers: z.record(z.string().regex(/^(0|[1-9][0-9]*)$/), ExpertLayerSchema),
    })
    .nullable(),
  files: z.array(FileEntrySchema),
});

export type Rope = z.infer<typeof RopeSchema>;
export type LayerArch = z.infer<typeof LayerSchema>;
export type Architecture = z.infer<typeof ArchitectureSchema>;
export type Region = z.infer<typeof RegionSchema>;
export type PlainTensor = z.infer<typeof PlainTensorSchema>;
export type QuantizedPart = z.infer<typeof QuantizedPartSchema>;
export type QuantizedTensor = z.infer<typeof QuantizedTensorSchema>;
export type TensorEntry = z.infer<typeof TensorSchema>;
export type ExpertLayer = z.infer<typeof ExpertLayerSchema>;
export type FileEntry = z.infer<typeof FileEntrySchema>;
export type Source = z.infer<typeof SourceSchema>;
export type Manifest = z.infer<typeof ManifestSchema>;

export function isQuantized(t: TensorEntry): t is QuantizedTensor {
  return t.dtype === "affine";
}

/** What an architecture needs: resident tensor names with their kind and logical shape. */
export interface TensorSpec {
  name: string;
  kind: "plain" | "quantized";
  shape: number[];
}

/** Logical shapes of the three parts of one expert. */
export function expertPartShapes(arch: Architecture): Record<ExpertPartName, [number, number]> {
  const moe = arch.moe;
  if (!moe) throw new Error("expertPartShapes: architecture has no MoE");
  const h = arch.hidden_size;
  const i = moe.intermediate_size;
  return { gate_proj: [i, h], up_proj: [i, h], down_proj: [h, i] };
}

export const EXPERT_PARTS = ["gate_proj", "up_proj", "down_proj"] as const;
export type ExpertPartName = (typeof EXPERT_PARTS)[number];

export function plainNbytes(dtype: FloatDType, shape: number[]): number {
  return shape.reduce((a, b) => a * b, 1) * dtypeSize(dtype);
}

/** Byte sizes a quantized part must have for its shape, bits, group size and scale dtype. */
export function quantizedPartNbytes(part: {
  shape: [number, number];
  bits: number;
  group_size: number;
  scale_dtype: FloatDType;
}): { weight: number; scales: number; biases: number } {
  const [rows, cols] = part.shape;
  const s = rows * (cols / part.group_size) * dtypeSize(part.scale_dtype);
  return { weight: (rows * cols * part.bits) / 8, scales: s, biases: s };
}

export function alignUp(n: number, alignment: number): number {
  return Math.ceil(n / alignment) * alignment;
}

/**
 * The manifest entry of MoE layer `layer`'s expert file: each expert's parts laid out one after
 * the other (every region aligned), the blob padded to EXPERT_ALIGNMENT.
 */
export function expertLayerLayout(
  layer: number,
  count: number,
  parts: Record<ExpertPartName, Omit<QuantizedPart, "weight" | "scales" | "biases">>,
): ExpertLayer {
  let offset = 0;
  const laid = {} as Record<ExpertPartName, QuantizedPart>;
  for (const p of EXPERT_PARTS) {
    const meta = parts[p];
    const sizes = quantizedPartNbytes(meta);
    const regions = {} as Record<"weight" | "scales" | "biases", Region>;
    for (const r of ["weight", "scales", "biases"] as const) {
      offset = alignUp(offset, TENSOR_ALIGNMENT);
      regions[r] = { offset, nbytes: sizes[r] };
      offset += sizes[r];
    }
    laid[p] = { ...meta, ...regions };
  }
  return {
    file: expertFileName(layer),
    count,
    stride: alignUp(offset, EXPERT_ALIGNMENT),
    parts: laid,
  };
}

/**
 * Checks everything the schema cannot: names and shapes against the architecture, region sizes,
 * alignment, overlap, bounds (given the sizes of the files the manifest lists) and the file
 * list. Returns a list of problems (empty when the manifest is consistent).
 */
export function checkManifestLayout(manifest: Manifest): string[] {
  const problems: string[] = [];
  const arch = manifest.architecture;
  const fileSizes = new Map(manifest.files.map((f) => [f.path, f.size]));
  const seenPaths = new Set<string>();
  for (const f of manifest.files) {
    if (seenPaths.has(f.path)) problems.push(`files lists ${f.path} twice`);
    seenPaths.add(f.path);
    if (f.path === MANIFEST_FILE) problems.push(`files lists ${MANIFEST_FILE} itself`);
    const parts = f.path.split("/");
    if (parts.length > 2 || (parts.length === 2 && parts[0] !== EXPERTS_DIR)) {
      problems.push(`${f.path}: only ${EXPERTS_DIR}/ may hold files in a sub-directory`);
    }
  }
  const weightsSize = fileSizes.get(WEIGHTS_FILE);
  if (weightsSize === undefined) problems.push(`files does not list ${WEIGHTS_FILE}`);

  // Names and shapes.
  const expected = expectedTensors(arch);
  const expectedNames = new Set(expected.map((t) => t.name));
  for (const spec of expected) {
    const t = manifest.tensors[spec.name];
    if (!t) {
      problems.push(`tensor ${spec.name} is missing`);
      continue;
    }
    const kind = isQuantized(t) ? "quantized" : "plain";
    if (kind !== spec.kind) problems.push(`tensor ${spec.name} must be ${spec.kind}`);
    if (JSON.stringify(t.shape) !== JSON.stringify(spec.shape)) {
      problems.push(
        `tensor ${spec.name} has shape ${JSON.stringify(t.shape)}, expected ${JSON.stringify(spec.shape)}`,
      );
    }
  }
  for (const name of Object.keys(manifest.tensors)) {
    if (!expectedNames.has(name)) problems.push(`unexpected tensor ${name}`);
  }

  // Regions in weights.bin.
  const regions: { what: string; offset: number; nbytes: number }[] = [];
  for (const [name, t] of Object.entries(manifest.tensors)) {
    if (isQuantized(t)) {
      problems.push(...checkQuantizedPart(`tensor ${name}`, t));
      for (const r of ["weight", "scales", "biases"] as const) {
        regions.push({ what: `tensor ${name} ${r}`, ...t[r] });
      }
    } else {
      const need = plainNbytes(t.dtype, t.shape);
      if (!Number.isSafeInteger(need)) problems.push(`tensor ${name}: bytes overflows (${need})`);
      else if (t.nbytes !== need) {
        problems.push(`tensor ${name}: nbytes ${t.nbytes}, expected ${need}`);
      }
      regions.push({ what: `tensor ${name}`, offset: t.offset, nbytes: t.nbytes });
    }
  }
  problems.push(...checkRegions(regions, weightsSize ?? Infinity, WEIGHTS_FILE));

  // Expert files.
  const moeLayers = arch.layers.flatMap((l, i) => (l.moe ? [i] : []));
  const expertLayers = manifest.experts?.layers ?? {};
  if (moeLayers.length > 0 && manifest.experts === null) {
    problems.push("the architecture has MoE layers but experts is null");
  }
  for (const i of moeLayers) {
    if (!expertLayers[String(i)]) problems.push(`experts.layers.${i} is missing`);
  }
  for (const [key, layer] of Object.entries(expertLayers)) {
    const i = Number(key);
    const what = `experts.layers.${key}`;
    if (!arch.layers[i]?.moe) {
      problems.push(`${what}: layer ${key} is not an MoE layer`);
      continue;
    }
    if (layer.file !== expertFileName(i)) {
      problems.push(`${what}: file must be ${expertFileName(i)}, not ${layer.file}`);
    }
    if (layer.count !== arch.moe!.num_experts) {
      problems.push(`${what}: count ${layer.count}, expected ${arch.moe!.num_experts}`);
    }
    if (layer.stride % EXPERT_ALIGNMENT !== 0) {
      problems.push(`${what}: stride ${layer.stride} is not a multiple of ${EXPERT_ALIGNMENT}`);
    }
    const shapes = expertPartShapes(arch);
    const blob: { what: string; offset: number; nbytes: number }[] = [];
    for (const p of EXPERT_PARTS) {
      const part = layer.parts[p];
      if (JSON.stringify(part.shape) !== JSON.stringify(shapes[p])) {
        problems.push(
          `${what}.parts.${p}: shape ${JSON.stringify(part.shape)}, expected ${JSON.stringify(shapes[p])}`,
        );
      }
      problems.push(...checkQuantizedPart(`${what}.parts.${p}`, part));
      for (const r of ["weight", "scales", "biases"] as const) {
        blob.push({ what: `${what}.parts.${p}.${r}`, ...part[r] });
      }
    }
    problems.push(...checkRegions(blob, layer.stride, `${what} blob (stride)`));
    const size = fileSizes.get(layer.file);
    if (size === undefined) problems.push(`files does not list ${layer.file}`);
    else if (size !== layer.count * layer.stride) {
      problems.push(
        `${layer.file}: size ${size}, expected count * stride = ${layer.count * layer.stride}`,
      );
    }
  }
  for (const f of manifest.files) {
    if (f.path.startsWith(`${EXPERTS_DIR}/`)) {
      const listed = Object.values(expertLayers).some((l) => l.file === f.path);
      if (!listed) problems.push(`${f.path} is not the file of any expert layer`);
    } else if (
      f.path !== WEIGHTS_FILE &&
      !(AUXILIARY_FILES as readonly string[]).includes(f.path)
    ) {
      problems.push(`${f.path} is not a file the format allows`);
    }
  }
  return problems;
}

function checkQuantizedPart(what: string, part: QuantizedPart): string[] {
  const problems: string[] = [];
  const [, cols] = part.shape;
  if (cols % part.group_size !== 0) {
    problems.push(`${what}: ${cols} columns are not a multiple of group_size ${part.group_size}`);
    return problems;
  }
  const need = quantizedPartNbytes(part);
  for (const r of ["weight", "scales", "biases"] as const) {
    // Beyond 2^53 a number is not exact: the native reader's checked arithmetic refuses it too.
    if (!Number.isSafeInteger(need[r])) {
      problems.push(`${what}.${r} bytes overflows (${need[r]})`);
    } else if (part[r].nbytes !== need[r]) {
      problems.push(`${what}: ${r} has ${part[r].nbytes} bytes, expected ${need[r]}`);
    }
  }
  return problems;
}

function checkRegions(
  regions: { what: string; offset: number; nbytes: number }[],
  limit: number,
  container: string,
): string[] {
  const problems: string[] = [];
  for (const r of regions) {
    if (r.offset % TENSOR_ALIGNMENT !== 0) {
      problems.push(`${r.what}: offset ${r.offset} is not a multiple of ${TENSOR_ALIGNMENT}`);
    }
    if (r.offset + r.nbytes > limit) {
      problems.push(
        `${r.what}: ends at ${r.offset + r.nbytes}, past the end of ${container} (${limit})`,
      );
    }
  }
  const sorted = [...regions].sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < sorted.length; i++) {
    const a = sorted[i - 1]!;
    const b = sorted[i]!;
    if (b.offset < a.offset + a.nbytes) problems.push(`${a.what} and ${b.what} overlap`);
  }
  return problems;
}
