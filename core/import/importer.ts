/**
 * Checkpoint importer: reads a Hugging Face / MLX checkpoint directory and writes a Redwing model
 * directory (docs/format.md).
 *
 * - MLX affine checkpoints (`quantization` in config.json, `.weight`/`.scales`/`.biases` triples,
 *   stacked experts under `experts.switch_glu.*`): the quantized bytes are copied unchanged; bits
 *   and group size are derived from the shapes and checked against the config.
 * - Float checkpoints (bf16 / f16 / f32): matrices are quantized with MLX's algorithm
 *   (quantize.ts), 4-bit group 64, the router 8-bit group 64; norms and scalars are copied.
 *
 * Memory stays bounded: one tensor, one block of rows or one expert is in memory at a time.
 */
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { UserError } from "../errors.ts";
import { type FloatDType, dtypeSize } from "../format/dtype.ts";
import {
  EXPERT_PARTS,
  TENSOR_ALIGNMENT,
  WEIGHTS_FILE,
  alignUp,
  expertLayerLayout,
  expertPartShapes,
  quantizedPartNbytes,
  type Architecture,
  type ExpertLayer,
  type ExpertPartName,
  type Manifest,
  type QuantizedPart,
  type Region,
  type Source,
  type TensorEntry,
  type TensorSpec,
} from "../format/manifest.ts";
import { sha256File } from "../format/read.ts";
import { expectedTensors, modelFamily } from "../models/index.ts";
import { ModelWriter, type QuantizedData, type QuantizedMeta } from "../format/writer.ts";
import { checkRegularFile, readInputFile } from "./input-files.ts";
import { normalizeConfig } from "./config.ts";
import { type QuantParams, type QuantVariant, quantizeRows } from "./quantize.ts";
import { SafetensorsCheckpoint, type StDType, type TensorInfo } from "./safetensors.ts";

export interface ImportProgress {
  phase: "hashing" | "tensors" | "experts" | "finishing";
  /** Bytes of source data processed in this phase so far. */
  done: number;
  total: number;
  /** What is being processed (a tensor or file name). */
  item: string;
}

export interface ImportOptions {
  /** Replace an existing model at the destination. */
  force?: boolean;
  /** Hub repository and revision the checkpoint came from (null for a local directory). */
  repo?: string | null;
  revision?: string | null;
  onProgress?: (progress: ImportProgress) => void;
  /** Stops the import (the partial directory is removed). */
  signal?: AbortSignal;
  /** Recorded as `created_by`. */
  createdBy?: string;
  /** Largest block of source bytes quantized at once (default 16 MiB). */
  blockBytes?: number;
  /** fsync before installing (default true); see ModelWriterOptions.durable. */
  durable?: boolean;
  /** Which MLX backend to emulate when quantizing (tests and diagnosis only). */
  quantVariant?: QuantVariant;
}

export interface ImportResult {
  dir: string;
  manifest: Manifest;
}

/** Default quantization of float checkpoints (what mlx-lm's convert uses for Gemma). */
export const DEFAULT_QUANT: QuantParams = { bits: 4, groupSize: 64 };
/** The family's 8-bit matrices (the MoE router: mlx-lm / mlx-vlm quant_predicate). */
export const ROUTER_QUANT: QuantParams = { bits: 8, groupSize: 64 };

const FLOAT_ST: Partial<Record<StDType, FloatDType>> = { BF16: "bf16", F16: "f16", F32: "f32" };

export interface QuantConfig {
  /** The checkpoint family's tensor-name prefixes (overrides may be keyed with any of them). */
  prefixes: readonly string[];
  bits: number;
  group_size: number;
  overrides: Map<string, { bits: number; group_size: number } | false>;
}

/** A resident tensor, resolved to its source tensors. */
export type Job =
  | { kind: "plain"; spec: TensorSpec; src: TensorInfo }
  | { kind: "float-matrix"; spec: TensorSpec; src: TensorInfo; params: QuantParams }
  | {
      kind: "mlx-matrix";
      spec: TensorSpec;
      weight: TensorInfo;
      scales: TensorInfo;
      biases: TensorInfo;
      meta: QuantizedMeta;
    };

/** The experts of one MoE layer, resolved to source tensors. */
export interface ExpertJob {
  layer: number;
  /** Per part: where its rows of expert e live. */
  parts: Record<ExpertPartName, ExpertSource>;
  meta: Record<ExpertPartName, QuantizedMeta>;
}

export type ExpertSource =
  | { kind: "float"; src: TensorInfo; rowOffset: number; rowsTotal: number; params: QuantParams }
  | { kind: "mlx"; weight: TensorInfo; scales: TensorInfo; biases: TensorInfo };

