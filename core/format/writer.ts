/**
 * Writes a model directory atomically: everything goes into `.<name>.partial-<pid>-<random>`
 * next to the destination, data files are fsynced, `manifest.json` is written last, the
 * directory is fsynced and then renamed into place. A crash at any point leaves either no
 * model or the complete one; leftover partial directories are removed by the next writer.
 */
import { createHash, randomBytes, type Hash } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, mkdir, open, readdir, rename, rm, type FileHandle } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { UserError } from "../errors.ts";
import { type FloatDType } from "./dtype.ts";
import {
  AUXILIARY_FILES,
  EXPERTS_DIR,
  EXPERT_ALIGNMENT,
  EXPERT_PARTS,
  FORMAT_NAME,
  FORMAT_VERSION,
  MANIFEST_FILE,
  ManifestSchema,
  TENSOR_ALIGNMENT,
  WEIGHTS_FILE,
  alignUp,
  checkManifestLayout,
  expertLayerLayout,
  plainNbytes,
  quantizedPartNbytes,
  type Architecture,
  type ExpertLayer,
  type ExpertPartName,
  type FileEntry,
  type Manifest,
  type Source,
  type TensorEntry,
} from "./manifest.ts";
import { LEFTOVER_DIR_RE, partialDirName } from "./paths.ts";
import { exists, fsyncDir, pidAlive, writeFully } from "../fs.ts";

export interface ModelWriterOptions {
  /** Replace an existing model at the destination. */
  force?: boolean;
  /** Recorded in the manifest as `created_by`. */
  createdBy?: string;
  /**
   * fsync files and directories before the rename (default true). Only tests and throwaway
   * output should turn this off: without it a crash can leave an installed but empty model.
   */
  durable?: boolean;
}

/** Shape and encoding of a quantized matrix, without its regions. */
export interface QuantizedMeta {
  bits: 4 | 8;
  group_size: 32 | 64 | 128;
  scale_dtype: FloatDType;
  shape: [number, number];
}

export interface QuantizedData {
  weight: Uint8Array;
  scales: Uint8Array;
  biases: Uint8Array;
}

const ZEROS = Buffer.alloc(EXPERT_ALIGNMENT);

/** A file written front to back, hashed as it is written. */
class SequentialFile {
  position = 0;
  private readonly hash: Hash = createHash("sha256");

  private constructor(
    readonly relPath: string,
    private readonly handle: FileHandle,
    private readonly durable: boolean,
  ) {}

  static async create(dir: string, relPath: string, durable: boolean): Promise<SequentialFile> {
    // "wx": never follow or reuse something already there.
    return new SequentialFile(relPath, await open(join(dir, relPath), "wx"), durable);
  }

  async write(data: Uint8Array): Promise<void> {
    await writeFully(this.handle, data, this.position);
    this.hash.update(data);
    this.position += data.byteLength;
  }

  /** Pads with zero bytes up to a multiple of `alignment`. */
  async pad(alignment: number): Promise<void> {
    let gap = alignUp(this.position, alignment) - this.position;
    while (gap > 0) {
      const n = Math.min(gap, ZEROS.length);
      await this.write(ZEROS.subarray(0, n));
      gap -= n;
    }
  }

  /** fsyncs and closes; returns the file's entry for the manifest. */
  async finish(): Promise<FileEntry> {
    if (this.durable) await this.handle.sync();
    await this.handle.close();
    return { path: this.relPath, size: this.position, sha256: this.hash.digest("hex") };
  }

  async discard(): Promise<void> {
    await this.handle.close().catch(() => undefined);
  }
}

/** Writes the experts of one MoE layer, in order, one blob of `stride` bytes each. */
export class ExpertLayerWriter {
  private next = 0;

  constructor(
    private readonly file: SequentialFile,
    readonly layer: ExpertLayer,
  ) {}

