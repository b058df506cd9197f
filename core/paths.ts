/**
 * Where Redwing keeps its data on this machine. `REDWING_HOME` overrides everything (tests,
 * portable installs, a model folder on an external disk); otherwise the per-user data
 * directory of the platform:
 *
 * - Linux and other Unix: `$XDG_DATA_HOME/redwing`, default `~/.local/share/redwing`
 * - macOS: `~/Library/Application Support/Redwing`
 * - Windows: `%LOCALAPPDATA%\Redwing`, default `~\AppData\Local\Redwing`
 *
 * Installed models live in `<data dir>/models/<name>`.
 */
import { homedir } from "node:os";
import { isAbsolute, join, resolve } from "node:path";

type Env = Record<string, string | undefined>;

/** Redwing's per-user data directory (absolute). */
export function dataDir(
  env: Env = process.env,
  platform: NodeJS.Platform = process.platform,
  home: string = homedir(),
): string {
  const override = env.REDWING_HOME;
  if (override !== undefined && override !== "") return resolve(override);
  if (platform === "darwin") return join(home, "Library", "Application Support", "Redwing");
  if (platform === "win32") {
    const local = env.LOCALAPPDATA;
    return join(local && isAbsolute(local) ? local : join(home, "AppData", "Local"), "Redwing");
  }
  // The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
  const xdg = env.XDG_DATA_HOME;
  return join(xdg && isAbsolute(xdg) ? xdg : join(home, ".local", "share"), "redwing");
}

/** The directory that holds installed models. */
export function modelsDir(
  env: Env = process.env,
  platform: NodeJS.Platform = process.platform,
  home: string = homedir(),
): string {
  return join(dataDir(env, platform, home), "models");
}