export async function importCheckpoint(
  srcDir: string,
  outDir: string,
  options: ImportOptions = {},
): Promise<ImportResult> {
  const entries = await listCheckpoint(srcDir);
  // Before anything is opened: a FIFO must not block an open, a link must not be followed.
  for (const name of entries) {
    if (READ_BY_IMPORT.test(name)) await checkRegularFile(join(srcDir, name));
  }
  const config = await readJson(srcDir, "config.json", true);
  const generation = entries.includes("generation_config.json")
    ? await readJson(srcDir, "generation_config.json", false)
    : undefined;
  const { architecture: arch } = normalizeConfig(config, generation);
  const ckpt = await SafetensorsCheckpoint.open(srcDir, entries);
  let writer: ModelWriter | null = null;
  try {
    const plan = planImport(arch, ckpt, config as Record<string, unknown>);
    const auxFiles = pickAuxiliaryFiles(entries);
    const template = await extractTemplate(srcDir, entries);
    if (template) auxFiles.push(template);
    const sourceFiles = sourceFileNames(generation !== undefined, ckpt.files, auxFiles);
    // Create the writer first: it refuses an existing destination before any long work.
    writer = await ModelWriter.create(outDir, {
      force: options.force ?? false,
      createdBy: options.createdBy ?? "redwing",
      durable: options.durable ?? true,
    });
    const source: Source = {
      kind: plan.kind,
      repo: options.repo ?? null,
      revision: options.revision ?? null,
      files: await hashSourceFiles(srcDir, sourceFiles, options),
    };
    await writeTensors(writer, ckpt, plan.jobs, options);
    await writeExperts(writer, ckpt, plan.experts, arch, options);
    options.onProgress?.({ phase: "finishing", done: 0, total: 0, item: "manifest.json" });
    for (const f of auxFiles) {
      checkAborted(options.signal);
      if (f.template !== undefined) await writer.addFile(f.to, f.template);
      // Read here (a regular file, not through a link, size-capped), not copied by path.
      else await writer.addFile(f.to, await readInputFile(join(srcDir, f.from)));
    }
    const manifest = await writer.commit({
      architecture: arch,
      source,
      quantization: plan.defaultQuant,
    });
    return { dir: writer.dest, manifest };
  } catch (error) {
    await writer?.abort();
    throw error;
  } finally {
    await ckpt.close();
  }
}

/** The files an import may read: configs, index, shards, tokenizer, template. */
const READ_BY_IMPORT = /\.(json|safetensors|jinja|model)$/;

async function listCheckpoint(srcDir: string): Promise<string[]> {
  let st;
  try {
    st = await stat(srcDir);
  } catch {
    throw new UserError(`${srcDir} does not exist`, "checkpoint_missing");
  }
  if (!st.isDirectory()) throw new UserError(`${srcDir} is not a directory`, "checkpoint_missing");
  const entries = await readdir(srcDir);
  if (!entries.includes("config.json")) {
    throw new UserError(
      `${srcDir} has no config.json; is it a Hugging Face or MLX checkpoint?`,
      "checkpoint_incomplete",
    );
  }
  return entries.sort();
}

async function readJson(dir: string, name: string, required: boolean): Promise<unknown> {
  let text: string;
  try {
    text = (await readInputFile(join(dir, name))).toString("utf8");
  } catch (error) {
    if (error instanceof UserError) throw error;
    if (!required) return undefined;
    throw new UserError(
      `cannot read ${name}: ${(error as Error).message}`,
      "checkpoint_incomplete",
    );
  }
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new UserError(`${name} is not valid JSON: ${(error as Error).message}`, "config_invalid");
  }
}

function checkAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw new UserError("import interrupted", "interrupted");
}

// ---------------------------------------------------------------------------------------------
// Planning: resolve every tensor the architecture needs to source tensors, check names, shapes
// and dtypes before writing anything.

/** The tensors of a checkpoint: a local SafetensorsCheckpoint, or headers fetched from a hub. */
export interface TensorTable {
  get(name: string): TensorInfo | undefined;
  readonly tensors: Map<string, TensorInfo>;
}

/** What an import writes, resolved to source tensors and checked (see planImport). */
export interface ImportPlan {
  kind: Source["kind"];
  jobs: Job[];
  experts: ExpertJob[];
  defaultQuant: { group_size: number; bits: number };
}

/** The experts of one MoE layer: their count and each part's [rows, cols]. */
export interface MoeLayerShape {
  shapes: Record<ExpertPartName, [number, number]>;
  count: number;
  intermediate: number;
  hidden: number;
}

/**
 * Calls `visit` for each MoE layer of `arch` with the prefix its experts' tensors have in a
 * checkpoint (`<prefix>layers.<n>.experts.`) and their shapes: the walk the importer's plan and
 * the config-only layout (install/layout-from-config.ts) share.
 */
export function forEachMoeLayer(
  arch: Architecture,
  prefix: string,
  visit: (layer: number, base: string, shape: MoeLayerShape) => void,
): void {
  const moe = arch.moe;
  if (!moe) return;
  const shape: MoeLayerShape = {
    shapes: expertPartShapes(arch),
    count: moe.num_experts,
    intermediate: moe.intermediate_size,
    hidden: arch.hidden_size,
  };
  arch.layers.forEach((layer, li) => {
    if (layer.moe) visit(li, `${prefix}layers.${li}.experts.`, shape);
  });
}

/**
 * Resolves every tensor `arch` needs to source tensors of `ckpt` and checks names, shapes and
 * dtypes; throws a UserError naming what is missing, misshapen or unknown. Vision and audio
 * towers are left out. Nothing is read but the tensor table.
 */