  /** Appends expert `index` (must be the next one) from its nine regions. */
  async write(index: number, data: Record<ExpertPartName, QuantizedData>): Promise<void> {
    if (index !== this.next) {
      throw new Error(
        `experts of layer file ${this.layer.file} must be written in order: got ${index}, expected ${this.next}`,
      );
    }
    const start = this.file.position;
    for (const p of EXPERT_PARTS) {
      const part = this.layer.parts[p];
      for (const r of ["weight", "scales", "biases"] as const) {
        const bytes = data[p][r];
        if (bytes.byteLength !== part[r].nbytes) {
          throw new Error(
            `expert ${index} ${p}.${r}: ${bytes.byteLength} bytes, expected ${part[r].nbytes}`,
          );
        }
        await this.file.pad(TENSOR_ALIGNMENT);
        if (this.file.position - start !== part[r].offset) {
          throw new Error(`expert blob layout mismatch at ${p}.${r}`);
        }
        await this.file.write(bytes);
      }
    }
    await this.file.pad(EXPERT_ALIGNMENT);
    if (this.file.position - start !== this.layer.stride)
      throw new Error("expert blob size mismatch");
    this.next++;
  }

  get complete(): boolean {
    return this.next === this.layer.count;
  }

  get written(): number {
    return this.next;
  }
}

/**
 * Builds a model directory. Usage: `create`, then `addPlain` / `addQuantized` for every resident
 * tensor, `beginExpertLayer` + `write` for every expert, `addFile` / `copyFile` for tokenizer
 * files, and finally `commit` (or `abort` on failure).
 */
export class ModelWriter {
  private readonly tensors: Record<string, TensorEntry> = {};
  private readonly expertLayers = new Map<
    number,
    { writer: ExpertLayerWriter; file: SequentialFile }
  >();
  private readonly finishedFiles: FileEntry[] = [];
  private readonly auxFiles = new Set<string>();
  private done = false;

  private constructor(
    /** Absolute destination path. */
    readonly dest: string,
    /** Absolute path of the temporary directory being written. */
    readonly partialDir: string,
    private readonly weights: SequentialFile,
    private readonly options: ModelWriterOptions,
  ) {}

  static async create(dest: string, options: ModelWriterOptions = {}): Promise<ModelWriter> {
    const abs = resolve(dest);
    const parent = dirname(abs);
    const name = basename(abs);
    await mkdir(parent, { recursive: true });
    await removeLeftovers(parent, name);
    await checkDestination(abs, options.force ?? false);
    const partial = join(parent, partialDirName(name, process.pid, randomBytes(6).toString("hex")));
    await mkdir(partial);
    try {
      await mkdir(join(partial, EXPERTS_DIR));
      const weights = await SequentialFile.create(partial, WEIGHTS_FILE, options.durable ?? true);
      return new ModelWriter(abs, partial, weights, options);
    } catch (error) {
      await rm(partial, { recursive: true, force: true });
      throw error;
    }
  }

  /** Bytes written to weights.bin so far. */
  get weightsBytes(): number {
    return this.weights.position;
  }

  private get durable(): boolean {
    return this.options.durable ?? true;
  }

  private checkOpen(): void {
    if (this.done) throw new Error("ModelWriter: already committed or aborted");
  }

  private checkNew(name: string): void {
    this.checkOpen();
    if (name in this.tensors) throw new Error(`tensor ${name} written twice`);
  }

  private async region(data: Uint8Array): Promise<{ offset: number; nbytes: number }> {
    await this.weights.pad(TENSOR_ALIGNMENT);
    const offset = this.weights.position;
    await this.weights.write(data);
    return { offset, nbytes: data.byteLength };
  }

  /** Appends a plain tensor (bytes already little-endian `dtype`). */
  async addPlain(
    name: string,
    dtype: FloatDType,
    shape: number[],
    data: Uint8Array,
  ): Promise<void> {
    this.checkNew(name);
    const need = plainNbytes(dtype, shape);
    if (data.byteLength !== need) {
      throw new Error(
        `tensor ${name}: ${data.byteLength} bytes, expected ${need} for ${dtype} ${JSON.stringify(shape)}`,
      );
    }
    const r = await this.region(data);
    this.tensors[name] = { dtype, shape, offset: r.offset, nbytes: r.nbytes };
  }

