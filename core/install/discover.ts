/**
 * Model discovery: searches the hub for models and says, for each result, whether Redwing can
 * run it (and if not, why, in plain words), how much it downloads and installs, how much memory
 * it needs at this machine's settings and whether that fits, its licence, and whether it is
 * gated.
 *
 * The search is the hub's standard model search (`GET /api/models?search=&sort=downloads&limit=
 * &expand=...`) through @huggingface/hub's listModels, with `HF_ENDPOINT` as its hub URL and
 * `HF_TOKEN` (or huggingface_hub's token file) sent to that origin only. A result whose files,
 * config digest (model_type, quantization_config) and tags already rule it out is judged from the
 * search answer alone. For the others, the installer's own hub client (hub.ts) lists the revision
 * (file sizes, as the installer will sum them) and fetches config.json and the shard index
 * (checked against their git blob ids); layout-from-config.ts turns the config into the layout
 * the install would write, and the caller's `planMemory` asks the engine for that layout's
 * memory plan (see plan-skeleton.ts), the figure the Models view shows once it is installed.
 */
import { listModels } from "@huggingface/hub";
import { METADATA_FILES } from "../catalog/catalog.ts";
import { UserError } from "../errors.ts";
import type { Manifest } from "../format/manifest.ts";
import { pickAuxiliaryFiles } from "../import/importer.ts";
import { resolveShards } from "../import/safetensors.ts";
import { MODEL_FAMILIES, familyOfModelType, type FamilyId } from "../models/index.ts";
import { HubClient, defaultHubOptions, type HubOptions, type RepoFile } from "./hub.ts";
import {
  describeQuantization,
  isMlxQuantization,
  layoutFromConfig,
  skeletonManifest,
} from "./layout-from-config.ts";

type Env = Record<string, string | undefined>;

export const DEFAULT_SEARCH_LIMIT = 20;
export const MAX_SEARCH_LIMIT = 100;
/** The search answer must come within this time. */
export const SEARCH_TIMEOUT_MS = 30_000;

export interface DiscoverOptions {
  env?: Env;
  /** Results asked of the hub (default 20, at most 100). */
  limit?: number;
  signal?: AbortSignal;
  /**
   * The engine's memory plan (total bytes) of the model directory `manifest` describes, at this
   * machine's settings; without it results carry no memory figure.
   */
  planMemory?: (manifest: Manifest) => Promise<number>;
  /** This machine's memory, for `fits` (default os.totalmem()). */
  totalMemoryBytes: number;
  /** Results looked at in parallel (default 4). */
  concurrency?: number;
  /** Hub client options (tests: a short stall timeout). */
  hub?: Partial<HubOptions>;
}

/** Whether the files of a gated repository can be read with the token at hand. */
export type Access =
  /** Not gated. */
  | "open"
  /** Gated, and the token reads it. */
  | "granted"
  /** Gated and no token is set: HF_TOKEN is needed (and the licence accepted). */
  | "needs_token"
  /** Gated and the token has no access yet: accept the licence on the model page. */
  | "denied";

export interface DiscoveredModel {
  repo: string;
  /** The hub's page for it. */
  url: string;
  downloads: number;
  likes: number;
  /** Last change, ISO 8601, or null. */
  updatedAt: string | null;
  /**
   * "runnable": Redwing can install and run it; "unsupported": it cannot (`reason` says why);
   * "unknown": its files could not be read (gated, or the hub failed; `reason` says which).
   */
  status: "runnable" | "unsupported" | "unknown";
  reason: string | null;
  /** The family Redwing runs it as, when known. */
  family: FamilyId | null;
  /** The architecture for people ("Gemma 4", "Llama"), or null when the repo has no config. */
  architecture: string | null;
  /** How its weights are stored ("MLX 4-bit", "bf16 (quantized to 4-bit at install)", "GGUF"). */
  format: string | null;
  /** Bytes the install downloads (the config, tokenizer and index files and every shard). */
  downloadBytes: number | null;
  /**
   * Bytes of the installed model directory, less a chat template the install extracts from
   * tokenizer_config.json (a few kB; that file is not fetched to judge a result).
   */
  installBytes: number | null;
  /** The engine's memory plan at this machine's settings. */
  memoryBytes: number | null;
  /** memoryBytes <= this machine's memory; null when unknown. */
  fits: boolean | null;
  licence: { id: string | null; name: string | null; url: string | null };
  gated: boolean;
  access: Access;
}