export function planImport(
  arch: Architecture,
  ckpt: TensorTable,
  config: Record<string, unknown>,
): ImportPlan {
  const naming = modelFamily(arch.family).checkpoint;
  const prefix = naming.prefixes.find((p) => ckpt.get(`${p}embed_tokens.weight`) !== undefined);
  if (prefix === undefined) {
    throw new UserError(
      `the checkpoint has no embedding tensor (looked for ${naming.prefixes.map((p) => `${p}embed_tokens.weight`).join(", ")})`,
      "checkpoint_incomplete",
    );
  }
  const mlx = ckpt.get(`${prefix}embed_tokens.scales`) !== undefined;
  const quantConfig = readQuantConfig(config, mlx, naming.prefixes);
  const used = new Set<string>();
  const missing: string[] = [];
  const problems: string[] = [];
  const take = (name: string): TensorInfo | undefined => {
    const t = ckpt.get(name);
    if (t) used.add(name);
    else missing.push(name);
    return t;
  };

  const jobs: Job[] = [];
  for (const spec of expectedTensors(arch)) {
    const base = prefix + spec.name;
    if (spec.kind === "plain") {
      const bare = naming.bareSuffixes.some((s) => spec.name.endsWith(s));
      const src = take(bare ? base : `${base}.weight`);
      if (!src) continue;
      if (!sameShape(src.shape, spec.shape)) problems.push(shapeProblem(src, spec.shape));
      else if (!FLOAT_ST[src.dtype])
        problems.push(`${src.name} has dtype ${src.dtype}; expected BF16, F16 or F32`);
      else jobs.push({ kind: "plain", spec, src });
      continue;
    }
    const [rows, cols] = spec.shape as [number, number];
    if (!mlx) {
      const src = take(`${base}.weight`);
      if (!src) continue;
      if (!sameShape(src.shape, spec.shape)) problems.push(shapeProblem(src, spec.shape));
      else if (!FLOAT_ST[src.dtype])
        problems.push(`${src.name} has dtype ${src.dtype}; expected BF16, F16 or F32`);
      else {
        const eightBit = naming.eightBitSuffixes.some((s) => spec.name.endsWith(s));
        const params = eightBit ? ROUTER_QUANT : DEFAULT_QUANT;
        if (cols % params.groupSize !== 0) {
          problems.push(
            `${src.name} has ${cols} columns, not a multiple of the group size ${params.groupSize}`,
          );
        } else jobs.push({ kind: "float-matrix", spec, src, params });
      }
      continue;
    }
    const weight = take(`${base}.weight`);
    const scales = take(`${base}.scales`);
    const biases = take(`${base}.biases`);
    if (!weight || !scales || !biases) continue;
    const meta = mlxMeta(base, [weight, scales, biases], [], rows, cols, quantConfig, problems);
    if (meta) jobs.push({ kind: "mlx-matrix", spec, weight, scales, biases, meta });
  }

  const experts: ExpertJob[] = [];
  forEachMoeLayer(arch, prefix, (li, base, { shapes, count: e, intermediate: i, hidden: h }) => {
    const parts = {} as Record<ExpertPartName, ExpertSource>;
    const meta = {} as Record<ExpertPartName, QuantizedMeta>;
    if (mlx) {
      for (const p of EXPERT_PARTS) {
        const b = `${base}switch_glu.${p}`;
        const weight = take(`${b}.weight`);
        const scales = take(`${b}.scales`);
        const biases = take(`${b}.biases`);
        if (!weight || !scales || !biases) return;
        const [rows, cols] = shapes[p];
        const m = mlxMeta(b, [weight, scales, biases], [e], rows, cols, quantConfig, problems);
        if (!m) return;
        parts[p] = { kind: "mlx", weight, scales, biases };
        meta[p] = m;
      }
    } else if (ckpt.get(`${base}gate_up_proj`) || !ckpt.get(`${base}switch_glu.gate_proj.weight`)) {
      // transformers layout: fused gate_up_proj [E, 2I, H] and down_proj [E, H, I].
      const gateUp = take(`${base}gate_up_proj`);
      const down = take(`${base}down_proj`);
      if (!gateUp || !down) return;
      let ok = true;
      for (const [t, shape] of [
        [gateUp, [e, 2 * i, h]],
        [down, [e, h, i]],
      ] as const) {
        if (!sameShape(t.shape, shape)) {
          problems.push(shapeProblem(t, shape));
          ok = false;
        } else if (!FLOAT_ST[t.dtype]) {
          problems.push(`${t.name} has dtype ${t.dtype}; expected BF16, F16 or F32`);
          ok = false;
        }
      }
      if (!ok) return;
      parts.gate_proj = {
        kind: "float",
        src: gateUp,
        rowOffset: 0,
        rowsTotal: 2 * i,
        params: DEFAULT_QUANT,
      };
      parts.up_proj = {
        kind: "float",
        src: gateUp,
        rowOffset: i,
        rowsTotal: 2 * i,
        params: DEFAULT_QUANT,
      };
      parts.down_proj = {
        kind: "float",
        src: down,
        rowOffset: 0,
        rowsTotal: h,
        params: DEFAULT_QUANT,
      };
    } else {
      // An unquantized MLX layout: switch_glu.{gate,up,down}_proj.weight [E, rows, cols].
      for (const p of EXPERT_PARTS) {
        const t = take(`${base}switch_glu.${p}.weight`);
        if (!t) return;
        const [rows, cols] = shapes[p];
        if (!sameShape(t.shape, [e, rows, cols])) {
          problems.push(shapeProblem(t, [e, rows, cols]));
          return;
        }
        if (!FLOAT_ST[t.dtype]) {
          problems.push(`${t.name} has dtype ${t.dtype}; expected BF16, F16 or F32`);
          return;
        }
        parts[p] = {
          kind: "float",
          src: t,
          rowOffset: 0,
          rowsTotal: rows,
          params: DEFAULT_QUANT,
        };
      }
    }
    if (!mlx) {
      for (const p of EXPERT_PARTS) {
        const src = parts[p] as Extract<ExpertSource, { kind: "float" }>;
        const [, cols] = shapes[p];
        if (cols % DEFAULT_QUANT.groupSize !== 0) {
          problems.push(
            `${src.src.name}: ${cols} columns are not a multiple of the group size ${DEFAULT_QUANT.groupSize}`,
          );
          return;
        }
        meta[p] = {
          bits: DEFAULT_QUANT.bits,
          group_size: DEFAULT_QUANT.groupSize,
          scale_dtype: FLOAT_ST[src.src.dtype]!,
          shape: shapes[p],
        };
      }
    }
    experts.push({ layer: li, parts, meta });
  });

  if (missing.length > 0) {
    const list = missing.slice(0, 8).join(", ");
    const more = missing.length > 8 ? ` and ${missing.length - 8} more` : "";
    throw new UserError(
      `the checkpoint is missing ${missing.length} tensor(s) the ${arch.family} architecture in config.json needs: ${list}${more}`,
      "checkpoint_incomplete",
    );
  }
  if (problems.length > 0) {
    const more = problems.length > 8 ? ` (and ${problems.length - 8} more)` : "";
    throw new UserError(
      `the checkpoint does not match its config.json: ${problems.slice(0, 8).join("; ")}${more}`,
      "checkpoint_invalid",
    );
  }

  // Anything left in the language model that we do not use means a feature we do not know.
  const unexpected: string[] = [];
  for (const name of ckpt.tensors.keys()) {
    if (used.has(name) || !name.startsWith(prefix)) continue; // outside: vision/audio towers
    const rest = name.slice(prefix.length);
    if (naming.multimodalRoots.some((r) => rest === r || rest.startsWith(`${r}.`))) continue;
    if (rest.endsWith("rotary_emb.inv_freq")) continue; // a cached buffer, recomputed
    if (rest === "lm_head.weight") continue; // tied to the embedding
    unexpected.push(name);
  }
  if (unexpected.length > 0) {
    const list = unexpected.slice(0, 8).join(", ");
    const more = unexpected.length > 8 ? ` and ${unexpected.length - 8} more` : "";
    throw new UserError(
      `the checkpoint has tensors Redwing does not know (an unsupported feature?): ${list}${more}`,
      "unsupported_model",
    );
  }

  // The manifest's default: the config's, or without one the embedding's (MLX), or ours.
  const embed = jobs.find((j) => j.spec.name === "embed_tokens");
  const defaultQuant = quantConfig
    ? { group_size: quantConfig.group_size, bits: quantConfig.bits }
    : embed?.kind === "mlx-matrix"
      ? { group_size: embed.meta.group_size, bits: embed.meta.bits }
      : { group_size: DEFAULT_QUANT.groupSize, bits: DEFAULT_QUANT.bits };
  return { kind: mlx ? "mlx-affine" : "hf-float", jobs, experts, defaultQuant };
}

