/**
 * Opening an installed model directory: the manifest is parsed and checked against the files on
 * disk before anything trusts it. Errors are UserErrors that name the file at fault.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, readdir, readFile } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import { UserError } from "../errors.ts";
import {
  EXPERTS_DIR,
  FORMAT_NAME,
  FORMAT_VERSION,
  MANIFEST_FILE,
  ManifestSchema,
  checkManifestLayout,
  type Manifest,
} from "./manifest.ts";
import { isPartialDirName } from "./paths.ts";

/**
 * Names of the directories in a models folder that may hold a model (not hidden, not a writer's
 * temporary directory), sorted; none when the folder does not exist.
 */
export async function modelDirNames(modelsDir: string): Promise<string[]> {
  try {
    return (await readdir(modelsDir, { withFileTypes: true }))
      .filter((e) => e.isDirectory() && !e.name.startsWith(".") && !isPartialDirName(e.name))
      .map((e) => e.name)
      .sort();
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw error;
  }
}

export interface ReadOptions {
  /** Rehash every file and compare with the manifest (slow: reads the whole model). */
  verifyHashes?: boolean;
}

export interface ModelDir {
  /** Absolute path of the directory. */
  dir: string;
  manifest: Manifest;
}

/** SHA-256 (lower-case hex) of a file, read as a stream. */
export async function sha256File(path: string, onBytes?: (n: number) => void): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path, { highWaterMark: 4 * 1024 * 1024 })) {
    hash.update(chunk as Buffer);
    onBytes?.((chunk as Buffer).length);
  }
  return hash.digest("hex");
}

/**
 * Parses `manifest.json` of `dir` and checks the directory against it: known format and version,
 * a consistent layout, every listed file present as a regular file (no symbolic links) with the
 * listed size, no other files, and optionally every SHA-256.
 */
export async function readModelDir(dir: string, options: ReadOptions = {}): Promise<ModelDir> {
  const abs = resolve(dir);
  const manifest = await readManifest(abs);
  await checkDirectoryContents(abs, manifest);
  if (options.verifyHashes) {
    for (const file of manifest.files) {
      const actual = await sha256File(join(abs, file.path));
      if (actual !== file.sha256) {
        throw new UserError(
          `${file.path} in ${abs} is corrupt: its SHA-256 is ${actual}, the manifest says ${file.sha256}; reinstall the model`,
          "model_corrupt",
        );
      }
    }
  }
  return { dir: abs, manifest };
}

/** Reads and validates `manifest.json` only (format, version, schema, layout). */
export async function readManifest(dir: string): Promise<Manifest> {
  const abs = resolve(dir);
  if (isPartialDirName(basename(abs))) {
    throw new UserError(
      `${abs} is an unfinished import (a .partial directory), not an installed model`,
      "model_not_installed",
    );
  }
  const manifestPath = join(abs, MANIFEST_FILE);
  let text: string;
  try {
    const st = await lstat(manifestPath);
    if (st.isSymbolicLink()) {
      throw new UserError(
        `${manifestPath} is a symbolic link; a model directory may not contain links`,
        "model_invalid",
      );
    }
    text = await readFile(manifestPath, "utf8");
  } catch (error) {
    if (error instanceof UserError) throw error;
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") {
      throw new UserError(
        `no model is installed at ${abs} (it has no ${MANIFEST_FILE})`,
        "model_not_installed",
      );
    }
    throw new UserError(`cannot read ${manifestPath}: ${(error as Error).message}`, "model_io");
  }
  return parseManifestText(text, manifestPath);
}

/**
 * Checks the text of a manifest (format, version, schema, layout) and returns it parsed; throws
 * a UserError naming `manifestPath` otherwise. Pure: no file is read (the fuzzers drive it).
 */