export interface DiscoverResult {
  query: string;
  endpoint: string;
  /** Whether a token (HF_TOKEN, or the token file) is set. */
  tokenSet: boolean;
  models: DiscoveredModel[];
}

/** What the search answer holds for one model (the fields asked for with expand). */
interface SearchItem {
  name: string;
  downloads?: number;
  likes?: number;
  updatedAt?: Date;
  gated?: false | "auto" | "manual";
  tags?: string[];
  cardData?: unknown;
  config?: unknown;
  library_name?: string;
  filePaths?: string[];
}

/** Searches the hub for `query` and judges every result; see the module comment. */
export async function discoverModels(
  query: string,
  options: DiscoverOptions,
): Promise<DiscoverResult> {
  const env = options.env ?? process.env;
  const hubOptions = { ...defaultHubOptions(env), ...options.hub };
  const limit = Math.max(1, Math.min(MAX_SEARCH_LIMIT, options.limit ?? DEFAULT_SEARCH_LIMIT));
  const items = await searchHub(query.trim(), limit, hubOptions, options.signal);
  const hub = new HubClient(hubOptions);
  const models: DiscoveredModel[] = new Array(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      models[i] = await judge(items[i]!, hub, options);
    }
  };
  await Promise.all(
    Array.from({ length: Math.min(items.length, options.concurrency ?? 4) }, worker),
  );
  return {
    query: query.trim(),
    endpoint: hubOptions.endpoint,
    tokenSet: hubOptions.token !== null,
    models,
  };
}

/** The hub's model search, with errors said plainly. */
async function searchHub(
  query: string,
  limit: number,
  hub: HubOptions,
  signal: AbortSignal | undefined,
): Promise<SearchItem[]> {
  const origin = new URL(hub.endpoint).origin;
  const timeout = AbortSignal.timeout(SEARCH_TIMEOUT_MS);
  const combined = signal ? AbortSignal.any([signal, timeout]) : timeout;
  // The token is added here rather than as listModels' accessToken: that one must start with
  // "hf_" (a mirror's need not), and this way it only ever goes to the endpoint's origin.
  const hubFetch: typeof fetch = (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const headers = new Headers(init?.headers);
    headers.set("user-agent", hub.userAgent);
    if (hub.token && url.origin === origin) headers.set("authorization", `Bearer ${hub.token}`);
    else headers.delete("authorization");
    return fetch(url, { ...init, headers, signal: combined });
  };
  const out: SearchItem[] = [];
  try {
    for await (const item of listModels({
      search: query ? { query } : undefined,
      hubUrl: hub.endpoint,
      limit,
      sort: "downloads",
      additionalFields: ["config", "tags", "cardData", "library_name", "filePaths"],
      fetch: hubFetch,
    })) {
      out.push(item as SearchItem);
    }
  } catch (error) {
    if (signal?.aborted) throw signal.reason;
    throw searchError(error, hub.endpoint, hub.token !== null, timeout.aborted);
  }
  return out;
}

