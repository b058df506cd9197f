/**
 * A model directory with no weights in it: the manifest an install would write (from
 * layout-from-config.ts) and its data files as sparse files of their exact sizes (no disk blocks
 * used). The engine's memory plan (the decode service's `plan` request) reads nothing but the
 * manifest and the file sizes, so asking it about a skeleton gives the figure it will give for
 * the installed model: discovery shows a search result's memory that way, with the engine's own
 * formula rather than a copy of it.
 */
import { createHash } from "node:crypto";
import { mkdir, open, readdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { MANIFEST_FILE, type Manifest } from "../format/manifest.ts";

/** Skeletons kept under one root before it is emptied (each is a few kB on disk). */
export const MAX_SKELETONS = 64;

/**
 * The skeleton directory for `manifest` under `root` (made once per distinct manifest, then
 * reused). Returns its path.
 */
export async function writeSkeleton(root: string, manifest: Manifest): Promise<string> {
  const json = JSON.stringify(manifest, null, 1) + "\n";
  const key = createHash("sha256").update(json).digest("hex").slice(0, 24);
  const dir = join(root, key);
  try {
    await stat(join(dir, MANIFEST_FILE));
    return dir;
  } catch {
    // not made yet
  }
  await mkdir(root, { recursive: true });
  const existing = (await readdir(root)).filter((n) => !n.startsWith("."));
  if (existing.length >= MAX_SKELETONS) {
    for (const name of existing) await rm(join(root, name), { recursive: true, force: true });
  }
  const staging = join(root, `.${key}.${process.pid}.${Date.now()}`);
  await mkdir(staging, { recursive: true });
  try {
    for (const f of manifest.files) {
      const path = join(staging, f.path);
      await mkdir(dirname(path), { recursive: true });
      const h = await open(path, "w");
      try {
        await h.truncate(f.size);
      } finally {
        await h.close();
      }
    }
    await writeFile(join(staging, MANIFEST_FILE), json);
    await rename(staging, dir).catch(async (error: unknown) => {
      // Another search made the same skeleton first: use that one.
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== "ENOTEMPTY" && code !== "EEXIST") throw error;
      await rm(staging, { recursive: true, force: true });
    });
  } catch (error) {
    await rm(staging, { recursive: true, force: true });
    throw error;
  }
  return dir;
}