  /**
   * Appends a quantized matrix. `weight` may be an async iterable of chunks so a large matrix
   * (the embedding) is written as it is produced; scales and biases follow it.
   */
  async addQuantized(
    name: string,
    meta: QuantizedMeta,
    weight: Uint8Array | AsyncIterable<Uint8Array>,
    scales: Uint8Array | (() => Uint8Array),
    biases: Uint8Array | (() => Uint8Array),
  ): Promise<void> {
    this.checkNew(name);
    const need = quantizedPartNbytes(meta);
    await this.weights.pad(TENSOR_ALIGNMENT);
    const wOffset = this.weights.position;
    if (weight instanceof Uint8Array) {
      await this.weights.write(weight);
    } else {
      for await (const chunk of weight) await this.weights.write(chunk);
    }
    const wBytes = this.weights.position - wOffset;
    const s = typeof scales === "function" ? scales() : scales;
    const b = typeof biases === "function" ? biases() : biases;
    for (const [what, got, want] of [
      ["weight", wBytes, need.weight],
      ["scales", s.byteLength, need.scales],
      ["biases", b.byteLength, need.biases],
    ] as const) {
      if (got !== want)
        throw new Error(`tensor ${name}: ${what} has ${got} bytes, expected ${want}`);
    }
    const sr = await this.region(s);
    const br = await this.region(b);
    this.tensors[name] = {
      dtype: "affine",
      ...meta,
      weight: { offset: wOffset, nbytes: wBytes },
      scales: sr,
      biases: br,
    };
  }

  /** Opens `experts/layer_NNN.bin` for `count` experts with the given part encodings. */
  async beginExpertLayer(
    layer: number,
    count: number,
    parts: Record<ExpertPartName, QuantizedMeta>,
  ): Promise<ExpertLayerWriter> {
    this.checkOpen();
    if (this.expertLayers.has(layer)) throw new Error(`expert layer ${layer} begun twice`);
    const entry = expertLayerLayout(layer, count, parts);
    const file = await SequentialFile.create(this.partialDir, entry.file, this.durable);
    const writer = new ExpertLayerWriter(file, entry);
    this.expertLayers.set(layer, { writer, file });
    return writer;
  }

  /** Writes an auxiliary file (tokenizer, template, generation config) from memory. */
  async addFile(relPath: string, data: Uint8Array | string): Promise<void> {
    this.checkAux(relPath);
    const file = await SequentialFile.create(this.partialDir, relPath, this.durable);
    await file.write(typeof data === "string" ? Buffer.from(data, "utf8") : data);
    this.finishedFiles.push(await file.finish());
  }

  /** Copies an auxiliary file from the checkpoint. */
  async copyFile(srcPath: string, relPath: string): Promise<void> {
    this.checkAux(relPath);
    const file = await SequentialFile.create(this.partialDir, relPath, this.durable);
    for await (const chunk of createReadStream(srcPath, { highWaterMark: 1024 * 1024 })) {
      await file.write(chunk as Buffer);
    }
    this.finishedFiles.push(await file.finish());
  }

  private checkAux(relPath: string): void {
    this.checkOpen();
    if (!(AUXILIARY_FILES as readonly string[]).includes(relPath)) {
      throw new Error(`${relPath} is not an auxiliary file of the format`);
    }
    if (this.auxFiles.has(relPath)) throw new Error(`${relPath} written twice`);
    this.auxFiles.add(relPath);
  }

  /**
   * Finishes the directory: fsyncs the data files, writes and fsyncs manifest.json, fsyncs the
   * directories and renames the result to the destination. Returns the manifest written.
   */
  async commit(meta: {
    architecture: Architecture;
    source: Source;
    quantization: { group_size: number; bits: number };
  }): Promise<Manifest> {
    this.checkOpen();
    const files: FileEntry[] = [await this.weights.finish()];
    const layers: Record<string, ExpertLayer> = {};
    for (const [layer, { writer, file }] of [...this.expertLayers].sort((a, b) => a[0] - b[0])) {
      if (!writer.complete) {
        throw new Error(
          `expert layer ${layer}: ${writer.written} of ${writer.layer.count} experts written`,
        );
      }
      files.push(await file.finish());
      layers[String(layer)] = writer.layer;
    }
    files.push(...[...this.finishedFiles].sort((a, b) => a.path.localeCompare(b.path)));
    const manifest: Manifest = {
      format: FORMAT_NAME,
      format_version: FORMAT_VERSION,
      created_by: this.options.createdBy ?? "redwing",
      architecture: meta.architecture,
      source: meta.source,
      quantization: meta.quantization,
      tensors: this.tensors,
      experts: this.expertLayers.size > 0 ? { alignment: EXPERT_ALIGNMENT, layers } : null,
      files,
    };
    // Never install something a reader would reject: this catches importer bugs.
    const parsed = ManifestSchema.safeParse(manifest);
    if (!parsed.success)
      throw new Error(`internal error: invalid manifest: ${parsed.error.message}`);
    const problems = checkManifestLayout(manifest);
    if (problems.length > 0) {
      throw new Error(`internal error: inconsistent manifest: ${problems.slice(0, 5).join("; ")}`);
    }
    const manifestFile = await SequentialFile.create(this.partialDir, MANIFEST_FILE, this.durable);
    await manifestFile.write(Buffer.from(JSON.stringify(manifest, null, 1) + "\n", "utf8"));
    await manifestFile.finish();
    if (this.durable) {
      await fsyncDir(join(this.partialDir, EXPERTS_DIR));
      await fsyncDir(this.partialDir);
    }
    await this.install();
    this.done = true;
    return manifest;
  }