function searchError(
  error: unknown,
  endpoint: string,
  tokenSet: boolean,
  timedOut: boolean,
): UserError {
  if (timedOut) {
    return new UserError(
      `the hub at ${endpoint} did not answer the search within ${SEARCH_TIMEOUT_MS / 1000} s; check your connection and try again`,
      "hub_offline",
    );
  }
  const status = (error as { statusCode?: unknown }).statusCode;
  if (typeof status === "number") {
    if (status === 401 || status === 403) {
      return new UserError(
        tokenSet
          ? `the hub at ${endpoint} refused the search (${status}): the token in HF_TOKEN is not valid; create a new one at ${endpoint}/settings/tokens or unset HF_TOKEN`
          : `the hub at ${endpoint} refused the search (${status}): it wants a token; create one at ${endpoint}/settings/tokens and set HF_TOKEN to it`,
        "hub_unauthorized",
      );
    }
    if (status === 429) {
      return new UserError(
        `the hub at ${endpoint} is limiting requests (429 Too Many Requests); wait a minute and search again${tokenSet ? "" : " (signed-in requests, with HF_TOKEN, get a higher limit)"}`,
        "hub_rate_limited",
      );
    }
    return new UserError(
      `the hub at ${endpoint} answered the search with ${status}${status >= 500 ? " (a problem on its side); try again later" : ""}`,
      "hub_error",
    );
  }
  if (error instanceof SyntaxError) {
    return new UserError(
      `the hub at ${endpoint} answered the search with something that is not JSON; is HF_ENDPOINT a Hugging Face hub?`,
      "hub_protocol",
    );
  }
  const cause = (error as { cause?: { code?: string } }).cause;
  return new UserError(
    `cannot reach the hub at ${endpoint}${cause?.code ? ` (${cause.code})` : ""}: are you offline? (HF_ENDPOINT selects a mirror)`,
    "hub_offline",
  );
}

/** "LlamaForCausalLM" -> "Llama"; falls back to the model_type. */
function architectureName(config: Record<string, unknown> | null): string | null {
  if (!config) return null;
  const archs = config.architectures;
  if (Array.isArray(archs) && typeof archs[0] === "string") {
    const name = archs[0].replace(
      /(ForCausalLM|ForConditionalGeneration|LMHeadModel|ForSequenceClassification|Model)$/,
      "",
    );
    if (name) return name;
  }
  return typeof config.model_type === "string" ? config.model_type : null;
}

function asObject(v: unknown): Record<string, unknown> | null {
  return typeof v === "object" && v !== null && !Array.isArray(v)
    ? (v as Record<string, unknown>)
    : null;
}

/** The licence from the card (`license`, `license_name`, `license_link`) or the tags. */
function licenceOf(item: SearchItem): DiscoveredModel["licence"] {
  const card = asObject(item.cardData);
  let id = typeof card?.license === "string" ? card.license : null;
  if (!id) {
    const tag = item.tags?.find((t) => t.startsWith("license:"));
    id = tag ? tag.slice("license:".length) : null;
  }
  const name = typeof card?.license_name === "string" ? card.license_name : id;
  const url = typeof card?.license_link === "string" ? card.license_link : null;
  return { id, name, url };
}

const SUPPORTED = `Redwing runs ${MODEL_FAMILIES.map((f) => f.title).join(" and ")}`;
const FORMATS = "Redwing reads safetensors checkpoints (MLX 4/8-bit, or bf16/f16/f32)";

/** Judges one search result; failures to read its files become its `reason`, never a throw. */
async function judge(
  item: SearchItem,
  hub: HubClient,
  options: DiscoverOptions,
): Promise<DiscoveredModel> {
  const repo = item.name;
  const files = item.filePaths ?? [];
  const config = asObject(item.config);
  const gated = item.gated !== undefined && item.gated !== false;
  const tokenSet = hub.options.token !== null;
  const result: DiscoveredModel = {
    repo,
    url: hub.repoPage(repo),
    downloads: item.downloads ?? 0,
    likes: item.likes ?? 0,
    updatedAt:
      item.updatedAt && !Number.isNaN(item.updatedAt.getTime())
        ? item.updatedAt.toISOString()
        : null,
    status: "unsupported",
    reason: null,
    family: null,
    architecture: architectureName(config),
    format: null,
    downloadBytes: null,
    installBytes: null,
    memoryBytes: null,
    fits: null,
    licence: licenceOf(item),
    gated,
    access: gated ? (tokenSet ? "granted" : "needs_token") : "open",
  };
  const family = familyOfModelType(config?.model_type);
  result.family = family?.id ?? null;
  if (family) result.architecture = family.title;
  const safetensors = files.some((f) => f.endsWith(".safetensors"));
  const gguf = files.some((f) => f.toLowerCase().endsWith(".gguf"));
  if (gguf && !safetensors) {
    result.format = "GGUF";
    result.reason = `GGUF only: ${FORMATS}`;
    return result;
  }
  if (files.length > 0 && !safetensors) {
    result.reason = `no safetensors weights: ${FORMATS}`;
    return result;
  }
  if (config && !family) {
    const name = result.architecture ?? "this";
    result.reason = `${name} architecture: not supported yet (${SUPPORTED})`;
    return result;
  }
  const quant = asObject(config?.quantization_config);
  if (quant && !isMlxQuantization({ quantization_config: quant })) {
    const method = typeof quant.quant_method === "string" ? quant.quant_method : "unknown";
    result.format = method.toUpperCase();
    result.reason = `${method.toUpperCase()} quantization: ${FORMATS}`;
    return result;
  }
  return await readDetails(result, hub, options);
}

