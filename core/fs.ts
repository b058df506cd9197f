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