  private async install(): Promise<void> {
    await moveIntoPlace(this.partialDir, this.dest, this.options.force ?? false, this.durable);
  }

  /** Removes the partial directory. Safe to call more than once and after a failed commit. */
  async abort(): Promise<void> {
    if (this.done) return;
    this.done = true;
    await this.weights.discard();
    for (const { file } of this.expertLayers.values()) await file.discard();
    await rm(this.partialDir, { recursive: true, force: true });
  }
}

/**
 * The destination may be absent, or with `force` an existing model directory (has a manifest)
 * or an empty directory. Anything else is refused so `--force` can never delete unrelated data.
 */
export async function checkDestination(dest: string, force: boolean): Promise<void> {
  let st;
  try {
    st = await lstat(dest);
  } catch {
    return;
  }
  if (!force) {
    const installed = await exists(join(dest, MANIFEST_FILE));
    throw new UserError(
      installed
        ? `a model is already installed at ${dest}; pass --force to replace it, or choose another --out`
        : `${dest} already exists; choose another --out or pass --force to replace the model there`,
      "destination_exists",
    );
  }
  if (!st.isDirectory()) {
    throw new UserError(
      `${dest} exists and is not a directory; refusing to replace it`,
      "destination_exists",
    );
  }
  const entries = await readdir(dest);
  if (entries.length > 0 && !entries.includes(MANIFEST_FILE)) {
    throw new UserError(
      `${dest} exists and is not a Redwing model (no ${MANIFEST_FILE}); refusing to replace it`,
      "destination_exists",
    );
  }
}

/**
 * Renames the finished directory `from` to `dest`. An old model (with `force`) is first moved
 * aside under an `.old-` name, so the destination is never half-replaced and a crash in between
 * leaves it where removeLeftovers puts it back; a failed rename puts it back at once.
 */
export async function moveIntoPlace(
  from: string,
  dest: string,
  force: boolean,
  durable: boolean,
): Promise<void> {
  await checkDestination(dest, force);
  const parent = dirname(dest);
  let old: string | null = null;
  if (await exists(dest)) {
    old = join(parent, `.${basename(dest)}.old-${process.pid}-${randomBytes(6).toString("hex")}`);
    await rename(dest, old);
  }
  try {
    await rename(from, dest);
  } catch (error) {
    if (old) await rename(old, dest).catch(() => undefined);
    throw error;
  }
  if (durable) await fsyncDir(parent);
  if (old) await rm(old, { recursive: true, force: true });
}

/**
 * Removes `.<name>.partial-*` and `.<name>.old-*` directories left in `parent` by writers that
 * are no longer running (a killed import), except that an `.old-*` model whose replacement never
 * arrived is restored to `<name>`. Directories of live processes are left alone. Returns the
 * names removed.
 */
export async function removeLeftovers(parent: string, name: string): Promise<string[]> {
  const removed: string[] = [];
  let entries: string[];
  try {
    entries = await readdir(parent);
  } catch {
    return removed;
  }
  for (const entry of entries) {
    const m = LEFTOVER_DIR_RE.exec(entry);
    if (!m || m[1] !== name) continue;
    const pid = Number(m[3]);
    if (pid === process.pid || pidAlive(pid)) continue;
    // A writer killed between moving the old model aside and renaming the new one in leaves
    // the destination empty: put the old model back instead of deleting it.
    if (m[2] === "old" && !(await exists(join(parent, name)))) {
      await rename(join(parent, entry), join(parent, name));
      continue;
    }
    await rm(join(parent, entry), { recursive: true, force: true });
    removed.push(entry);
  }
  return removed;
}