/** Lists the revision, reads config.json and the index, and plans the install and memory. */
async function readDetails(
  result: DiscoveredModel,
  hub: HubClient,
  options: DiscoverOptions,
): Promise<DiscoveredModel> {
  const { repo } = result;
  let files: Map<string, RepoFile>;
  let config: unknown;
  let indexText: string | null = null;
  try {
    const revision = await hub.revisionInfo(repo, "main", options.signal);
    files = new Map(revision.files.map((f) => [f.path, f]));
    const configFile = files.get("config.json");
    if (!configFile) {
      result.reason = "no config.json: Redwing needs a transformers or MLX checkpoint";
      return result;
    }
    const read = async (f: RepoFile): Promise<string> =>
      (await hub.getFile(repo, revision.commit, f, options.signal)).toString("utf8");
    try {
      config = JSON.parse(await read(configFile));
    } catch (error) {
      if (error instanceof SyntaxError) {
        result.reason = "its config.json is not valid JSON";
        return result;
      }
      throw error;
    }
    const index = files.get("model.safetensors.index.json");
    if (index) indexText = await read(index);
    if (result.gated) result.access = "granted";
  } catch (error) {
    if (options.signal?.aborted) throw options.signal.reason;
    result.status = "unknown";
    const code = (error as { code?: string }).code;
    if (code === "gated") {
      result.access = hub.options.token === null ? "needs_token" : "denied";
      result.reason =
        result.access === "needs_token"
          ? `gated: accept its licence at ${result.url} and set HF_TOKEN to a token of that account to see its size and memory`
          : `gated: the token in HF_TOKEN has no access yet; accept the licence at ${result.url}`;
    } else {
      result.reason = `could not read its files: ${(error as Error).message}`;
    }
    return result;
  }

  let planned;
  try {
    planned = layoutFromConfig(config);
  } catch (error) {
    // The importer's refusal is the reason; anything else (a config no importer check foresaw)
    // leaves this result unjudged rather than failing the whole search.
    result.status = error instanceof UserError ? "unsupported" : "unknown";
    result.reason =
      error instanceof UserError ? error.message : `could not judge it: ${String(error)}`;
    return result;
  }
  result.format = describeQuantization(planned.importPlan);
  const entries = [...files.keys()].sort();
  let shards: string[];
  try {
    shards = resolveShards(entries, indexText, repo).shards;
  } catch (error) {
    if (!(error instanceof UserError)) throw error;
    result.reason = error.message;
    return result;
  }
  const size = (name: string): number => Math.max(0, files.get(name)?.size ?? 0);
  result.downloadBytes =
    METADATA_FILES.filter((n) => files.has(n)).reduce((a, n) => a + size(n), 0) +
    shards.reduce((a, n) => a + size(n), 0);
  result.installBytes =
    planned.layout.files.reduce((a, f) => a + f.size, 0) +
    pickAuxiliaryFiles(entries).reduce((a, f) => a + size(f.from), 0);
  result.status = "runnable";
  if (options.planMemory) {
    try {
      result.memoryBytes = await options.planMemory(skeletonManifest(planned, repo));
      result.fits = result.memoryBytes <= options.totalMemoryBytes;
    } catch (error) {
      if (options.signal?.aborted) throw options.signal.reason;
      result.reason = `the engine could not plan its memory: ${(error as Error).message}`;
    }
  }
  return result;
}
