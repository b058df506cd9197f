/**
 * What installing a checkpoint would produce, from its config.json alone: the importer's plan
 * and the model directory's layout, without a byte of its weights or even its safetensors
 * headers. Model discovery uses it to tell, for a search result, whether Redwing can run it, how
 * large the install is and (through the engine's own plan of that layout) how much memory it
 * needs, at the cost of one small file per result.
 *
 * It works by building the tensor table such a checkpoint has (every tensor the family needs,
 * named, shaped and typed as MLX converters and transformers write them, quantized as the
 * config's `quantization` block says) and handing it to the importer's own planImport and
 * layoutImport: the same code the installer runs on the real headers, so both give the same
 * layout (the tests hold them equal on the reference fixtures).
 */
import { UserError } from "../errors.ts";
import { EXPERT_PARTS, type Architecture, type Manifest } from "../format/manifest.ts";
import { EXPERT_ALIGNMENT, FORMAT_NAME, FORMAT_VERSION } from "../format/manifest.ts";
import { normalizeConfig } from "../import/config.ts";
import {
  DEFAULT_QUANT,
  forEachMoeLayer,
  layoutImport,
  lookupOverride,
  planImport,
  quantizationBlock,
  readQuantConfig,
  type ImportLayout,
  type ImportPlan,
  type TensorTable,
} from "../import/importer.ts";
import { stDtypeSize, type StDType, type TensorInfo } from "../import/safetensors.ts";
import { expectedTensors, modelFamily } from "../models/index.ts";

export interface ConfigLayout {
  architecture: Architecture;
  importPlan: ImportPlan;
  layout: ImportLayout;
}

const TORCH_DTYPES: Record<string, StDType> = {
  bfloat16: "BF16",
  float16: "F16",
  half: "F16",
  float32: "F32",
  float: "F32",
};

/** The float dtype a config declares (`torch_dtype` or `dtype`, top level or text_config). */
function configDtype(config: Record<string, unknown>): StDType {
  const text = (config.text_config ?? {}) as Record<string, unknown>;
  for (const v of [config.torch_dtype, config.dtype, text.torch_dtype, text.dtype]) {
    if (typeof v === "string" && TORCH_DTYPES[v]) return TORCH_DTYPES[v];
  }
  return "BF16";
}

/** True when the config's quantization block describes MLX affine quantization. */
export function isMlxQuantization(config: Record<string, unknown>): boolean {
  const q = quantizationBlock(config);
  if (q === undefined || q === null || typeof q !== "object") return false;
  const qc = q as Record<string, unknown>;
  const method = qc.quant_method;
  const mode = qc.mode;
  return (
    (method === undefined || method === "mlx" || method === "affine") &&
    (mode === undefined || mode === "affine") &&
    qc.bits !== undefined
  );
}

function tensor(name: string, dtype: StDType, shape: number[]): TensorInfo {
  const nbytes = shape.reduce((a, b) => a * b, 1) * stDtypeSize(dtype);
  return { name, dtype, shape, file: "(from config.json)", start: 0, nbytes };
}

/**
 * The tensor table of a checkpoint of `arch` as its config describes it: MLX affine when the
 * config has an MLX quantization block, else float in the config's dtype.
 */
export function tensorTableFromConfig(
  arch: Architecture,
  config: Record<string, unknown>,
): TensorTable {
  const naming = modelFamily(arch.family).checkpoint;
  const prefix = naming.prefixes[0]!;
  const mlx = isMlxQuantization(config);
  const quant = mlx ? readQuantConfig(config, true, naming.prefixes) : null;
  const dtype = configDtype(config);
  const tensors = new Map<string, TensorInfo>();
  const add = (t: TensorInfo): void => void tensors.set(t.name, t);
  /** Bits and group of an MLX matrix (the config's, or its per-module override). */
  const mlxParams = (module: string): { bits: number; group: number } => {
    const o = quant ? lookupOverride(quant, module) : undefined;
    if (o) return { bits: o.bits, group: o.group_size };
    return { bits: quant!.bits, group: quant!.group_size };
  };
  const addMlx = (base: string, lead: number[], rows: number, cols: number): void => {
    const { bits, group } = mlxParams(base);
    add(tensor(`${base}.weight`, "U32", [...lead, rows, Math.ceil((cols * bits) / 32)]));
    const groups = Math.ceil(cols / group);
    add(tensor(`${base}.scales`, dtype, [...lead, rows, groups]));
    add(tensor(`${base}.biases`, dtype, [...lead, rows, groups]));
  };
  for (const spec of expectedTensors(arch)) {
    const base = prefix + spec.name;
    if (spec.kind === "plain") {
      const bare = naming.bareSuffixes.some((s) => spec.name.endsWith(s));
      add(tensor(bare ? base : `${base}.weight`, dtype, spec.shape));
      continue;
    }
    const [rows, cols] = spec.shape as [number, number];
    if (mlx) addMlx(base, [], rows, cols);
    else add(tensor(`${base}.weight`, dtype, spec.shape));
  }
  forEachMoeLayer(arch, prefix, (_, base, { shapes, count: e, intermediate: i, hidden: h }) => {
    if (mlx) {
      for (const p of EXPERT_PARTS) {
        const [rows, cols] = shapes[p];
        addMlx(`${base}switch_glu.${p}`, [e], rows, cols);
      }
    } else {
      add(tensor(`${base}gate_up_proj`, dtype, [e, 2 * i, h]));
      add(tensor(`${base}down_proj`, dtype, [e, h, i]));
    }
  });
  return { tensors, get: (name) => tensors.get(name) };
}

