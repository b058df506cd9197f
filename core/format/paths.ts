/** Path rules of the model format: relative, `/`-separated, and inside the directory. */

/**
 * True for a path like `weights.bin` or `experts/layer_000.bin`: relative, `/`-separated, no
 * empty, `.` or `..` components, no backslashes or NUL, not absolute (also not `C:`-style).
 */
export function isSafeRelativePath(path: string): boolean {
  if (path.length === 0 || path.length > 4096) return false;
  if (path.includes("\\") || path.includes("\0")) return false;
  if (path.startsWith("/") || /^[A-Za-z]:/.test(path)) return false;
  return path.split("/").every((part) => part !== "" && part !== "." && part !== "..");
}

/** Name of the temporary directory a writer uses next to `<parent>/<name>`. */
export function partialDirName(name: string, pid: number, random: string): string {
  return `.${name}.partial-${pid}-${random}`;
}

/** Matches partial (`.partial-`) and replaced (`.old-`) directories left by a writer. */
export const LEFTOVER_DIR_RE = /^\.(.+)\.(partial|old)-(\d+)-([0-9a-f]+)$/;

/** True when a directory name is a writer's temporary directory, which is never a model. */
export function isPartialDirName(name: string): boolean {
  return LEFTOVER_DIR_RE.test(name);
}
