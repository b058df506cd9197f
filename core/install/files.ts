/** File-system helpers of the installer. */
import type { FileHandle } from "node:fs/promises";
import { UserError } from "../errors.ts";

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
