/** Small file-system helpers shared across core. */
import { lstat, open, type FileHandle } from "node:fs/promises";

/** Whether something (a file, directory or link: not followed) is at `path`. */
export async function exists(path: string): Promise<boolean> {
  try {
    await lstat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Whether process `pid` on this machine is alive, for files a process leaves behind (locks,
 * partial imports): EPERM means it lives under another user.
 */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Makes a directory's entries (a rename, a new file) durable. */
export async function fsyncDir(path: string): Promise<void> {
  const handle = await open(path, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** Writes all of `data` at `position` (one write may take less than asked). */
export async function writeFully(
  handle: FileHandle,
  data: Uint8Array,
  position: number,
): Promise<void> {
  let done = 0;
  while (done < data.byteLength) {
    const { bytesWritten } = await handle.write(
      data,
      done,
      data.byteLength - done,
      position + done,
    );
    done += bytesWritten;
  }
}
