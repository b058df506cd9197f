/**
 * Install planning: from a revision's file list, its small metadata files and the safetensors
 * headers of its shards, work out everything the install will do before it writes a byte: the
 * importer's plan and layout (core/import/importer.ts), the units of source bytes and where
 * they go, and the HTTP ranges that fetch them. The plan is a pure function of what the hub
 * served and of the options, and its digest keys the resume journal: a resume reuses earlier
 * work only when it would compute exactly the same plan.
 */
import { createHash } from "node:crypto";
import { UserError } from "../errors.ts";
import { normalizeConfig } from "../import/config.ts";
import {
  TEMPLATE_SOURCES,
  importUnits,
  layoutImport,
  pickAuxiliaryFiles,
  planImport,
  sourceFileNames,
  templateFromJson,
  type AuxFile,
  type ImportLayout,
  type ImportPlan,
  type ImportUnit,
} from "../import/importer.ts";
import {
  mergeShards,
  parseSafetensorsHeader,
  resolveShards,
  type TensorInfo,
} from "../import/safetensors.ts";
import { type Architecture, type Source } from "../format/manifest.ts";
import { type FileIdentity, type RepoFile } from "./hub.ts";

/** Bumped whenever planning or the layout changes, so old journals are not reused. */
export const PLAN_VERSION = 1;

/**
 * - "full": every byte of every shard is fetched (the vision and audio tensors too, then
 *   dropped) so that each shard's SHA-256 is checked against the hub's LFS hash.
 * - "ranges": only the bytes of the tensors Redwing uses (plus gaps under 1 MiB); shards that
 *   end up fully fetched are still checked, the others only structurally.
 */
export type VerifyMode = "full" | "ranges";

export interface PlanOptions {
  verify: VerifyMode;
  /** Largest HTTP range (bytes). */
  maxRangeBytes: number;
  /** Largest unit of source bytes processed at once (bytes, at most maxRangeBytes). */
  unitBytes: number;
  /** In "ranges" mode, gaps up to this size between needed bytes are fetched, not split. */
  maxGapBytes: number;
}

export interface ShardPlan {
  index: number;
  path: string;
  file: RepoFile;
  identity: FileIdentity;
  /** The first `header.length` bytes of the file (8-byte length + JSON header). */
  header: Buffer;
  /** Ids of this shard's ranges, in file order. */
  ranges: number[];
  /** True when the ranges cover the whole file, so its hash can be checked. */
  complete: boolean;
}

export interface RangePlan {
  id: number;
  shard: number;
  start: number;
  length: number;
  /** Indices into `units` of the units inside this range, in file order. */
  units: number[];
}

export interface InstallPlan {
  repo: string;
  commit: string;
  architecture: Architecture;
  importPlan: ImportPlan;
  layout: ImportLayout;
  units: ImportUnit[];
  shards: ShardPlan[];
  ranges: RangePlan[];
  /** Files fetched whole (config, index, tokenizer...), with their content. */
  metadata: Map<string, Buffer>;
  auxFiles: AuxFile[];
  /** The manifest's `source`. */
  source: Source;
  /** Bytes of the installed directory (data files and auxiliary files; manifest not counted). */
  installBytes: number;
  /** Bytes the ranges fetch. */
  rangeBytes: number;
  /** Bytes of the whole files fetched. */
  metadataBytes: number;
  digest: string;
}

/** Absolute byte offset of a unit in its shard file. */
export function unitStart(unit: ImportUnit): number {
  return unit.src.start + unit.offset;
}

/** The extents a unit's placements cover, in the order produceUnit returns them. */
export function unitExtents(unit: ImportUnit): { file: string; offset: number; length: number }[] {
  const op = unit.op;
  if (op.kind === "copy") return [{ file: op.file, offset: op.at, length: unit.length }];
  const dsize = unit.length / (op.rows * op.cols);
  const w = (op.rows * op.cols * op.params.bits) / 8;
  const s = op.rows * (op.cols / op.params.groupSize) * dsize;
  return [
    { file: op.file, offset: op.weight, length: w },
    { file: op.file, offset: op.scales, length: s },
    { file: op.file, offset: op.biases, length: s },
  ];
}

