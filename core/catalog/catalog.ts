/**
 * The models Redwing knows how to install by name. Each hub entry pins what the installer
 * fetches (repository, revision when known, files, which tensors) and what the user should
 * expect (download and install size, memory at the default settings, licence). Anything not in
 * the catalog can still be installed as `owner/name[@revision]` when its architecture is
 * supported (Gemma 4 or Gemma 3 text, MLX affine 4/8-bit or bf16/f16/f32 safetensors).
 *
 * Sizes: exact where the revision is pinned and the numbers were measured; otherwise `approx`
 * estimates from the architecture (the installer computes the exact numbers before it
 * downloads anything and checks free space against them).
 */
import { UserError } from "../errors.ts";
import type { FamilyId } from "../models/index.ts";
import { GEMMA_CHECKPOINT } from "../models/gemma-common.ts";
import { GEMMA_TERMS } from "../models/gemma3.ts";

/** Files the installer fetches whole (when the repository has them). */
export const METADATA_FILES = [
  "config.json",
  "generation_config.json",
  "model.safetensors.index.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "chat_template.jinja",
  "chat_template.json",
] as const;

/** Tensor name roots never installed from a Gemma checkpoint (the multimodal towers). */
export const SKIPPED_TENSOR_ROOTS = GEMMA_CHECKPOINT.multimodalRoots;

export interface SizeEstimate {
  bytes: number;
  /** True when `bytes` is an estimate (revision not pinned or not measured). */
  approx: boolean;
}

interface EntryBase {
  /** Short name for `redwing install <id>` and the default directory name. */
  id: string;
  /** For people. */
  title: string;
  description: string;
  /** Licence, and whether the hub asks users to accept it first (gated). */
  licence: { name: string; url: string; gated: boolean; note: string };
  /** Memory needed to run at the default settings (see `memoryNote`). */
  memory: SizeEstimate;
  memoryNote: string;
  /** Size of the installed model directory. */
  install: SizeEstimate;
  /**
   * Sampling the model's makers recommend, where they publish it: a new model's settings start
   * from these, then its generation_config.json, then core/defaults.ts (core/app/settings.ts).
   */
  sampling?: CatalogSampling;
}

/** The sampling fields a catalog entry may recommend. */
export interface CatalogSampling {
  temperature?: number;
  topK?: number;
  topP?: number;
  repetitionPenalty?: number;
}

/**
 * Google's recommended sampling for Gemma 3 and Gemma 4 instruct models (their model cards:
 * temperature 1.0, top_k 64, top_p 0.95).
 */
const GEMMA_SAMPLING: CatalogSampling = { temperature: 1.0, topK: 64, topP: 0.95 };

/** A model downloaded from a Hugging Face hub repository. */
export interface HubCatalogEntry extends EntryBase {
  kind: "hub";
  repo: string;
  /** Commit to install, or null: the default branch is resolved to a commit at install time. */
  revision: string | null;
  /** Branch resolved when `revision` is null. */
  branch: string;
  family: FamilyId;
  /** What the checkpoint is: MLX affine (bytes copied) or float (quantized at install). */
  format: "mlx-affine" | "hf-float";
  /** Files fetched: the metadata files present plus every shard of the index. */
  files: { metadata: readonly string[]; weights: string };
  /** Tensors installed: the language model; these roots are skipped. */
  tensors: { keep: string; skip: readonly string[] };
  /** Bytes of the repository's files the installer fetches (the whole checkpoint). */
  download: SizeEstimate;
}

/** The built-in demo model, made locally (no download). */
export interface DemoCatalogEntry extends EntryBase {
  kind: "demo";
}

export type CatalogEntry = HubCatalogEntry | DemoCatalogEntry;

const GB = 1e9;