/**
 * The importer's plan and layout for a checkpoint with this config.json. Throws the importer's
 * UserError when Redwing cannot run it (an unknown model_type, unsupported quantization, shapes
 * the engine does not take).
 */
export function layoutFromConfig(config: unknown, generationConfig?: unknown): ConfigLayout {
  if (typeof config !== "object" || config === null || Array.isArray(config)) {
    throw new UserError("config.json is not a JSON object", "config_invalid");
  }
  const cfg = config as Record<string, unknown>;
  const { architecture } = normalizeConfig(cfg, generationConfig);
  if (isMlxQuantization(cfg)) {
    const naming = modelFamily(architecture.family).checkpoint;
    const quant = readQuantConfig(cfg, true, naming.prefixes)!;
    const used = [quant, ...[...quant.overrides.values()].filter((o) => o !== false)];
    const bits = [...new Set(used.map((q) => q.bits))].sort();
    const groups = [...new Set(used.map((q) => q.group_size))].sort();
    if (bits.some((b) => b !== 4 && b !== 8)) {
      throw new UserError(
        `MLX ${bits.join("/")}-bit: Redwing runs 4- and 8-bit MLX checkpoints (or bf16/f16/f32 ones, quantized to 4-bit at install)`,
        "unsupported_model",
      );
    }
    if (groups.some((g) => g !== 32 && g !== 64 && g !== 128)) {
      throw new UserError(
        `MLX group size ${groups.join("/")}: Redwing runs group sizes 32, 64 and 128`,
        "unsupported_model",
      );
    }
  }
  const importPlan = planImport(architecture, tensorTableFromConfig(architecture, cfg), cfg);
  return { architecture, importPlan, layout: layoutImport(importPlan, architecture) };
}

/**
 * The manifest the install would write, less the hashes (zeros) and the auxiliary files: all the
 * engine's memory plan reads (architecture, tensors, expert layers, file sizes).
 */
export function skeletonManifest(planned: ConfigLayout, repo: string | null): Manifest {
  return {
    format: FORMAT_NAME,
    format_version: FORMAT_VERSION,
    created_by: "redwing discover (layout only, no weights)",
    architecture: planned.architecture,
    source: { kind: planned.importPlan.kind, repo, revision: null, files: [] },
    quantization: planned.importPlan.defaultQuant,
    tensors: planned.layout.tensors,
    experts: planned.layout.expertLayers
      ? { alignment: EXPERT_ALIGNMENT, layers: planned.layout.expertLayers }
      : null,
    files: planned.layout.files.map((f) => ({ ...f, sha256: "0".repeat(64) })),
  };
}

/** "MLX 4-bit", "MLX 4/8-bit", "bf16 (4-bit at install)": how the checkpoint is stored. */
export function describeQuantization(plan: ImportPlan): string {
  if (plan.kind === "mlx-affine") {
    const bits = new Set<number>();
    for (const j of plan.jobs) if (j.kind === "mlx-matrix") bits.add(j.meta.bits);
    for (const x of plan.experts) for (const p of EXPERT_PARTS) bits.add(x.meta[p].bits);
    const main = plan.defaultQuant.bits;
    return `MLX ${[main, ...[...bits].filter((b) => b !== main).sort()].join("/")}-bit`;
  }
  const first = plan.jobs.find((j) => j.kind === "float-matrix" || j.kind === "plain");
  const dtype = first && "src" in first ? first.src.dtype.toLowerCase() : "float";
  return `${dtype} (quantized to ${DEFAULT_QUANT.bits}-bit at install)`;
}
