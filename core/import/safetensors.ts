/**
 * Streaming safetensors reader: parses the headers only and reads tensor bytes on demand with
 * positional reads, so a checkpoint much larger than memory can be imported.
 *
 * File layout: an 8-byte little-endian header length N, N bytes of JSON
 * `{ name: { dtype, shape, data_offsets: [begin, end] }, "__metadata__": {...} }`, then the data;
 * offsets are relative to the first byte after the header.
 */
import { stat, type FileHandle } from "node:fs/promises";
import { basename, join } from "node:path";
import { UserError } from "../errors.ts";
import { openInputFile, readInputFile } from "./input-files.ts";
import { isSafeRelativePath } from "../format/paths.ts";

export type StDType =
  | "BOOL"
  | "U8"
  | "I8"
  | "U16"
  | "I16"
  | "F16"
  | "BF16"
  | "U32"
  | "I32"
  | "F32"
  | "U64"
  | "I64"
  | "F64"
  | "F8_E4M3"
  | "F8_E5M2";

const DTYPE_SIZE: Record<StDType, number> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E4M3: 1,
  F8_E5M2: 1,
  U16: 2,
  I16: 2,
  F16: 2,
  BF16: 2,
  U32: 4,
  I32: 4,
  F32: 4,
  U64: 8,
  I64: 8,
  F64: 8,
};

export function stDtypeSize(dtype: StDType): number {
  return DTYPE_SIZE[dtype];
}

export interface TensorInfo {
  name: string;
  dtype: StDType;
  shape: number[];
  /** Path of the file holding it (absolute or relative to the process, as given). */
  file: string;
  /** Absolute byte offset of the first data byte in `file`. */
  start: number;
  nbytes: number;
}

/** Largest header we accept; real ones are a few MB. */
const MAX_HEADER_BYTES = 256 * 1024 * 1024;

export class SafetensorsFile {
  private constructor(
    readonly path: string,
    readonly size: number,
    readonly tensors: Map<string, TensorInfo>,
    readonly metadata: Record<string, string>,
  ) {}

  /** Parses and validates the header of one `.safetensors` file. */
  static async open(path: string): Promise<SafetensorsFile> {
    const name = basename(path);
    let handle: FileHandle;
    try {
      handle = await openInputFile(path);
    } catch (error) {
      if (error instanceof UserError) throw error;
      throw new UserError(`cannot open ${path}: ${(error as Error).message}`, "checkpoint_io");
    }
    try {
      const { size } = await handle.stat();
      const lenBuf = Buffer.alloc(8);
      if (size >= 8) await readFully(handle, lenBuf, 0);
      const n = safetensorsHeaderLength(name, lenBuf, size);
      const headerBuf = Buffer.alloc(n);
      await readFully(handle, headerBuf, 8);
      const { tensors, metadata } = parseSafetensorsHeader(name, path, headerBuf, size);
      return new SafetensorsFile(path, size, tensors, metadata);
    } finally {
      await handle.close();
    }
  }
}

/**
 * Length of the JSON header from the first 8 bytes of a safetensors file of `size` bytes
 * (`name` is used in messages). Throws a UserError when the file cannot hold it.
 */
export function safetensorsHeaderLength(name: string, first8: Uint8Array, size: number): number {
  const bad = (what: string): UserError =>
    new UserError(`${name}: not a valid safetensors file: ${what}`, "safetensors_invalid");
  if (size < 8 || first8.byteLength < 8) throw bad(`only ${size} bytes`);
  const headerLen = Buffer.from(first8.buffer, first8.byteOffset, 8).readBigUInt64LE(0);
  if (headerLen > BigInt(Math.min(MAX_HEADER_BYTES, size - 8))) {
    throw bad(`header length ${headerLen} does not fit in the file (${size} bytes)`);
  }
  return Number(headerLen);
}

/**
 * Parses and validates the JSON header (the bytes after the 8-byte length) of a safetensors
 * file of `size` bytes. `path` becomes `TensorInfo.file`; offsets are absolute in the file.
 * Shared by the local reader and the installer, which fetches headers with range requests.
 */