function parseJson(name: string, bytes: Buffer): unknown {
  try {
    return JSON.parse(bytes.toString("utf8"));
  } catch (error) {
    throw new UserError(`${name} is not valid JSON: ${(error as Error).message}`, "config_invalid");
  }
}

/** What the planner needs from the hub. */
export interface PlanSources {
  repo: string;
  commit: string;
  /** Top-level files of the revision. */
  files: Map<string, RepoFile>;
  metadata: Map<string, Buffer>;
  identities: Map<string, FileIdentity>;
  headers: Map<string, Buffer>;
}

/** The shards a checkpoint's index (or file list) names, before the headers are fetched. */
export function shardNames(
  files: Map<string, RepoFile>,
  metadata: Map<string, Buffer>,
  repo: string,
): string[] {
  const index = metadata.get("model.safetensors.index.json");
  return resolveShards([...files.keys()].sort(), index ? index.toString("utf8") : null, repo)
    .shards;
}

/** The architecture from config.json (and generation_config.json); unsupported ones throw. */
export function planArchitecture(metadata: Map<string, Buffer>): {
  config: Record<string, unknown>;
  generation: unknown;
  architecture: Architecture;
} {
  const configBytes = metadata.get("config.json");
  if (!configBytes)
    throw new UserError("the repository has no config.json", "checkpoint_incomplete");
  const config = parseJson("config.json", configBytes) as Record<string, unknown>;
  const genBytes = metadata.get("generation_config.json");
  const generation = genBytes ? parseJson("generation_config.json", genBytes) : undefined;
  const { architecture } = normalizeConfig(config, generation);
  return { config, generation, architecture };
}

export function buildInstallPlan(sources: PlanSources, options: PlanOptions): InstallPlan {
  const { repo, commit, files, metadata } = sources;
  const { config, generation, architecture } = planArchitecture(metadata);
  const names = shardNames(files, metadata, repo);
  const index = metadata.get("model.safetensors.index.json");
  const { weightMap } = resolveShards(
    [...files.keys()].sort(),
    index ? index.toString("utf8") : null,
    repo,
  );
  const opened: { shard: string; tensors: Map<string, TensorInfo> }[] = [];
  for (const name of names) {
    const header = sources.headers.get(name)!;
    const file = files.get(name)!;
    const parsed = parseSafetensorsHeader(name, name, header.subarray(8), file.size);
    opened.push({ shard: name, tensors: parsed.tensors });
  }
  const tensors = mergeShards(opened, weightMap);
  const table = { tensors, get: (n: string) => tensors.get(n) };
  const importPlan = planImport(architecture, table, config);
  const layout = layoutImport(importPlan, architecture);
  const unitBytes = Math.min(options.unitBytes, options.maxRangeBytes);
  const units = importUnits(importPlan, layout, unitBytes);

  // Ranges, shard by shard in index order.
  const shards: ShardPlan[] = [];
  const ranges: RangePlan[] = [];
  const byShard = new Map<string, number[]>();
  units.forEach((u, i) => {
    const list = byShard.get(u.src.file) ?? [];
    list.push(i);
    byShard.set(u.src.file, list);
  });
  names.forEach((name, shardIndex) => {
    const file = files.get(name)!;
    const unitIds = (byShard.get(name) ?? []).sort(
      (a, b) => unitStart(units[a]!) - unitStart(units[b]!),
    );
    // Files stored in git (not LFS) have no SHA-256 on the hub: always fetch them whole.
    const full = options.verify === "full" || file.lfsSha256 === null;
    const built = buildRanges(
      file.size,
      unitIds,
      units,
      full,
      options.maxRangeBytes,
      options.maxGapBytes,
    );
    const ids: number[] = [];
    for (const r of built) {
      ids.push(ranges.length);
      ranges.push({ id: ranges.length, shard: shardIndex, ...r });
    }
    let covered = 0;
    for (const r of built) if (r.start === covered) covered = r.start + r.length;
    shards.push({
      index: shardIndex,
      path: name,
      file,
      identity: sources.identities.get(name)!,
      header: sources.headers.get(name)!,
      ranges: ids,
      complete: covered === file.size,
    });
  });

  // Auxiliary and source files, exactly as importCheckpoint records them.
  const entries = [...files.keys()].sort();
  const auxFiles = pickAuxiliaryFiles(entries);
  if (!entries.includes("chat_template.jinja")) {
    for (const name of TEMPLATE_SOURCES) {
      const bytes = metadata.get(name);
      if (!bytes) continue;
      const template = templateFromJson(name, parseJson(name, bytes));
      if (template) {
        auxFiles.push(template);
        break;
      }
    }
  }
  const checkpointFiles = index ? ["model.safetensors.index.json", ...names] : names;
  const sourceNames = sourceFileNames(generation !== undefined, checkpointFiles, auxFiles);
  const source: Source = {
    kind: importPlan.kind,
    repo,
    revision: commit,
    files: sourceNames.map((path) => {
      const f = files.get(path)!;
      const bytes = metadata.get(path);
      // Shards: the hub's LFS SHA-256 (checked in "full" mode); whole files: what arrived.
      const sha256 = bytes
        ? createHash("sha256").update(bytes).digest("hex")
        : (f.lfsSha256 ?? "0".repeat(64));
      return { path, size: f.size, sha256 };
    }),
  };

  const auxBytes = auxFiles.reduce(
    (a, f) =>
      a +
      (f.template !== undefined ? Buffer.byteLength(f.template) : (files.get(f.from)?.size ?? 0)),
    0,
  );
  const installBytes = layout.files.reduce((a, f) => a + f.size, 0) + auxBytes;
  const rangeBytes = ranges.reduce((a, r) => a + r.length, 0);
  const metadataBytes = [...metadata.values()].reduce((a, b) => a + b.byteLength, 0);
  const digest = createHash("sha256")
    .update(
      JSON.stringify({
        v: PLAN_VERSION,
        repo,
        commit,
        options: { ...options, unitBytes },
        shards: shards.map((s) => ({
          path: s.path,
          size: s.file.size,
          lfs: s.file.lfsSha256,
          blob: s.file.blobId,
          etag: s.identity.etag,
          header: createHash("sha256").update(s.header).digest("hex"),
        })),
        metadata: [...metadata].map(([p, b]) => [p, createHash("sha256").update(b).digest("hex")]),
        layout,
        ranges: ranges.map((r) => [r.shard, r.start, r.length, r.units.length]),
      }),
    )
    .digest("hex");
  return {
    repo,
    commit,
    architecture,
    importPlan,
    layout,
    units,
    shards,
    ranges,
    metadata,
    auxFiles,
    source,
    installBytes,
    rangeBytes,
    metadataBytes,
    digest,
  };
}