function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

function shapeProblem(t: TensorInfo, expected: readonly number[]): string {
  return `${t.name} has shape ${JSON.stringify(t.shape)}, expected ${JSON.stringify(expected)}`;
}

/**
 * A config's quantization block, unchecked: `quantization` (mlx-lm) or `quantization_config`
 * (transformers), at the top level or in `text_config` (multimodal configs); undefined or null
 * when there is none.
 */
export function quantizationBlock(config: Record<string, unknown>): unknown {
  const text = (config.text_config ?? {}) as Record<string, unknown>;
  return (
    config.quantization ??
    config.quantization_config ??
    text.quantization ??
    text.quantization_config
  );
}

/** The quantization block of an MLX config (quantizationBlock), checked and read. */
export function readQuantConfig(
  config: Record<string, unknown>,
  mlx: boolean,
  prefixes: readonly string[],
): QuantConfig | null {
  const q = quantizationBlock(config);
  if (q === undefined || q === null) return null;
  if (typeof q !== "object")
    throw new UserError("config.json: quantization must be an object", "config_invalid");
  const qc = q as Record<string, unknown>;
  if (!mlx) {
    const method = qc.quant_method ?? qc.mode ?? "affine";
    throw new UserError(
      `config.json declares ${String(method)} quantization but the tensors are not MLX affine-quantized; Redwing imports MLX affine or float (bf16/f16/f32) checkpoints`,
      "unsupported_model",
    );
  }
  if (qc.mode !== undefined && qc.mode !== "affine") {
    throw new UserError(
      `config.json: quantization mode ${JSON.stringify(qc.mode)} is not supported (only affine)`,
      "unsupported_model",
    );
  }
  if (qc.quant_method !== undefined && qc.quant_method !== "affine" && qc.quant_method !== "mlx") {
    throw new UserError(
      `config.json: quant_method ${JSON.stringify(qc.quant_method)} is not supported`,
      "unsupported_model",
    );
  }
  const bits = qc.bits;
  const group = qc.group_size;
  if (!Number.isSafeInteger(bits) || !Number.isSafeInteger(group)) {
    throw new UserError(
      "config.json: quantization needs integer bits and group_size",
      "config_invalid",
    );
  }
  const overrides = new Map<string, { bits: number; group_size: number } | false>();
  for (const [k, v] of Object.entries(qc)) {
    if (v === false) overrides.set(k, false);
    else if (typeof v === "object" && v !== null) {
      const o = v as Record<string, unknown>;
      overrides.set(k, {
        bits: Number.isSafeInteger(o.bits) ? (o.bits as number) : (bits as number),
        group_size: Number.isSafeInteger(o.group_size)
          ? (o.group_size as number)
          : (group as number),
      });
    }
  }
  return { prefixes, bits: bits as number, group_size: group as number, overrides };
}