export const CATALOG: readonly CatalogEntry[] = [
  {
    kind: "demo",
    id: "demo",
    title: "Demo (tiny, trained on public-domain text)",
    description:
      "A tiny Gemma 4 MoE (24M parameters) trained by the Redwing project on the King James Bible and Debian's fortune cookies, shipped with Redwing (no download). It quotes verses, continues them and tells fortunes; it knows nothing else.",
    licence: {
      name: "Apache-2.0 (Redwing); public-domain training text",
      url: "https://www.apache.org/licenses/LICENSE-2.0",
      gated: false,
      note: "Weights and tokenizer trained by Redwing (demo-model/ has the recipe and model card) on the King James Bible (public domain, Debian package bible-kjv-text) and fortune cookies (Debian packages fortunes, fortunes-min).",
    },
    memory: { bytes: 0.02 * GB, approx: true },
    memoryNote: "about 16 MiB in the engine at the default settings",
    install: { bytes: 0.0156 * GB, approx: true },
  },
  {
    kind: "hub",
    id: "gemma-4-26b-a4b-it",
    title: "Gemma 4 26B-A4B instruct (MLX 4-bit)",
    description:
      "Mixture of experts: 26B parameters, about 4B active per token (128 experts, top 8, 30 layers). Experts are streamed from disk, so it runs with far less memory than its size.",
    repo: "mlx-community/gemma-4-26b-a4b-it-4bit",
    revision: "0d77464eeb233a2da68ebf9d7dc4edaac7db956d",
    branch: "main",
    family: "gemma4",
    format: "mlx-affine",
    sampling: GEMMA_SAMPLING,
    files: { metadata: METADATA_FILES, weights: "model-*.safetensors (per the index)" },
    tensors: { keep: "language_model.model.*", skip: SKIPPED_TENSOR_ROOTS },
    // Measured by TurboFieldfare's installer on this revision (shared/research/turbofieldfare.md).
    download: { bytes: 14_620_479_420, approx: false },
    // Same source bytes as TurboFieldfare's 14,291,921,884 B install; Redwing's 64-byte
    // alignment and 16 KiB expert strides change it by a few MB.
    install: { bytes: 14_291_921_884, approx: true },
    memory: { bytes: 4.0 * GB, approx: true },
    memoryNote:
      "resident core (1.26 GiB: embedding, attention, dense MLPs, routers) + 16 expert slots per layer (1.49 GiB) + an 8k-token KV cache (0.37 GiB) + runtime",
    licence: {
      name: "Apache-2.0",
      url: "https://ai.google.dev/gemma/apache_2",
      gated: false,
      note: "Gemma 4 is released under Apache 2.0; the MLX conversion is not gated.",
    },
  },
  {
    kind: "hub",
    id: "gemma-3-4b-it",
    title: "Gemma 3 4B instruct (MLX 4-bit)",
    description: "Dense 4B model (34 layers, hidden 2560): small and quick, fits most laptops.",
    repo: "mlx-community/gemma-3-4b-it-4bit",
    revision: null,
    branch: "main",
    family: "gemma3",
    format: "mlx-affine",
    sampling: GEMMA_SAMPLING,
    files: { metadata: METADATA_FILES, weights: "model*.safetensors (per the index)" },
    tensors: { keep: "language_model.model.*", skip: SKIPPED_TENSOR_ROOTS },
    // 3.88 B text parameters at 4.5 bits (4-bit + bf16 scale and bias per 64) plus the vision
    // tower; the revision is resolved at install time, so these are estimates.
    download: { bytes: 3.4 * GB, approx: true },
    install: { bytes: 2.2 * GB, approx: true },
    memory: { bytes: 2.9 * GB, approx: true },
    memoryNote: "all weights resident (2.05 GiB) + an 8k-token KV cache (0.28 GiB) + runtime",
    licence: {
      ...GEMMA_TERMS,
      gated: false,
      note: "Gemma 3 is under the Gemma Terms of Use (google/ originals are gated; this MLX copy is not). By installing you agree to them.",
    },
  },
  {
    kind: "hub",
    id: "mamaylm-gemma-3-4b-it",
    title: "MamayLM Gemma 3 4B instruct v1.0 (Ukrainian, quantized at install)",
    description:
      "INSAIT's Ukrainian/English Gemma 3 4B fine-tune. The bf16 checkpoint is quantized to MLX 4-bit while it downloads.",
    repo: "INSAIT-Institute/MamayLM-Gemma-3-4B-IT-v1.0",
    revision: null,
    branch: "main",
    family: "gemma3",
    format: "hf-float",
    sampling: GEMMA_SAMPLING,
    files: { metadata: METADATA_FILES, weights: "model-*.safetensors (per the index)" },
    tensors: { keep: "language_model.model.* or model.*", skip: SKIPPED_TENSOR_ROOTS },
    // bf16: 2 bytes per parameter (3.88 B text + the vision tower when present).
    download: { bytes: 8.6 * GB, approx: true },
    install: { bytes: 2.2 * GB, approx: true },
    memory: { bytes: 2.9 * GB, approx: true },
    memoryNote:
      "all weights resident (2.05 GiB after 4-bit quantization) + an 8k-token KV cache (0.28 GiB) + runtime",
    licence: {
      ...GEMMA_TERMS,
      gated: true,
      note: "A Gemma 3 derivative under the Gemma Terms of Use; if the hub asks, accept them on the model page and set HF_TOKEN.",
    },
  },
];

