/** Checkpoint import: safetensors reading, config normalization, MLX quantization. */
export { normalizeConfig, type NormalizedConfig } from "./config.ts";
export {
  DEFAULT_QUANT,
  ROUTER_QUANT,
  importCheckpoint,
  type ImportOptions,
  type ImportProgress,
  type ImportResult,
} from "./importer.ts";
export {
  quantizeF32,
  quantizeRows,
  type QuantParams,
  type QuantVariant,
  type QuantizedRows,
} from "./quantize.ts";
export { SafetensorsCheckpoint, SafetensorsFile, type TensorInfo } from "./safetensors.ts";
