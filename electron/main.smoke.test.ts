/**
 * The built main process, end to end, without the Electron binary: electron/dist/main.mjs runs in
 * Node with a recording stand-in for the `electron` module (testkit/electron/fake-electron.mjs)
 * and a driver playing the renderer (testkit/electron/smoke-driver.mjs). It checks what only the
 * whole main process shows: the bundle starts the real controller and engine on the demo model,
 * serves the renderer with its CSP, answers only the app's own frame, saves settings through
 * electron-store in the user data directory, sends the state when the renderer subscribes,
 * denies navigation, windows, webviews, permissions, network requests and downloads, and on quit
 * stops the engine before exiting. What it cannot check: Chromium itself (CSP enforcement, sandbox).
 */
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const SUPPORT = join(ROOT, "testkit", "electron");
const DIST = join(ROOT, "electron", "dist");
mkdirSync(DIST, { recursive: true });
// Under electron/dist (ignored by git and eslint), so that main.mjs resolves node_modules as
// the real bundle does.
const outDir = mkdtempSync(join(DIST, ".smoke-test-"));
const temp = mkdtempSync(join(tmpdir(), "redwing-electron-smoke-"));
const home = join(temp, "home");
const userData = join(temp, "user data");
const rendererDir = join(temp, "renderer");

interface Outcome {
  ok: boolean;
  result?: Record<string, unknown>;
  error?: { code: string; message: string };
}
interface Smoke {
  error?: string;
  loadedUrl: string;
  webPreferences: Record<string, unknown>;
  schemes: Array<{ scheme: string; privileges: Record<string, boolean> }>;
  sandboxEnabled: boolean;
  menuRoles: string[];
  index: { status: number; csp: string; body: string };
  traversal: number;
  info: Outcome;
  fromSubframe: Outcome;
  fromOtherContents: Outcome;
  fromOtherOrigin: Outcome;
  badParams: Outcome;
  update: Outcome;
  settingsFile: { sampling?: { temperature?: number } } | null;
  snapshot: string[];
  engine: { state: string; pid: number | null; model: string | null };
  navigation: Record<string, boolean>;
  windowOpen: Record<string, { action: string }>;
  opened: string[];
  permissions: Record<string, boolean>;
  requestCancelled: Record<string, boolean>;
  downloadPrevented: boolean;
}

let smoke: Smoke;
let exitCode: number | null = null;
let stderr = "";

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

