/**
 * Waiting on an install's own record instead of on the clock: the journal says when a range is
 * placed, which is what a resume reuses (progress counts bytes received, and with several ranges
 * in flight many bytes can arrive before any range is whole).
 */
import { installPaths } from "../core/install/installer.ts";
import { readJournal } from "../core/install/journal.ts";

/**
 * Resolves true once the install into `dest` has journaled a placed range, or false if `settled`
 * (the install itself) ends first.
 */
export async function waitForPlacedRange(
  dest: string,
  settled: Promise<unknown>,
): Promise<boolean> {
  let over = false;
  void settled.then(
    () => (over = true),
    () => (over = true),
  );
  const journal = installPaths(dest).journal;
  while (!over) {
    const read = await readJournal(journal);
    if (read?.entries.some((e) => "r" in e)) return true;
    await new Promise((r) => setTimeout(r, 5));
  }
  return false;
}
