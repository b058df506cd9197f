/**
 * Starts the desktop app for the e2e specs through Playwright's Electron support, isolated in
 * temporary directories, or says why it cannot (no Electron binary, as on machines without
 * network; no display; nothing built). The specs skip with that reason:
 *
 *   const launched = await launchElectronApp({ home });
 *   test.skip(!launched.ok, launched.ok ? "" : launched.reason);
 *   const { page } = launched; ...; await launched.close();
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { _electron, type ElectronApplication, type Page } from "@playwright/test";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const MAIN_BUNDLE = join(ROOT, "electron", "dist", "main.mjs");
const PRELOAD_BUNDLE = join(ROOT, "electron", "dist", "preload.cjs");
const RENDERER_INDEX = join(ROOT, "renderer", "dist", "index.html");

export type LaunchResult =
  | {
      ok: true;
      app: ElectronApplication;
      /** The app's window, loaded (DOMContentLoaded). */
      page: Page;
      /** The user data directory (settings.json, conversations/). */
      userData: string;
      /** Quits the app the way the user does (the engine is stopped first). */
      close(): Promise<void>;
    }
  | { ok: false; reason: string };

export interface LaunchOptions {
  /** REDWING_HOME: models (and the CLI's data) for this run. */
  home: string;
  /** The app's user data directory (default: a new temporary one); reuse it to test a restart. */
  userData?: string;
  /** More environment (HF_ENDPOINT of a fake hub, ...). */
  env?: Record<string, string>;
  /** Launch timeout (default 60 s). */
  timeoutMs?: number;
}

/**
 * The Electron executable, or why there is none. Never `require("electron")`: with the binary
 * missing that starts a blocking download.
 */
export function electronExecutable(): { path: string } | { reason: string } {
  const dir = join(ROOT, "node_modules", "electron");
  if (!existsSync(join(dir, "package.json")))
    return { reason: "the electron package is not installed" };
  let relative: string | null = null;
  try {
    relative = readFileSync(join(dir, "path.txt"), "utf8").trim();
  } catch {
    // never extracted
  }
  const override = process.env.ELECTRON_OVERRIDE_DIST_PATH;
  const path = override
    ? join(override, relative ?? (process.platform === "win32" ? "electron.exe" : "electron"))
    : relative
      ? join(dir, "dist", relative)
      : null;
  if (!path || !existsSync(path)) {
    return {
      reason:
        "the Electron binary is not installed (node_modules/electron/dist is missing: its " +
        "download needs github.com); `node node_modules/electron/install.js` fetches it",
    };
  }
  return { path };
}

/**
 * Chromium's Linux sandbox needs its setuid helper (owned by root, mode 4755) and refuses to run
 * as root; where either fails, Electron only starts with --no-sandbox (the renderer keeps
 * Electron's `sandbox: true` process model, without the OS-level confinement).
 */
function chromiumSandboxUsable(executable: string): boolean {
  if (process.platform !== "linux") return true;
  if (process.getuid?.() === 0) return false;
  try {
    const helper = statSync(join(dirname(executable), "chrome-sandbox"));
    return helper.uid === 0 && (helper.mode & 0o4000) !== 0;
  } catch {
    return false;
  }
}

function hasDisplay(): boolean {
  if (process.platform !== "linux") return true;
  return Boolean(process.env.DISPLAY || process.env.WAYLAND_DISPLAY);
}

/** Builds electron/dist when it is missing (a fraction of a second). */
function ensureBundle(): string | null {
  if (existsSync(MAIN_BUNDLE) && existsSync(PRELOAD_BUNDLE)) return null;
  const result = spawnSync(process.execPath, [join(ROOT, "scripts", "build-electron.mjs")], {
    encoding: "utf8",
  });
  return result.status === 0 ? null : `building electron/dist failed: ${result.stderr}`;
}

/** Launches the app on `electron/dist/main.mjs`, or answers why it cannot. */
export async function launchElectronApp(options: LaunchOptions): Promise<LaunchResult> {
  const executable = electronExecutable();
  if ("reason" in executable) return { ok: false, reason: executable.reason };
  if (!hasDisplay()) {
    return { ok: false, reason: "no display for Electron (set DISPLAY or run under xvfb-run)" };
  }
  if (!existsSync(RENDERER_INDEX)) {
    return { ok: false, reason: "renderer/dist is not built (npm run setup builds it)" };
  }
  const buildError = ensureBundle();
  if (buildError) return { ok: false, reason: buildError };

  const userData = options.userData ?? mkdtempSync(join(tmpdir(), "redwing-electron-"));
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined) env[k] = v;
  // Not a plain Node: a leftover ELECTRON_RUN_AS_NODE would make Electron ignore the app.
  delete env.ELECTRON_RUN_AS_NODE;
  Object.assign(env, options.env, { REDWING_HOME: options.home, REDWING_USER_DATA: userData });

  const app = await _electron.launch({
    executablePath: executable.path,
    args: [MAIN_BUNDLE],
    cwd: ROOT,
    env,
    chromiumSandbox: chromiumSandboxUsable(executable.path),
    timeout: options.timeoutMs ?? 60_000,
  });
  try {
    const page = await app.firstWindow();
    await page.waitForLoadState("domcontentloaded");
    return {
      ok: true,
      app,
      page,
      userData,
      close: async () => {
        await app.close();
      },
    };
  } catch (error) {
    await app.close().catch(() => {});
    throw error;
  }
}