export function parseManifestText(text: string, manifestPath: string): Manifest {
  // The writer never emits a byte order mark; the native reader refuses one too.
  if (text.startsWith("\uFEFF")) {
    throw new UserError(
      `${manifestPath} starts with a byte order mark (BOM); the manifest is plain UTF-8 JSON`,
      "model_invalid",
    );
  }
  let json: unknown;
  try {
    // JSON.parse reads 1e400 as Infinity; like the native reader, call it what it is.
    json = JSON.parse(text, (key, value: unknown) => {
      if (typeof value === "number" && !Number.isFinite(value)) {
        throw new Error(`the number for "${key}" is out of range`);
      }
      return value;
    });
  } catch (error) {
    throw new UserError(
      `${manifestPath} is not valid JSON: ${(error as Error).message}`,
      "model_invalid",
    );
  }
  const head = (typeof json === "object" && json !== null ? json : {}) as Record<string, unknown>;
  if (head.format !== FORMAT_NAME) {
    throw new UserError(
      `${manifestPath} has format ${JSON.stringify(head.format)}; this Redwing reads ${JSON.stringify(FORMAT_NAME)}`,
      "model_unknown_format",
    );
  }
  if (head.format_version !== FORMAT_VERSION) {
    throw new UserError(
      `${manifestPath} has format_version ${JSON.stringify(head.format_version)}; this Redwing reads format_version ${FORMAT_VERSION} only; reimport the model with this version of Redwing or upgrade Redwing`,
      "model_unknown_version",
    );
  }
  const parsed = ManifestSchema.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues
      .slice(0, 5)
      .map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`)
      .join("; ");
    throw new UserError(`${manifestPath} is invalid: ${issues}`, "model_invalid");
  }
  const problems = checkManifestLayout(parsed.data);
  if (problems.length > 0) {
    const more = problems.length > 5 ? ` (and ${problems.length - 5} more)` : "";
    throw new UserError(
      `${manifestPath} is inconsistent: ${problems.slice(0, 5).join("; ")}${more}`,
      "model_invalid",
    );
  }
  return parsed.data;
}

/** Something in a model directory the format does not allow. */
export interface UnexpectedEntry {
  path: string;
  reason: string;
}

/**
 * Entries of `dir` that should not be there: symbolic links (listed or not), directories other
 * than experts/, special files and files the manifest does not list. Links are never followed.
 */
export async function unexpectedEntries(
  dir: string,
  manifest: Manifest,
): Promise<UnexpectedEntry[]> {
  const listed = new Set(manifest.files.map((f) => f.path));
  const out: UnexpectedEntry[] = [];
  const walk = async (rel: string): Promise<void> => {
    const entries = await readdir(join(dir, rel), { withFileTypes: true });
    for (const e of entries.sort((a, b) => a.name.localeCompare(b.name))) {
      const path = rel ? `${rel}/${e.name}` : e.name;
      if (e.isSymbolicLink()) {
        out.push({ path, reason: "is a symbolic link; a model directory may not contain links" });
      } else if (e.isDirectory()) {
        if (rel === "" && e.name === EXPERTS_DIR) await walk(path);
        else out.push({ path, reason: "is an unexpected directory" });
      } else if (!e.isFile()) {
        out.push({ path, reason: "is not a regular file" });
      } else if (path !== MANIFEST_FILE && !listed.has(path)) {
        out.push({
          path,
          reason: "is not listed in the manifest; a model directory holds only its listed files",
        });
      }
    }
  };
  await walk("");
  return out;
}

async function checkDirectoryContents(dir: string, manifest: Manifest): Promise<void> {
  const bad = (await unexpectedEntries(dir, manifest))[0];
  if (bad) throw new UserError(`${bad.path} in ${dir} ${bad.reason}`, "model_invalid");
  for (const file of manifest.files) {
    let size: number;
    try {
      size = (await lstat(join(dir, file.path))).size;
    } catch {
      throw new UserError(
        `${file.path} is missing from ${dir}; reinstall the model`,
        "model_incomplete",
      );
    }
    if (size !== file.size) {
      throw new UserError(
        `${file.path} in ${dir} has ${size} bytes, the manifest says ${file.size} (truncated or modified); reinstall the model`,
        "model_corrupt",
      );
    }
  }
}

export type FileStatus = "ok" | "missing" | "size" | "sha256" | "not_regular" | "unexpected";

export interface FileCheck {
  path: string;
  status: FileStatus;
  detail?: string;
}

/**
 * Rehashes every file the manifest lists and reports each one (for `redwing verify`). The
 * manifest itself must be readable and consistent; a bad file is reported, not thrown.
 */
export async function verifyModelFiles(
  dir: string,
  onFile?: (check: FileCheck) => void,
  onBytes?: (n: number) => void,
): Promise<{ manifest: Manifest; checks: FileCheck[] }> {
  const abs = resolve(dir);
  const manifest = await readManifest(abs);
  const checks: FileCheck[] = [];
  for (const file of manifest.files) {
    const path = join(abs, file.path);
    let check: FileCheck;
    try {
      const st = await lstat(path);
      if (!st.isFile()) {
        check = {
          path: file.path,
          status: "not_regular",
          detail: st.isSymbolicLink() ? "symbolic link" : "not a regular file",
        };
      } else if (st.size !== file.size) {
        check = {
          path: file.path,
          status: "size",
          detail: `${st.size} bytes, expected ${file.size}`,
        };
      } else {
        const actual = await sha256File(path, onBytes);
        check =
          actual === file.sha256
            ? { path: file.path, status: "ok" }
            : {
                path: file.path,
                status: "sha256",
                detail: `sha256 ${actual}, expected ${file.sha256}`,
              };
      }
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      check = { path: file.path, status: "missing" };
    }
    checks.push(check);
    onFile?.(check);
  }
  // Then whatever else is in the directory (listed links were reported above).
  const listed = new Set(manifest.files.map((f) => f.path));
  for (const extra of await unexpectedEntries(abs, manifest)) {
    if (listed.has(extra.path)) continue;
    const check: FileCheck = { path: extra.path, status: "unexpected", detail: extra.reason };
    checks.push(check);
    onFile?.(check);
  }
  return { manifest, checks };
}
