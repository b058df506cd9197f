/**
 * Synthetic models: random weights with a real model's shapes, written straight into the
 * runtime format. They produce nonsense text but exercise the engine, the expert store and the
 * disk exactly like the real model, so benchmarks and memory tests need no download.
 *
 * Weights are random 4-bit (8-bit for routers) codes with per-matrix scales chosen so that
 * activations keep roughly unit variance through the layers. Generation streams: one tensor or
 * one expert at a time, so the 14 GB Gemma 4 26B-A4B needs little memory.
 */
import { bf16FromNumber } from "../format/dtype.ts";
import {
  EXPERT_PARTS,
  expertPartShapes,
  type Architecture,
  type Manifest,
} from "../format/manifest.ts";
import { expectedTensors, modelFamily } from "../models/index.ts";
import { ModelWriter, type QuantizedData, type QuantizedMeta } from "../format/writer.ts";
import { normalizeConfig } from "../import/config.ts";
import { SYNTH_PRESETS, type SynthPresetName } from "./presets.ts";

export interface SynthOptions {
  preset: SynthPresetName;
  out: string;
  /** Keep only the first N layers (the last one is made a full-attention layer). */
  layers?: number;
  seed?: number;
  force?: boolean;
  onProgress?: (done: number, total: number) => void;
  /** Auxiliary files (tokenizer, template) to copy in: format path -> source file. */
  files?: Record<string, string>;
  /** The manifest's `created_by` (default "redwing synth"). */
  createdBy?: string;
  /**
   * Multiplies the post-attention and post-feedforward norm weights (default 1). Above 1 the
   * blocks outweigh the token's own embedding in the residual stream, so a tiny random model
   * does not just repeat its input token.
   */
  postNormScale?: number;
}

/** xorshift128+: fast, seedable, good enough for filler weights. */
class Random {
  private s0: bigint;
  private s1: bigint;
  private state: Uint32Array;