/**
 * Packs a shard's units (sorted by offset) into ranges of at most `maxRange` bytes; a unit is
 * never split. With `full`, the gaps between units (header, skipped tensors) are fetched too so
 * the ranges cover the file; otherwise gaps up to `maxGap` are fetched and larger ones skipped.
 */
export function buildRanges(
  size: number,
  unitIds: number[],
  units: ImportUnit[],
  full: boolean,
  maxRange: number,
  maxGap: number,
): { start: number; length: number; units: number[] }[] {
  const out: { start: number; length: number; units: number[] }[] = [];
  let cur: { start: number; end: number; units: number[] } | null = null;
  const close = (): void => {
    if (cur && cur.end > cur.start)
      out.push({ start: cur.start, length: cur.end - cur.start, units: cur.units });
    cur = null;
  };
  const addGap = (from: number, to: number): void => {
    let p = from;
    while (p < to) {
      cur ??= { start: p, end: p, units: [] };
      const room = maxRange - (cur.end - cur.start);
      if (room <= 0) {
        close();
        continue;
      }
      const n = Math.min(room, to - p);
      cur.end += n;
      p += n;
    }
  };
  let cursor = 0;
  for (const id of unitIds) {
    const u = units[id]!;
    const start = unitStart(u);
    if (start > cursor) {
      if (full) addGap(cursor, start);
      else {
        const c = cur as { start: number; end: number } | null;
        if (c && start - c.end <= maxGap && start + u.length - c.start <= maxRange) c.end = start;
        else close();
      }
    }
    if (
      cur &&
      (cur as { start: number; end: number }).end - (cur as { start: number }).start + u.length >
        maxRange
    )
      close();
    cur ??= { start, end: start, units: [] };
    const c = cur as { start: number; end: number; units: number[] };
    c.units.push(id);
    c.end = start + u.length;
    cursor = c.end;
  }
  if (full) addGap(cursor, size);
  close();
  return out;
}
