/**
 * Turns a checkpoint's `config.json` (and `generation_config.json`) into the normalized
 * architecture of docs/format.md. The family is chosen by `model_type` (core/models: Gemma 4 as
 * `gemma4` with `text_config` or flat `gemma4_text`, Gemma 3 likewise); the family module reads
 * its fields (core/models/gemma4.ts, gemma3.ts, gemma-common.ts), and the result is checked
 * against the manifest schema.
 */
import { UserError } from "../errors.ts";
import { ArchitectureSchema, type Architecture } from "../format/manifest.ts";
import { invalid, isObject } from "../models/config-fields.ts";
import { MODEL_FAMILIES, familyOfModelType } from "../models/index.ts";

export interface NormalizedConfig {
  architecture: Architecture;
  /** `model_type` of the text model, for messages. */
  modelType: string;
}

/**
 * Normalizes a config. `generationConfig` is `generation_config.json` when the checkpoint has
 * one (its `eos_token_id` wins over the config's).
 */
export function normalizeConfig(config: unknown, generationConfig?: unknown): NormalizedConfig {
  if (!isObject(config)) throw invalid("not a JSON object");
  const topType = config.model_type;
  const nested = isObject(config.text_config) ? config.text_config : null;
  const family = familyOfModelType(topType);
  if (!family) {
    const t = typeof topType === "string" ? topType : JSON.stringify(topType);
    const known = MODEL_FAMILIES.map((f) => `${f.title} (${f.modelTypes.join(", ")})`);
    throw new UserError(
      `config.json has model_type ${t}; Redwing imports ${known.join(" and ")}`,
      "unsupported_model",
    );
  }
  if (nested && typeof nested.model_type === "string") {
    const inner = nested.model_type;
    if (!inner.startsWith(family.id)) {
      throw new UserError(
        `config.json: text_config has model_type ${inner} inside a ${String(topType)} config`,
        "unsupported_model",
      );
    }
  }
  const arch = family.normalizeConfig({
    top: config,
    // Multimodal wrappers keep the text model in text_config; text-only configs are flat.
    text: nested,
    generation: isObject(generationConfig) ? generationConfig : {},
  });
  const parsed = ArchitectureSchema.safeParse(arch);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw invalid(
      `normalized architecture is invalid at ${issue.path.join(".")}: ${issue.message}`,
    );
  }
  const raw = nested ?? config;
  return { architecture: parsed.data, modelType: String(raw.model_type ?? topType) };
}