  constructor(seed: number) {
    // splitmix-style seeding so that nearby seeds give unrelated streams.
    let z = BigInt(seed) + 0x9e3779b97f4a7c15n;
    const next = (): bigint => {
      z = (z + 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn;
      let x = z;
      x = ((x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n) & 0xffffffffffffffffn;
      x = ((x ^ (x >> 27n)) * 0x94d049bb133111ebn) & 0xffffffffffffffffn;
      return x ^ (x >> 31n);
    };
    this.s0 = next();
    this.s1 = next();
    this.state = new Uint32Array([
      Number(this.s0 & 0xffffffffn) | 1,
      Number(this.s0 >> 32n) | 1,
      Number(this.s1 & 0xffffffffn) | 1,
      Number(this.s1 >> 32n) | 1,
    ]);
  }

  /** Fills `out` with random words (xorshift128 on 32-bit lanes: fast in JS). */
  fill(out: Uint32Array): void {
    const s = this.state;
    let x = s[0]!;
    let y = s[1]!;
    let z = s[2]!;
    let w = s[3]!;
    for (let i = 0; i < out.length; i++) {
      const t = x ^ (x << 11);
      x = y;
      y = z;
      z = w;
      w = (w ^ (w >>> 19) ^ (t ^ (t >>> 8))) >>> 0;
      out[i] = w;
    }
    s[0] = x;
    s[1] = y;
    s[2] = z;
    s[3] = w;
  }

  /** Uniform in [0, 1). */
  uniform(): number {
    const one = new Uint32Array(1);
    this.fill(one);
    return one[0]! / 2 ** 32;
  }
}

/** The preset's architecture, cut to `layers` layers when asked. */
export function synthArchitecture(preset: SynthPresetName, layers?: number): Architecture {
  const base = SYNTH_PRESETS[preset];
  const config: Record<string, unknown> = { ...base, layer_types: [...base.layer_types] };
  if (layers !== undefined) {
    if (!Number.isInteger(layers) || layers < 1 || layers > base.num_hidden_layers) {
      throw new RangeError(`layers must be an integer from 1 to ${base.num_hidden_layers}`);
    }
    const types = base.layer_types.slice(0, layers) as string[];
    // Keep both attention kinds in small models: the last layer is full, as in the real one.
    types[layers - 1] = "full_attention";
    config.num_hidden_layers = layers;
    config.layer_types = types;
  }
  return normalizeConfig(config).architecture;
}

function bf16Bytes(values: Float32Array): Uint8Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = bf16FromNumber(values[i]!);
  return new Uint8Array(out.buffer);
}

/**
 * A random quantized matrix. Codes are uniform on [0, 2^bits); with scale s and bias
 * -s * (2^bits - 1) / 2 the weights are centred with standard deviation s * sqrt((4^bits - 1) / 12),
 * and s makes that 1 / sqrt(cols) so a product keeps its input's scale.
 */
function randomQuantized(rng: Random, meta: QuantizedMeta): QuantizedData {
  const [rows, cols] = meta.shape;
  const levels = 2 ** meta.bits;
  const codeStd = Math.sqrt((levels * levels - 1) / 12);
  const words = new Uint32Array((rows * cols * meta.bits) / 32);
  rng.fill(words);
  const groups = rows * (cols / meta.group_size);
  const scales = new Float32Array(groups);
  const biases = new Float32Array(groups);
  const s = 1 / (Math.sqrt(cols) * codeStd);
  for (let g = 0; g < groups; g++) {
    const jitter = 0.9 + (0.2 * ((g * 2654435761) % 1000)) / 1000;
    scales[g] = s * jitter;
    biases[g] = (-s * jitter * (levels - 1)) / 2;
  }
  return {
    weight: new Uint8Array(words.buffer),
    scales: bf16Bytes(scales),
    biases: bf16Bytes(biases),
  };
}

/** Writes a random-weight model of `preset` to `out` and returns its manifest. */
export async function synthesizeModel(options: SynthOptions): Promise<Manifest> {
  const arch = synthArchitecture(options.preset, options.layers);
  const rng = new Random(options.seed ?? 0);
  const tensors = expectedTensors(arch);
  const eightBit = modelFamily(arch.family).checkpoint.eightBitSuffixes;
  const expertLayers = arch.layers.filter((l) => l.moe).length;
  const total = tensors.length + expertLayers * (arch.moe?.num_experts ?? 0);
  let done = 0;
  const tick = (): void => {
    done++;
    options.onProgress?.(done, total);
  };

  const writer = await ModelWriter.create(options.out, {
    force: options.force ?? false,
    createdBy: options.createdBy ?? "redwing synth",
  });
  try {
    for (const spec of tensors) {
      if (spec.kind === "plain") {
        const n = spec.shape.reduce((a, b) => a * b, 1);
        const values = new Float32Array(n);
        // Norm weights and scalars near 1 (Gemma 4 multiplies by w itself).
        for (let i = 0; i < n; i++) values[i] = 0.9 + 0.2 * rng.uniform();
        if (options.postNormScale !== undefined && /\.post_\w+_layernorm(_\d)?$/.test(spec.name)) {
          for (let i = 0; i < n; i++) values[i] = values[i]! * options.postNormScale;
        }
        await writer.addPlain(spec.name, "bf16", spec.shape, bf16Bytes(values));
      } else {
        const [rows, cols] = spec.shape as [number, number];
        const bits = eightBit.some((suffix) => spec.name.endsWith(suffix)) ? 8 : 4;
        const meta: QuantizedMeta = {
          bits,
          group_size: 64,
          scale_dtype: "bf16",
          shape: [rows, cols],
        };
        if (spec.name === "embed_tokens") {
          // The embedding is the largest tensor: write it in row blocks.
          const blockRows = 4096;
          const parts: QuantizedData[] = [];
          async function* chunks(): AsyncGenerator<Uint8Array> {
            for (let r = 0; r < rows; r += blockRows) {
              const part = randomQuantized(rng, {
                ...meta,
                shape: [Math.min(blockRows, rows - r), cols],
              });
              parts.push({ weight: new Uint8Array(0), scales: part.scales, biases: part.biases });
              yield part.weight;
            }
          }
          const concat = (pick: "scales" | "biases") => (): Uint8Array =>
            Buffer.concat(parts.map((p) => p[pick]));
          await writer.addQuantized(spec.name, meta, chunks(), concat("scales"), concat("biases"));
        } else {
          const data = randomQuantized(rng, meta);
          await writer.addQuantized(spec.name, meta, data.weight, data.scales, data.biases);
        }
      }
      tick();
    }
    if (arch.moe) {
      const shapes = expertPartShapes(arch);
      const metas = Object.fromEntries(
        EXPERT_PARTS.map((p) => [
          p,
          {
            bits: 4,
            group_size: 64,
            scale_dtype: "bf16",
            shape: shapes[p],
          } satisfies QuantizedMeta,
        ]),
      ) as Record<(typeof EXPERT_PARTS)[number], QuantizedMeta>;
      for (const [index, layer] of arch.layers.entries()) {
        if (!layer.moe) continue;
        const experts = await writer.beginExpertLayer(index, arch.moe.num_experts, metas);
        for (let e = 0; e < arch.moe.num_experts; e++) {
          const data = Object.fromEntries(
            EXPERT_PARTS.map((p) => [p, randomQuantized(rng, metas[p])]),
          ) as Record<(typeof EXPERT_PARTS)[number], QuantizedData>;
          await experts.write(e, data);
          tick();
        }
      }
    }
    for (const [path, src] of Object.entries(options.files ?? {})) await writer.copyFile(src, path);
    return await writer.commit({
      architecture: arch,
      source: { kind: "synthetic", repo: null, revision: null, files: [] },
      quantization: { group_size: 64, bits: 4 },
    });
  } catch (error) {
    await writer.abort();
    throw error;
  }
}