/** Override for a module path; configs key them by the checkpoint's module path. */
export function lookupOverride(
  qc: QuantConfig,
  module: string,
): { bits: number; group_size: number } | false | undefined {
  if (qc.overrides.has(module)) return qc.overrides.get(module);
  // Some converters key overrides without the language-model prefix.
  for (const p of qc.prefixes) {
    if (module.startsWith(p)) {
      const rest = module.slice(p.length);
      for (const q of qc.prefixes)
        if (qc.overrides.has(q + rest)) return qc.overrides.get(q + rest);
      if (qc.overrides.has(rest)) return qc.overrides.get(rest);
    }
  }
  return undefined;
}

/**
 * Derives bits and group size of an MLX quantized matrix (optionally stacked over `lead`
 * dimensions) from its shapes: weight `[..., rows, cols * bits / 32]` uint32, scales and biases
 * `[..., rows, cols / group]`. Checks them against the config.
 */
function mlxMeta(
  module: string,
  [weight, scales, biases]: [TensorInfo, TensorInfo, TensorInfo],
  lead: number[],
  rows: number,
  cols: number,
  qc: QuantConfig | null,
  problems: string[],
): QuantizedMeta | null {
  const n = problems.length;
  if (weight.dtype !== "U32")
    problems.push(`${weight.name} has dtype ${weight.dtype}; an MLX quantized weight is U32`);
  const sd = FLOAT_ST[scales.dtype];
  if (!sd) problems.push(`${scales.name} has dtype ${scales.dtype}; expected BF16, F16 or F32`);
  if (biases.dtype !== scales.dtype)
    problems.push(
      `${biases.name} has dtype ${biases.dtype} but ${scales.name} has ${scales.dtype}`,
    );
  const ws = weight.shape;
  const ss = scales.shape;
  const k = lead.length;
  if (ws.length !== k + 2 || !sameShape(ws.slice(0, k + 1), [...lead, rows])) {
    problems.push(
      `${weight.name} has shape ${JSON.stringify(ws)}, expected ${JSON.stringify([...lead, rows, "cols*bits/32"])}`,
    );
  }
  if (ss.length !== k + 2 || !sameShape(ss.slice(0, k + 1), [...lead, rows])) {
    problems.push(
      `${scales.name} has shape ${JSON.stringify(ss)}, expected ${JSON.stringify([...lead, rows, "cols/group_size"])}`,
    );
  }
  if (!sameShape(biases.shape, ss))
    problems.push(
      `${biases.name} has shape ${JSON.stringify(biases.shape)}, unlike ${scales.name}`,
    );
  if (problems.length > n) return null;
  const packed = ws[k + 1]!;
  const groups = ss[k + 1]!;
  const bits = (packed * 32) / cols;
  const group = groups > 0 ? cols / groups : NaN;
  if (!Number.isInteger(bits) || !Number.isInteger(group)) {
    problems.push(
      `${module}: ${packed} packed words and ${groups} scale groups per row do not fit ${cols} columns`,
    );
    return null;
  }
  if (qc) {
    const o = lookupOverride(qc, module);
    if (o === false) {
      problems.push(`${module} is quantized but config.json says it is not`);
      return null;
    }
    const want = o ?? { bits: qc.bits, group_size: qc.group_size };
    if (want.bits !== bits || want.group_size !== group) {
      problems.push(
        `${module} is stored as ${bits}-bit group ${group} but config.json says ${want.bits}-bit group ${want.group_size}`,
      );
      return null;
    }
  }
  if (bits !== 4 && bits !== 8) {
    problems.push(
      `${module} uses ${bits}-bit quantization; the Redwing engine supports 4 and 8 bits`,
    );
    return null;
  }
  if (group !== 32 && group !== 64 && group !== 128) {
    problems.push(`${module} uses group size ${group}; supported group sizes are 32, 64 and 128`);
    return null;
  }
  return { bits, group_size: group, scale_dtype: sd!, shape: [rows, cols] };
}

// ---------------------------------------------------------------------------------------------
// Writing.

