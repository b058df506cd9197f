/**
 * An install lock: `<lock path>` created with O_EXCL and holding the owner's pid and host. A
 * lock whose owner process is gone (killed, crashed, the machine rebooted) is stale and taken
 * over; a live owner makes a second installer stop with a message that names it.
 */
import { hostname } from "node:os";
import { open, readFile, rename, unlink } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import { UserError } from "../errors.ts";
import { pidAlive } from "../fs.ts";

interface LockInfo {
  pid: number;
  host: string;
  started: string;
}

async function readInfo(path: string): Promise<LockInfo | null> {
  try {
    const info = JSON.parse(await readFile(path, "utf8")) as LockInfo;
    return typeof info.pid === "number" ? info : null;
  } catch {
    return null;
  }
}

export interface InstallLock {
  release(): Promise<void>;
}

/** Takes the lock at `path` or throws a UserError naming the installer that holds it. */
export async function acquireLock(path: string, what: string): Promise<InstallLock> {
  const me: LockInfo = { pid: process.pid, host: hostname(), started: new Date().toISOString() };
  for (let attempt = 0; attempt < 8; attempt++) {
    try {
      const handle = await open(path, "wx");
      try {
        await handle.writeFile(JSON.stringify(me));
        await handle.sync();
      } finally {
        await handle.close();
      }
      let released = false;
      return {
        async release() {
          if (released) return;
          released = true;
          const info = await readInfo(path);
          if (info?.pid === me.pid && info.host === me.host)
            await unlink(path).catch(() => undefined);
        },
      };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
    const info = await readInfo(path);
    if (info === null && attempt < 3) {
      // Possibly an installer between creating the file and writing it: look again shortly.
      await new Promise((r) => setTimeout(r, 100));
      continue;
    }
    if (info && info.host === me.host && info.pid !== me.pid && pidAlive(info.pid)) {
      throw new UserError(
        `another installer (pid ${info.pid}, started ${info.started}) is installing ${what}; wait for it to finish, or stop it (if no installer is running, delete ${path})`,
        "install_locked",
      );
    }
    if (info && info.host !== me.host) {
      throw new UserError(
        `${what} is being installed from another machine (${info.host}, pid ${info.pid}); if that is not so, delete ${path}`,
        "install_locked",
      );
    }
    if (info && info.pid === me.pid) {
      throw new UserError(`${what} is already being installed by this process`, "install_locked");
    }
    // Stale (owner gone) or unreadable (a writer killed between create and write): move it
    // aside under a unique name, then check that what we moved is what we judged stale.
    const aside = `${path}.stale-${process.pid}-${randomBytes(4).toString("hex")}`;
    try {
      await rename(path, aside);
    } catch {
      continue;
    }
    const moved = await readInfo(aside);
    if (moved && info && moved.pid !== info.pid) {
      // Someone else took the lock in between: put theirs back.
      await rename(aside, path).catch(() => undefined);
      continue;
    }
    await unlink(aside).catch(() => undefined);
  }
  throw new UserError(`could not take the install lock ${path}`, "install_locked");
}