/**
 * The catalog entry an installed model came from: the demo entry for the built-in demo model,
 * else the hub entry of the repository it was installed from; null for anything else.
 */
export function catalogEntryFor(
  name: string,
  source: { repo?: string | null },
  isDemo: boolean,
): CatalogEntry | null {
  for (const c of CATALOG) {
    if (
      c.kind === "demo"
        ? isDemo && name === c.id
        : source.repo?.toLowerCase() === c.repo.toLowerCase()
    )
      return c;
  }
  return null;
}

/** A parsed `owner/name[@revision]`. */
export interface RepoRef {
  repo: string;
  revision: string | null;
}

const REPO_PART = /^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$/;

/** True for a hub repository id (`name` or `owner/name`; letters, digits, `.`, `_`, `-`). */
export function isRepoId(repo: string): boolean {
  const parts = repo.split("/");
  return (
    parts.length >= 1 &&
    parts.length <= 2 &&
    parts.every((p) => REPO_PART.test(p) && !p.includes("--") && !p.includes(".."))
  );
}

/** Parses `owner/name[@revision]`; throws a UserError for anything else. */
export function parseRepoRef(text: string): RepoRef {
  const at = text.indexOf("@");
  const repo = at >= 0 ? text.slice(0, at) : text;
  const revision = at >= 0 ? text.slice(at + 1) : null;
  if (!isRepoId(repo)) {
    throw new UserError(
      `${JSON.stringify(text)} is not a model name or a hub repository (owner/name[@revision]); see \`redwing install --list\``,
      "bad_model_ref",
    );
  }
  if (revision !== null && (revision === "" || /[\s\0]|\.\./.test(revision))) {
    throw new UserError(`${JSON.stringify(revision)} is not a valid revision`, "bad_model_ref");
  }
  return { repo, revision };
}

/** What `redwing install <ref>` refers to. */
export interface ResolvedRef {
  /** The catalog entry, when the name or repository is in the catalog. */
  entry: CatalogEntry | null;
  /** For hub models: the repository and the revision to install (null: resolve the branch). */
  repo: string | null;
  revision: string | null;
  /** Default directory name under the models directory. */
  dirName: string;
}

/**
 * Resolves a catalog id (`gemma-4-26b-a4b-it`), a catalogued repository, or any
 * `owner/name[@revision]`. A catalogued repository without `@revision` gets the pinned one.
 */
export function resolveModelRef(text: string): ResolvedRef {
  const byId = CATALOG.find((e) => e.id === text.toLowerCase());
  if (byId) {
    return byId.kind === "demo"
      ? { entry: byId, repo: null, revision: null, dirName: byId.id }
      : { entry: byId, repo: byId.repo, revision: byId.revision, dirName: byId.id };
  }
  const ref = parseRepoRef(text);
  const entry =
    CATALOG.find(
      (e): e is HubCatalogEntry =>
        e.kind === "hub" && e.repo.toLowerCase() === ref.repo.toLowerCase(),
    ) ?? null;
  if (entry) {
    return {
      entry,
      repo: entry.repo,
      revision: ref.revision ?? entry.revision,
      dirName: entry.id,
    };
  }
  return { entry: null, repo: ref.repo, revision: ref.revision, dirName: repoDirName(ref.repo) };
}

/** Directory name for an uncatalogued repository: `owner--name` (`--` cannot occur in ids). */
export function repoDirName(repo: string): string {
  return repo.replace("/", "--");
}