export function parseSafetensorsHeader(
  name: string,
  path: string,
  headerBuf: Uint8Array,
  size: number,
): { tensors: Map<string, TensorInfo>; metadata: Record<string, string> } {
  const bad = (what: string): UserError =>
    new UserError(`${name}: not a valid safetensors file: ${what}`, "safetensors_invalid");
  let header: unknown;
  try {
    header = JSON.parse(Buffer.from(headerBuf).toString("utf8"));
  } catch (error) {
    throw bad(`header is not JSON (${(error as Error).message})`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    throw bad("header is not a JSON object");
  }
  const dataStart = 8 + headerBuf.byteLength;
  const dataSize = size - dataStart;
  const tensors = new Map<string, TensorInfo>();
  let metadata: Record<string, string> = {};
  for (const [key, value] of Object.entries(header as Record<string, unknown>)) {
    if (key === "__metadata__") {
      // The format: a map of strings to strings. Anything else would be passed on typed as such.
      if (
        typeof value !== "object" ||
        value === null ||
        Array.isArray(value) ||
        !Object.values(value).every((v) => typeof v === "string")
      ) {
        throw bad("__metadata__ must map names to strings");
      }
      metadata = { ...(value as Record<string, string>) };
      continue;
    }
    tensors.set(key, parseEntry(name, path, key, value, dataStart, dataSize));
  }
  // Regions may not overlap (the format requires a dense, ordered buffer; we only need
  // that no two tensors share bytes).
  const sorted = [...tensors.values()].sort((a, b) => a.start - b.start);
  for (let i = 1; i < sorted.length; i++) {
    const prev = sorted[i - 1]!;
    const cur = sorted[i]!;
    if (cur.start < prev.start + prev.nbytes) {
      throw new UserError(
        `${name}: tensors ${prev.name} and ${cur.name} overlap`,
        "safetensors_invalid",
      );
    }
  }
  return { tensors, metadata };
}

function parseEntry(
  fileName: string,
  path: string,
  key: string,
  value: unknown,
  dataStart: number,
  dataSize: number,
): TensorInfo {
  const bad = (what: string): UserError =>
    new UserError(`${fileName}: tensor ${key}: ${what}`, "safetensors_invalid");
  if (typeof value !== "object" || value === null) throw bad("entry is not an object");
  const entry = value as Record<string, unknown>;
  const dtype = entry.dtype;
  // Own keys only: `"toString" in DTYPE_SIZE` is true.
  if (typeof dtype !== "string" || !Object.hasOwn(DTYPE_SIZE, dtype)) {
    throw bad(dtype === undefined ? "no dtype" : `unknown dtype ${JSON.stringify(dtype)}`);
  }
  const shape = entry.shape;
  if (
    !Array.isArray(shape) ||
    !shape.every((d): d is number => Number.isSafeInteger(d) && (d as number) >= 0)
  ) {
    throw bad(shape === undefined ? "no shape" : `invalid shape ${JSON.stringify(shape)}`);
  }
  const offsets = entry.data_offsets;
  if (
    !Array.isArray(offsets) ||
    offsets.length !== 2 ||
    !offsets.every((o): o is number => Number.isSafeInteger(o) && (o as number) >= 0)
  ) {
    throw bad(
      offsets === undefined ? "no data_offsets" : `invalid data_offsets ${JSON.stringify(offsets)}`,
    );
  }
  const [begin, end] = offsets as [number, number];
  if (end < begin) throw bad(`data_offsets [${begin}, ${end}] end before begin`);
  const elements = shape.reduce((a, b) => a * b, 1);
  const expected = elements * DTYPE_SIZE[dtype as StDType];
  if (end - begin !== expected) {
    throw bad(
      `data_offsets [${begin}, ${end}] hold ${end - begin} bytes but ${dtype} ${JSON.stringify(shape)} needs ${expected}`,
    );
  }
  if (end > dataSize) {
    throw bad(
      `data ends at byte ${dataStart + end} but the file has ${dataStart + dataSize} bytes (truncated?)`,
    );
  }
  return {
    name: key,
    dtype: dtype as StDType,
    shape: shape as number[],
    file: path,
    start: dataStart + begin,
    nbytes: end - begin,
  };
}

async function readFully(handle: FileHandle, buf: Buffer, position: number): Promise<void> {
  let done = 0;
  while (done < buf.length) {
    const { bytesRead } = await handle.read(buf, done, buf.length - done, position + done);
    if (bytesRead === 0) throw new Error(`unexpected end of file at byte ${position + done}`);
    done += bytesRead;
  }
}

/**
 * The shard files of a checkpoint: those `model.safetensors.index.json` (its text, or null when
 * absent) maps tensors to, else `model.safetensors`, else every `*.safetensors` file in
 * `fileNames`. `where` names the checkpoint in messages.
 */
export function resolveShards(
  fileNames: string[],
  indexText: string | null,
  where: string,
): { shards: string[]; weightMap: Map<string, string> | null } {
  let shards: string[];
  let weightMap: Map<string, string> | null = null;
  if (indexText !== null) {
    let index: unknown;
    try {
      index = JSON.parse(indexText);
    } catch (error) {
      throw new UserError(
        `model.safetensors.index.json is not valid JSON: ${(error as Error).message}`,
        "safetensors_invalid",
      );
    }
    const map = (index as { weight_map?: unknown })?.weight_map;
    if (typeof map !== "object" || map === null) {
      throw new UserError(
        "model.safetensors.index.json has no weight_map object",
        "safetensors_invalid",
      );
    }
    weightMap = new Map();
    for (const [tensor, file] of Object.entries(map as Record<string, unknown>)) {
      if (typeof file !== "string" || !isSafeRelativePath(file)) {
        throw new UserError(
          `model.safetensors.index.json maps ${tensor} to ${JSON.stringify(file)}, which is not a file inside the checkpoint`,
          "safetensors_invalid",
        );
      }
      weightMap.set(tensor, file);
    }
    shards = [...new Set(weightMap.values())];
  } else if (fileNames.includes("model.safetensors")) {
    shards = ["model.safetensors"];
  } else {
    shards = fileNames.filter((f) => f.endsWith(".safetensors")).sort();
  }
  if (shards.length === 0) {
    throw new UserError(`no .safetensors files in ${where}`, "checkpoint_incomplete");
  }
  return { shards, weightMap };
}

/**
 * Merges the tensors of opened shards (in shard order). With an index, a tensor belongs to the
 * shard the index names (others are ignored) and every indexed tensor must exist.
 */
export function mergeShards(
  opened: { shard: string; tensors: Map<string, TensorInfo> }[],
  weightMap: Map<string, string> | null,
): Map<string, TensorInfo> {
  const tensors = new Map<string, TensorInfo>();
  const shardOf = new Map<string, string>();
  for (const { shard, tensors: shardTensors } of opened) {
    for (const [name, info] of shardTensors) {
      if (weightMap && weightMap.get(name) !== shard) continue;
      if (tensors.has(name)) {
        throw new UserError(
          `tensor ${name} appears in both ${basename(shardOf.get(name)!)} and ${shard}`,
          "safetensors_invalid",
        );
      }
      tensors.set(name, info);
      shardOf.set(name, shard);
    }
  }
  if (weightMap) {
    for (const [name, shard] of weightMap) {
      if (!tensors.has(name)) {
        throw new UserError(
          `${shard} has no tensor ${name} (listed in model.safetensors.index.json)`,
          "safetensors_invalid",
        );
      }
    }
  }
  return tensors;
}

/**
 * All tensors of a checkpoint directory: `model.safetensors.index.json` with its shards, or
 * `model.safetensors`, or every `*.safetensors` file. Keeps one file handle per shard open.
 */
export class SafetensorsCheckpoint {
  private handles = new Map<string, FileHandle>();

  private constructor(
    readonly dir: string,
    /** Shard file names relative to `dir`, in the order they were read. */
    readonly files: string[],
    readonly tensors: Map<string, TensorInfo>,
  ) {}

  static async open(dir: string, fileNames: string[]): Promise<SafetensorsCheckpoint> {
    const indexPath = join(dir, "model.safetensors.index.json");
    const indexText: string | null = await readInputFile(indexPath).then(
      (bytes) => bytes.toString("utf8"),
      (error: unknown) => {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
        throw error;
      },
    );
    const { shards, weightMap } = resolveShards(fileNames, indexText, dir);
    const opened: { shard: string; tensors: Map<string, TensorInfo> }[] = [];
    for (const shard of shards) {
      const path = join(dir, shard);
      try {
        await stat(path);
      } catch {
        throw new UserError(
          `${shard} is missing from the checkpoint (listed in model.safetensors.index.json)`,
          "checkpoint_incomplete",
        );
      }
      opened.push({ shard, tensors: (await SafetensorsFile.open(path)).tensors });
    }
    const tensors = mergeShards(opened, weightMap);
    const files = indexText !== null ? ["model.safetensors.index.json", ...shards] : shards;
    return new SafetensorsCheckpoint(dir, files, tensors);
  }

  get(name: string): TensorInfo | undefined {
    return this.tensors.get(name);
  }

  /** Reads `length` bytes starting `offset` bytes into tensor `info`. */
  async read(info: TensorInfo, offset = 0, length = info.nbytes - offset): Promise<Buffer> {
    if (offset < 0 || length < 0 || offset + length > info.nbytes) {
      throw new RangeError(`read of ${info.name} out of range`);
    }
    let handle = this.handles.get(info.file);
    if (!handle) {
      handle = await openInputFile(info.file);
      this.handles.set(info.file, handle);
    }
    const buf = Buffer.allocUnsafe(length);
    try {
      await readFully(handle, buf, info.start + offset);
    } catch (error) {
      throw new UserError(
        `reading tensor ${info.name} from ${basename(info.file)}: ${(error as Error).message}`,
        "checkpoint_io",
      );
    }
    return buf;
  }

  async close(): Promise<void> {
    const handles = [...this.handles.values()];
    this.handles.clear();
    await Promise.all(handles.map((h) => h.close()));
  }
}
