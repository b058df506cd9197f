/** File-system helpers of the installer. */
import { randomBytes } from "node:crypto";
import { open, rename, rm, type FileHandle } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { UserError } from "../errors.ts";
import { checkDestination } from "../format/writer.ts";
import { exists } from "../fs.ts";

export async function fsyncDir(path: string): Promise<void> {
  const h = await open(path, "r");
  try {
    await h.sync();
  } finally {
    await h.close();
  }
}

/** Reads `buf.length` bytes at `position`; past the end of the file reads zeros. */
export async function readFully(h: FileHandle, buf: Buffer, position: number): Promise<void> {
  let done = 0;
  while (done < buf.length) {
    const { bytesRead } = await h.read(buf, done, buf.length - done, position + done);
    if (bytesRead === 0) {
      buf.fill(0, done);
      return;
    }
    done += bytesRead;
  }
}

export async function writeFully(h: FileHandle, data: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < data.byteLength) {
    const { bytesWritten } = await h.write(data, done, data.byteLength - done, position + done);
    done += bytesWritten;
  }
}

/** A full disk becomes a UserError that says the partial install is kept and what to do. */
export function mapWriteError(error: unknown, where: string, staging: string): unknown {
  const code = (error as NodeJS.ErrnoException)?.code;
  if (code === "ENOSPC" || code === "EDQUOT") {
    return new UserError(
      `no space left on the disk while writing ${where}. The partial install is kept in ${staging}: free some space and run the same command again to resume, or run it with --discard-partial to remove it`,
      "no_space",
    );
  }
  return error;
}

/**
 * Renames the finished directory to `dest`. An old model (with --force) is first moved aside
 * under the writer's `.old-` name, so a crash in between leaves it where removeLeftovers
 * (core/format/writer.ts) puts it back.
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