beforeAll(async () => {
  mkdirSync(rendererDir, { recursive: true });
  writeFileSync(
    join(rendererDir, "index.html"),
    "<!doctype html><html><head><title>Redwing</title></head><body></body></html>",
  );
  const script = pathToFileURL(join(ROOT, "scripts", "build-electron.mjs")).href;
  const { buildElectron } = (await import(script)) as {
    buildElectron(o: { outDir: string }): Promise<{ main: string }>;
  };
  const { main } = await buildElectron({ outDir });

  const child = spawn(
    process.execPath,
    [
      "--import",
      pathToFileURL(join(SUPPORT, "register-fake-electron.mjs")).href,
      "--import",
      pathToFileURL(join(SUPPORT, "smoke-driver.mjs")).href,
      main,
    ],
    {
      cwd: ROOT,
      env: {
        ...process.env,
        REDWING_HOME: home,
        REDWING_USER_DATA: userData,
        REDWING_RENDERER_DIR: rendererDir,
        HF_ENDPOINT: "http://127.0.0.1:9", // nothing may be downloaded
      },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let stdout = "";
  child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  exitCode = await new Promise<number | null>((resolve) => child.on("close", resolve));
  const line = stdout.split("\n").find((l) => l.startsWith("SMOKE "));
  if (!line) throw new Error(`no SMOKE line (exit ${exitCode}):\n${stdout}\n${stderr}`);
  smoke = JSON.parse(line.slice("SMOKE ".length)) as Smoke;
  if (smoke.error) throw new Error(`driver failed: ${smoke.error}\n${stderr}`);
}, 150_000);

afterAll(() => {
  rmSync(outDir, { recursive: true, force: true });
  rmSync(temp, { recursive: true, force: true });
});

describe("electron main (bundle under a fake Electron)", () => {
  it("opens one sandboxed, isolated window on the app protocol", () => {
    expect(smoke.loadedUrl).toBe("app://redwing/index.html");
    expect(smoke.webPreferences).toMatchObject({
      contextIsolation: true,
      sandbox: true,
      nodeIntegration: false,
      webSecurity: true,
      webviewTag: false,
    });
    expect(String(smoke.webPreferences.preload)).toBe(
      join(ROOT, "electron", "dist", "preload.cjs"),
    );
    expect(smoke.sandboxEnabled).toBe(true);
    expect(smoke.schemes).toEqual([
      expect.objectContaining({
        scheme: "app",
        privileges: expect.objectContaining({ standard: true, secure: true }),
      }),
    ]);
    expect(smoke.schemes[0]!.privileges.bypassCSP).toBeFalsy();
    expect(smoke.menuRoles).toEqual(expect.arrayContaining(["editMenu", "viewMenu", "help"]));
  });

  it("serves the renderer with the CSP and refuses traversal", () => {
    expect(smoke.index.status).toBe(200);
    expect(smoke.index.csp).toContain("default-src 'none'");
    expect(smoke.index.body).toContain("<title>Redwing</title>");
    expect(smoke.traversal).toBe(403);
  });

  it("answers the app's frame with the real controller, and nobody else", () => {
    expect(smoke.info.ok).toBe(true);
    expect(smoke.info.result).toMatchObject({ shell: "electron", dataDir: userData });
    for (const outcome of [smoke.fromSubframe, smoke.fromOtherContents, smoke.fromOtherOrigin]) {
      expect(outcome).toMatchObject({ ok: false, error: { code: "forbidden" } });
    }
    expect(smoke.badParams).toMatchObject({ ok: false, error: { code: "bad_request" } });
  });

  it("saves settings with electron-store in the user data directory", () => {
    expect(smoke.update.ok).toBe(true);
    expect(smoke.settingsFile?.sampling?.temperature).toBe(0.7);
  });

  it("sends the current state when the renderer subscribes", () => {
    expect(smoke.snapshot.slice(0, 5)).toEqual([
      "redwing:event settings",
      "redwing:event models",
      "redwing:event engine",
      "redwing:event server",
      "redwing:event conversations",
    ]);
  });

  it("starts the engine on the demo model", () => {
    expect(smoke.engine).toMatchObject({ state: "ready", model: "demo" });
    expect(smoke.engine.pid).toBeGreaterThan(0);
  });

  it("denies navigation, new windows, webviews, permissions, requests and downloads", () => {
    expect(smoke.navigation).toEqual({
      external: true,
      inApp: false,
      file: true,
      redirect: true,
      webview: true,
    });
    expect(smoke.windowOpen).toEqual({ https: { action: "deny" }, file: { action: "deny" } });
    // http(s) links went to the browser; file: did not.
    expect(smoke.opened).toEqual(["https://example.com/page", "https://example.com/docs"]);
    expect(smoke.permissions).toEqual({
      media: false,
      clipboardWrite: true,
      clipboardRead: false,
    });
    expect(smoke.requestCancelled).toEqual({ https: true, app: false });
    expect(smoke.downloadPrevented).toBe(true);
  });

  it("stops the engine on quit, then exits cleanly", () => {
    expect(exitCode, stderr).toBe(0);
    // The first quit waited for the controller to close; the second one ended the app.
    const deferred = stderr.indexOf("[fake electron] quit deferred by before-quit");
    expect(deferred).toBeGreaterThanOrEqual(0);
    expect(stderr.indexOf("[fake electron] quitting")).toBeGreaterThan(deferred);
    expect(stderr).not.toContain("closing the engine");
    expect(alive(smoke.engine.pid!)).toBe(false);
  });
});
