/** Test helper: a fresh, temporary REDWING_HOME for the tests of one file. */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface TempHome {
  /** The new home folder. */
  dir: string;
  /** Puts the previous REDWING_HOME back (or unsets it) and removes the folder. */
  leave(): Promise<void>;
}

/** Makes a temporary folder (its name starting with `prefix`) and points REDWING_HOME at it. */
export async function enterTempHome(prefix: string): Promise<TempHome> {
  const saved = process.env.REDWING_HOME;
  const dir = await mkdtemp(join(tmpdir(), prefix));
  process.env.REDWING_HOME = dir;
  return {
    dir,
    async leave() {
      if (saved === undefined) delete process.env.REDWING_HOME;
      else process.env.REDWING_HOME = saved;
      await rm(dir, { recursive: true, force: true });
    },
  };
}
