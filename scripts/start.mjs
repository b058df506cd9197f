#!/usr/bin/env node
// `npm start` (after scripts/setup.mjs): opens the Redwing desktop app in Electron. Where the
// Electron binary is missing (the npm package is installed without it, see setup.mjs) it tries
// to fetch it once; without it, or without a display, or with REDWING_WEB=1, it runs web mode
// instead: `redwing ui`, which prints the address (and opens a browser where there is one) and
// serves until Ctrl-C.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const electronDir = join(root, "node_modules", "electron");
const mainBundle = join(root, "electron", "dist", "main.mjs");
/** Marks a failed download, so a machine without network does not wait for it every start. */
const attemptMarker = join(root, "node_modules", ".cache", "redwing", "electron-download-attempt");
const RETRY_AFTER_MS = 24 * 3600 * 1000;
const DOWNLOAD_TIMEOUT_MS = 5 * 60 * 1000;

function log(message) {
  console.error(`[start] ${message}`);
}

/**
 * The Electron executable when it is installed, else null. Not `require("electron")`: that
 * starts a blocking download when the binary is missing.
 */
function electronBinary() {
  const override = process.env.ELECTRON_OVERRIDE_DIST_PATH;
  let relative = null;
  try {
    relative = readFileSync(join(electronDir, "path.txt"), "utf8").trim();
  } catch {
    // no path.txt: the binary was never extracted
  }
  if (override) {
    const p = join(
      override,
      relative ?? (process.platform === "win32" ? "electron.exe" : "electron"),
    );
    return existsSync(p) ? p : null;
  }
  if (!relative) return null;
  const p = join(electronDir, "dist", relative);
  return existsSync(p) ? p : null;
}

/** Whether github.com (where Electron's binaries are) answers within `ms`. */
function canReachGithub(ms = 3000) {
  return new Promise((resolve) => {
    const socket = connect({ host: "github.com", port: 443 });
    const done = (ok) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(ms, () => done(false));
    socket.once("connect", () => done(true));
    socket.once("error", () => done(false));
  });
}

async function tryDownloadElectron() {
  if (!existsSync(join(electronDir, "install.js"))) return "the electron package is not installed";
  try {
    if (Date.now() - statSync(attemptMarker).mtimeMs < RETRY_AFTER_MS) {
      return "an earlier download failed (retried a day later; delete node_modules/.cache/redwing to retry now)";
    }
  } catch {
    // never tried
  }
  if (!(await canReachGithub())) return "no network to download it";
  log("downloading Electron's binary (once)...");
  const result = spawnSync(process.execPath, [join(electronDir, "install.js")], {
    cwd: electronDir,
    stdio: "inherit",
    timeout: DOWNLOAD_TIMEOUT_MS,
  });
  if (result.status === 0 && electronBinary()) return null;
  mkdirSync(dirname(attemptMarker), { recursive: true });
  writeFileSync(attemptMarker, new Date().toISOString());
  return result.error?.code === "ETIMEDOUT" ? "its download timed out" : "its download failed";
}

/** Runs `command` in the foreground until it exits; Ctrl-C goes to it (it shuts down cleanly). */
function runForeground(command, args) {
  const child = spawn(command, args, { stdio: "inherit", cwd: root });
  // The terminal sends SIGINT to the whole process group: let the child handle it and wait.
  const forward = (signal) => () => {
    if (signal !== "SIGINT") child.kill(signal);
  };
  process.on("SIGINT", forward("SIGINT"));
  process.on("SIGTERM", forward("SIGTERM"));
  process.on("SIGHUP", forward("SIGHUP"));
  child.on("error", (error) => {
    log(`could not run ${command}: ${error.message}`);
    process.exit(1);
  });
  child.on("exit", (code, signal) => process.exit(code ?? (signal === "SIGINT" ? 0 : 1)));
}

async function whyNotElectron() {
  if (process.env.REDWING_WEB === "1") return "REDWING_WEB=1";
  const headless =
    process.platform === "linux" && !process.env.DISPLAY && !process.env.WAYLAND_DISPLAY;
  if (!electronBinary()) {
    // Without a display the binary would be of no use: do not fetch it.
    if (headless) return "Electron's binary is not installed and there is no display to show it";
    const why = await tryDownloadElectron();
    if (why) return `Electron's binary is not installed (${why})`;
  }
  if (headless) return "there is no display for Electron (DISPLAY and WAYLAND_DISPLAY are unset)";
  if (!existsSync(mainBundle)) {
    return "the Electron shell is not built (electron/dist/main.mjs is missing: run npm run setup)";
  }
  return null;
}

const why = await whyNotElectron();
if (why === null) {
  log("opening the Redwing desktop app (Electron)");
  runForeground(electronBinary(), [mainBundle]);
} else {
  log(`${why}: opening web mode (Ctrl-C stops it)`);
  runForeground(process.execPath, [join(root, "bin", "redwing"), "ui"]);
}
