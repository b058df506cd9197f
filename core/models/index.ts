/**
 * The model families Redwing runs, one module each (mirroring native/src/models/): the rest of
 * the code asks this registry, by the manifest's `architecture.family` or by a config's
 * `model_type`, instead of knowing a family. Adding a family is one module, its id in
 * family.ts's FAMILY_IDS and one line here (the engine's side lives in native/src/models/).
 */
import type { Architecture, TensorSpec } from "../format/manifest.ts";
import type { FamilyId, ModelFamily, TemplateMessage } from "./family.ts";
import { GEMMA3 } from "./gemma3.ts";
import { GEMMA4 } from "./gemma4.ts";

export * from "./family.ts";

const FAMILIES: Readonly<Record<FamilyId, ModelFamily>> = { gemma4: GEMMA4, gemma3: GEMMA3 };

/** Every family, in the order messages list them. */
export const MODEL_FAMILIES: readonly ModelFamily[] = Object.values(FAMILIES);

export function modelFamily(id: FamilyId): ModelFamily {
  return FAMILIES[id];
}

/** The family whose config.json has `model_type`, or null when Redwing runs none with it. */
export function familyOfModelType(modelType: unknown): ModelFamily | null {
  if (typeof modelType !== "string") return null;
  return MODEL_FAMILIES.find((f) => f.modelTypes.includes(modelType)) ?? null;
}

/** Every resident tensor `arch` needs, in the order the importer writes them. */
export function expectedTensors(arch: Architecture): TensorSpec[] {
  return modelFamily(arch.family).expectedTensors(arch);
}

/**
 * `messages` shaped for `template`: the family whose own template it is reshapes them (Gemma 4
 * folds tool results into the model turn); any other template gets them as they are.
 */
export function messagesForTemplate(
  template: string,
  messages: TemplateMessage[],
): TemplateMessage[] {
  for (const family of MODEL_FAMILIES) {
    const shaped = family.templateMessages(template, messages);
    if (shaped) return shaped;
  }
  return messages;
}