async function writeTensors(
  writer: ModelWriter,
  ckpt: SafetensorsCheckpoint,
  jobs: Job[],
  options: ImportOptions,
): Promise<void> {
  const total = jobs.reduce(
    (a, j) =>
      a +
      (j.kind === "mlx-matrix"
        ? j.weight.nbytes + j.scales.nbytes + j.biases.nbytes
        : j.src.nbytes),
    0,
  );
  let done = 0;
  const progress = (item: string, n: number): void => {
    done += n;
    options.onProgress?.({ phase: "tensors", done, total, item });
  };
  const blockBytes = options.blockBytes ?? 16 * 1024 * 1024;
  for (const job of jobs) {
    checkAborted(options.signal);
    const name = job.spec.name;
    if (job.kind === "plain") {
      await writer.addPlain(
        name,
        FLOAT_ST[job.src.dtype]!,
        job.spec.shape,
        await ckpt.read(job.src),
      );
      progress(name, job.src.nbytes);
    } else if (job.kind === "mlx-matrix") {
      const { weight } = job;
      async function* chunks(): AsyncGenerator<Uint8Array> {
        for (let off = 0; off < weight.nbytes; off += blockBytes) {
          checkAborted(options.signal);
          const n = Math.min(blockBytes, weight.nbytes - off);
          yield await ckpt.read(weight, off, n);
          progress(name, n);
        }
      }
      const scales = await ckpt.read(job.scales);
      const biases = await ckpt.read(job.biases);
      await writer.addQuantized(name, job.meta, chunks(), scales, biases);
      progress(name, scales.length + biases.length);
    } else {
      const { src, params } = job;
      const dtype = FLOAT_ST[src.dtype]!;
      const [rows, cols] = job.spec.shape as [number, number];
      const rowBytes = cols * dtypeSize(dtype);
      const rowsPerBlock = Math.max(1, Math.floor(blockBytes / rowBytes));
      const scaleParts: Buffer[] = [];
      const biasParts: Buffer[] = [];
      async function* chunks(): AsyncGenerator<Uint8Array> {
        for (let r = 0; r < rows; r += rowsPerBlock) {
          checkAborted(options.signal);
          const n = Math.min(rowsPerBlock, rows - r);
          const bytes = await ckpt.read(src, r * rowBytes, n * rowBytes);
          const q = quantizeRows(bytes, dtype, n, cols, params, options.quantVariant);
          scaleParts.push(q.scales);
          biasParts.push(q.biases);
          yield q.weight;
          progress(name, bytes.length);
        }
      }
      await writer.addQuantized(
        name,
        {
          bits: params.bits,
          group_size: params.groupSize,
          scale_dtype: dtype,
          shape: [rows, cols],
        },
        chunks(),
        () => Buffer.concat(scaleParts),
        () => Buffer.concat(biasParts),
      );
    }
  }
}

async function writeExperts(
  writer: ModelWriter,
  ckpt: SafetensorsCheckpoint,
  jobs: ExpertJob[],
  arch: Architecture,
  options: ImportOptions,
): Promise<void> {
  if (jobs.length === 0) return;
  const count = arch.moe!.num_experts;
  const total = jobs.length * count;
  let done = 0;
  for (const job of jobs) {
    const layerWriter = await writer.beginExpertLayer(job.layer, count, job.meta);
    for (let e = 0; e < count; e++) {
      checkAborted(options.signal);
      const data = {} as Record<ExpertPartName, QuantizedData>;
      for (const p of EXPERT_PARTS)
        data[p] = await readExpertPart(ckpt, job.parts[p], job.meta[p], e, options);
      await layerWriter.write(e, data);
      done++;
      options.onProgress?.({
        phase: "experts",
        done,
        total,
        item: `layer ${job.layer} expert ${e}`,
      });
    }
  }
}

async function readExpertPart(
  ckpt: SafetensorsCheckpoint,
  src: ExpertSource,
  meta: QuantizedMeta,
  e: number,
  options: ImportOptions,
): Promise<QuantizedData> {
  const count = (t: TensorInfo): number => t.shape[0]!;
  if (src.kind === "mlx") {
    // Stacked [E, ...]: expert e is the e-th equal slice of each tensor.
    const slice = (t: TensorInfo): Promise<Buffer> => {
      const per = t.nbytes / count(t);
      return ckpt.read(t, e * per, per);
    };
    return {
      weight: await slice(src.weight),
      scales: await slice(src.scales),
      biases: await slice(src.biases),
    };
  }
  const dtype = FLOAT_ST[src.src.dtype]!;
  const [rows, cols] = meta.shape;
  const rowBytes = cols * dtypeSize(dtype);
  const start = (e * src.rowsTotal + src.rowOffset) * rowBytes;
  const bytes = await ckpt.read(src.src, start, rows * rowBytes);
  return quantizeRows(bytes, dtype, rows, cols, src.params, options.quantVariant);
}

// ---------------------------------------------------------------------------------------------
// Auxiliary and source files.

export interface AuxFile {
  /** Source file name (for the source record). */
  from: string;
  /** Name in the model directory. */
  to: string;
  /** Content when it is not a plain copy (a template extracted from JSON). */
  template?: string;
}

/** The auxiliary files (tokenizer, generation config, template) among a checkpoint's files. */
export function pickAuxiliaryFiles(entries: string[]): AuxFile[] {
  const out: AuxFile[] = [];
  for (const name of [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
  ]) {
    if (entries.includes(name)) out.push({ from: name, to: name });
  }
  if (entries.includes("chat_template.jinja"))
    out.push({ from: "chat_template.jinja", to: "chat_template.jinja" });
  return out;
}

