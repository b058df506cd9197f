/** Small file-system helpers shared across core. */
import { lstat } from "node:fs/promises";

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