/** When there is no chat_template.jinja, the template may live in tokenizer_config.json or chat_template.json. */
async function extractTemplate(srcDir: string, entries: string[]): Promise<AuxFile | null> {
  if (entries.includes("chat_template.jinja")) return null;
  for (const name of TEMPLATE_SOURCES) {
    if (!entries.includes(name)) continue;
    const template = templateFromJson(name, await readJson(srcDir, name, false));
    if (template) return template;
  }
  return null;
}

/** Files that may hold the chat template when there is no chat_template.jinja, in order. */
export const TEMPLATE_SOURCES = ["tokenizer_config.json", "chat_template.json"] as const;

/** The chat template held in a parsed tokenizer_config.json or chat_template.json, if any. */
export function templateFromJson(name: string, parsed: unknown): AuxFile | null {
  const json = parsed as Record<string, unknown> | undefined;
  const t = json?.chat_template;
  if (typeof t === "string") return { from: name, to: "chat_template.jinja", template: t };
  if (Array.isArray(t)) {
    const list = t as { name?: unknown; template?: unknown }[];
    const pick = list.find((x) => x.name === "default") ?? list[0];
    if (pick && typeof pick.template === "string")
      return { from: name, to: "chat_template.jinja", template: pick.template };
  }
  return null;
}

/**
 * The checkpoint files an import reads, in the order the manifest's `source.files` lists them:
 * config, generation config, index and shards, then the auxiliary files.
 */
export function sourceFileNames(
  hasGeneration: boolean,
  checkpointFiles: string[],
  auxFiles: AuxFile[],
): string[] {
  const names = [
    "config.json",
    ...(hasGeneration ? ["generation_config.json"] : []),
    ...checkpointFiles,
    ...auxFiles
      .filter((f) => f.from !== "config.json" && f.from !== "generation_config.json")
      .map((f) => f.from),
  ];
  return [...new Set(names)];
}

async function hashSourceFiles(
  srcDir: string,
  names: string[],
  options: ImportOptions,
): Promise<Source["files"]> {
  const sizes = await Promise.all(names.map(async (n) => (await stat(join(srcDir, n))).size));
  const total = sizes.reduce((a, b) => a + b, 0);
  let done = 0;
  const out: Source["files"] = [];
  for (let i = 0; i < names.length; i++) {
    checkAborted(options.signal);
    const name = names[i]!;
    const sha256 = await sha256File(join(srcDir, name), (n) => {
      done += n;
      options.onProgress?.({ phase: "hashing", done, total, item: name });
    });
    out.push({ path: name, size: sizes[i]!, sha256 });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Placement: the same output as importCheckpoint, as writes at known offsets. The installer
// fetches source bytes in ranges, in any order and possibly more than once (a resume), so it
// needs each piece of output to have a fixed place: the layout below is the one ModelWriter
// produces writing the plan front to back (tests check that both give identical bytes).

/** Where everything goes in the model directory. */
export interface ImportLayout {
  /** The manifest's `tensors`, with the offsets and key order ModelWriter gives them. */
  tensors: Record<string, TensorEntry>;
  /** The manifest's `experts.layers`, by layer, or null without MoE layers. */
  expertLayers: Record<string, ExpertLayer> | null;
  /** The data files and their exact sizes: weights.bin, then the expert files by layer. */
  files: { path: string; size: number }[];
}

/** What a unit's source bytes become. */
export type UnitOp =
  /** Copied unchanged to `file` at byte `at`. */
  | { kind: "copy"; file: string; at: number }
  /** Whole rows of a float matrix, quantized; the three regions start at the given offsets. */
  | {
      kind: "quantize";
      dtype: FloatDType;
      rows: number;
      cols: number;
      params: QuantParams;
      file: string;
      weight: number;
      scales: number;
      biases: number;
    };

/** A piece of source tensor (`length` bytes at `offset` into `src`) and where it goes. */
export interface ImportUnit {
  src: TensorInfo;
  offset: number;
  length: number;
  op: UnitOp;
}

/** Bytes to write at `offset` of the data file `file` (a path relative to the model dir). */
export interface Placement {
  file: string;
  offset: number;
  data: Uint8Array;
}

function quantMetaOf(job: Job): QuantizedMeta | null {
  if (job.kind === "plain") return null;
  if (job.kind === "mlx-matrix") return job.meta;
  const [rows, cols] = job.spec.shape as [number, number];
  return {
    bits: job.params.bits as 4 | 8,
    group_size: job.params.groupSize as 32 | 64 | 128,
    scale_dtype: FLOAT_ST[job.src.dtype]!,
    shape: [rows, cols],
  };
}

/** The layout of the model directory a plan produces (see ModelWriter). */
export function layoutImport(plan: ImportPlan, arch: Architecture): ImportLayout {
  let position = 0;
  const region = (nbytes: number): Region => {
    position = alignUp(position, TENSOR_ALIGNMENT);
    const r = { offset: position, nbytes };
    position += nbytes;
    return r;
  };
  const tensors: Record<string, TensorEntry> = {};
  for (const job of plan.jobs) {
    const name = job.spec.name;
    const meta = quantMetaOf(job);
    if (job.kind === "plain" || meta === null) {
      const src = (job as Extract<Job, { kind: "plain" }>).src;
      const r = region(src.nbytes);
      tensors[name] = {
        dtype: FLOAT_ST[src.dtype]!,
        shape: job.spec.shape,
        offset: r.offset,
        nbytes: r.nbytes,
      };
      continue;
    }
    const sizes = quantizedPartNbytes(meta);
    const weight = region(sizes.weight);
    const scales = region(sizes.scales);
    const biases = region(sizes.biases);
    tensors[name] = { dtype: "affine", ...meta, weight, scales, biases };
  }
  const files = [{ path: WEIGHTS_FILE, size: position }];
  let expertLayers: Record<string, ExpertLayer> | null = null;
  if (plan.experts.length > 0) {
    expertLayers = {};
    const count = arch.moe!.num_experts;
    for (const job of [...plan.experts].sort((a, b) => a.layer - b.layer)) {
      const entry = expertLayerLayout(job.layer, count, job.meta);
      expertLayers[String(job.layer)] = entry;
      files.push({ path: entry.file, size: entry.count * entry.stride });
    }
  }
  return { tensors, expertLayers, files };
}

/**
 * Splits a plan into units of at most `maxBytes` source bytes each (whole rows for float
 * matrices, whole experts where they fit), each with its place in `layout`. Units of one source
 * tensor never overlap; together they cover every source byte the import reads.
 */
export function importUnits(
  plan: ImportPlan,
  layout: ImportLayout,
  maxBytes: number,
): ImportUnit[] {
  const units: ImportUnit[] = [];
  const copy = (
    src: TensorInfo,
    offset: number,
    length: number,
    file: string,
    at: number,
  ): void => {
    for (let done = 0; done < length; done += maxBytes) {
      const n = Math.min(maxBytes, length - done);
      units.push({
        src,
        offset: offset + done,
        length: n,
        op: { kind: "copy", file, at: at + done },
      });
    }
  };
  const quantize = (
    src: TensorInfo,
    rowStart: number,
    rows: number,
    cols: number,
    params: QuantParams,
    file: string,
    at: { weight: number; scales: number; biases: number },
  ): void => {
    const dtype = FLOAT_ST[src.dtype]!;
    const rowBytes = cols * dtypeSize(dtype);
    const wRow = (cols * params.bits) / 8;
    const sRow = (cols / params.groupSize) * dtypeSize(dtype);
    const perBlock = Math.max(1, Math.floor(maxBytes / rowBytes));
    for (let r = 0; r < rows; r += perBlock) {
      const n = Math.min(perBlock, rows - r);
      units.push({
        src,
        offset: (rowStart + r) * rowBytes,
        length: n * rowBytes,
        op: {
          kind: "quantize",
          dtype,
          rows: n,
          cols,
          params,
          file,
          weight: at.weight + r * wRow,
          scales: at.scales + r * sRow,
          biases: at.biases + r * sRow,
        },
      });
    }
  };
  for (const job of plan.jobs) {
    const entry = layout.tensors[job.spec.name]!;
    if (job.kind === "plain") {
      copy(job.src, 0, job.src.nbytes, WEIGHTS_FILE, (entry as { offset: number }).offset);
      continue;
    }
    const q = entry as QuantizedPart;
    if (job.kind === "mlx-matrix") {
      copy(job.weight, 0, job.weight.nbytes, WEIGHTS_FILE, q.weight.offset);
      copy(job.scales, 0, job.scales.nbytes, WEIGHTS_FILE, q.scales.offset);
      copy(job.biases, 0, job.biases.nbytes, WEIGHTS_FILE, q.biases.offset);
      continue;
    }
    const [rows, cols] = job.spec.shape as [number, number];
    quantize(job.src, 0, rows, cols, job.params, WEIGHTS_FILE, {
      weight: q.weight.offset,
      scales: q.scales.offset,
      biases: q.biases.offset,
    });
  }
  for (const job of plan.experts) {
    const layer = layout.expertLayers![String(job.layer)]!;
    for (let e = 0; e < layer.count; e++) {
      const base = e * layer.stride;
      for (const p of EXPERT_PARTS) {
        const part = layer.parts[p];
        const src = job.parts[p];
        if (src.kind === "mlx") {
          for (const r of ["weight", "scales", "biases"] as const) {
            const t = src[r];
            const per = t.nbytes / t.shape[0]!;
            copy(t, e * per, per, layer.file, base + part[r].offset);
          }
        } else {
          const [rows, cols] = part.shape as [number, number];
          quantize(src.src, e * src.rowsTotal + src.rowOffset, rows, cols, src.params, layer.file, {
            weight: base + part.weight.offset,
            scales: base + part.scales.offset,
            biases: base + part.biases.offset,
          });
        }
      }
    }
  }
  return units;
}

/** Turns a unit's source bytes into the writes that place them (quantizing float rows). */
export function produceUnit(
  unit: ImportUnit,
  bytes: Uint8Array,
  variant?: QuantVariant,
): Placement[] {
  if (bytes.byteLength !== unit.length) {
    throw new RangeError(
      `${unit.src.name}: ${bytes.byteLength} bytes for a ${unit.length}-byte unit`,
    );
  }
  const op = unit.op;
  if (op.kind === "copy") return [{ file: op.file, offset: op.at, data: bytes }];
  const q = quantizeRows(bytes, op.dtype, op.rows, op.cols, op.params, variant);
  return [
    { file: op.file, offset: op.weight, data: q.weight },
    { file: op.file, offset: op.scales, data: q.scales },
    { file: op.file, offset: op.biases, data: q.biases },
  ];
}
