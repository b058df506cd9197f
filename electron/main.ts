/**
 * Redwing's Electron main process: one app controller (engine client, installer, server) behind a
 * single sandboxed window. The policy lives in pure modules tested without Electron: security.ts
 * (CSP, navigation, external links, permissions, request filter, path confinement), protocol.ts
 * (the `app://redwing/` file server), ipc.ts (call validation, event delivery, bounded close).
 *
 * Bundled by scripts/build-electron.mjs to electron/dist/main.mjs (ESM; `import.meta.url` of every
 * bundled source keeps pointing at that source's place in the app, so `..` below is the app root:
 * the checkout, or app.asar when packaged).
 *
 * Environment: REDWING_USER_DATA moves the user data directory (settings, conversations,
 * Chromium state; e2e points it at a temporary directory); REDWING_HOME moves the models as for
 * the CLI; REDWING_NATIVE_BUILD / REDWING_SERVICE_BINARY pick the engine like the CLI does;
 * REDWING_RENDERER_DIR serves another renderer build (checkout only).
 */
import { existsSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import {
  BrowserWindow,
  Menu,
  app,
  dialog,
  ipcMain,
  powerMonitor,
  protocol,
  safeStorage,
  session,
  shell,
  type IpcMainEvent,
  type IpcMainInvokeEvent,
  type MenuItemConstructorOptions,
  type WebContents,
} from "electron";
import Store from "electron-store";
import { createAppController } from "../core/app/controller.ts";
import { openSettingsStore } from "../core/app/settings.ts";
import { CALL_CHANNEL, EVENT_CHANNEL, SUBSCRIBE_CHANNEL } from "./channels.ts";
import { EventPump, closeWithin, handleCall } from "./ipc.ts";
import { createAppProtocolHandler } from "./protocol.ts";
import {
  APP_INDEX_URL,
  APP_SCHEME,
  isAllowedNavigation,
  isAllowedRequest,
  isPermissionAllowed,
  isSafeExternalUrl,
  isTrustedSender,
} from "./security.ts";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
/** The built renderer; REDWING_RENDERER_DIR replaces it in a checkout only (tests, a dev build). */
const RENDERER_DIR =
  !app.isPackaged && process.env.REDWING_RENDERER_DIR
    ? resolve(process.env.REDWING_RENDERER_DIR)
    : join(ROOT, "renderer", "dist");
const PRELOAD = join(ROOT, "electron", "dist", "preload.cjs");
/** How long quitting waits for the controller (engine stop, server close) before giving up. */
const CLOSE_TIMEOUT_MS = 8_000;

type Controller = Awaited<ReturnType<typeof createAppController>>;

/**
 * Connections' API keys sealed by the OS keychain (docs/remote.md). On Linux without a keyring
 * Electron falls back to "basic_text", a fixed key that protects nothing: that counts as no
 * keychain, and the keys go to the 0600 file instead, which says what it is.
 */
function keychain() {
  return {
    isAvailable: () =>
      safeStorage.isEncryptionAvailable() &&
      (process.platform !== "linux" || safeStorage.getSelectedStorageBackend() !== "basic_text"),
    encrypt: (plain: string) => safeStorage.encryptString(plain),
    decrypt: (sealed: Buffer) => safeStorage.decryptString(sealed),
  };
}

// ---- before ready: paths, scheme, sandbox, single instance -----------------------------------

if (process.env.REDWING_USER_DATA) {
  app.setPath("userData", resolve(process.env.REDWING_USER_DATA));
}
// Packaged, electron-builder puts the native executables in <resources>/bin (extraResources);
// core/native.ts and findServiceBinary look in $REDWING_NATIVE_BUILD before the checkout's build.
if (app.isPackaged && !process.env.REDWING_NATIVE_BUILD) {
  process.env.REDWING_NATIVE_BUILD = join(process.resourcesPath, "bin");
}

// A standard, secure scheme: the page gets a real origin (`app://redwing`) for CSP 'self', module
// scripts and the clipboard permission; it bypasses nothing (no bypassCSP).
protocol.registerSchemesAsPrivileged([
  {
    scheme: APP_SCHEME,
    privileges: { standard: true, secure: true, supportFetchAPI: true, corsEnabled: true },
  },
]);
app.enableSandbox();

let controller: Controller | null = null;
let mainWindow: BrowserWindow | null = null;
let pump: EventPump | null = null;
let quitState: "running" | "closing" | "closed" = "running";
let thermalState: string | null = null;

if (!app.requestSingleInstanceLock()) {
  // Another Redwing owns this user data directory (and its engine): it gets focused instead.
  app.exit(0);
} else {
  app.on("second-instance", () => {
    if (!mainWindow) return;
    if (mainWindow.isMinimized()) mainWindow.restore();
    mainWindow.focus();
  });
  app.on("web-contents-created", (_event, contents) => hardenContents(contents));
  // One window: closing it ends the app on every platform (the engine holds gigabytes of memory;
  // it should not linger in the dock with no window).
  app.on("window-all-closed", () => app.quit());
  app.on("before-quit", (event) => {
    if (quitState === "closed" || !controller) return;
    event.preventDefault();
    if (quitState === "closing") return;
    quitState = "closing";
    const closing = controller;
    void closeWithin(() => closing.close(), CLOSE_TIMEOUT_MS).then((outcome) => {
      if (outcome !== "closed") console.error(`redwing: closing the engine ${outcome}`);
      quitState = "closed";
      app.quit();
    });
  });
  for (const signal of ["SIGINT", "SIGTERM"] as const) process.on(signal, () => app.quit());
  app.whenReady().then(start).catch(fail);
}

// ---- startup -------------------------------------------------------------------------------

async function start(): Promise<void> {
  if (!existsSync(join(RENDERER_DIR, "index.html"))) {
    fail(
      new Error(`the interface is not built (${RENDERER_DIR} is missing): run \`npm run setup\``),
    );
    return;
  }
  configureSession();
  protocol.handle(APP_SCHEME, createAppProtocolHandler(RENDERER_DIR));
  Menu.setApplicationMenu(buildMenu());
  if (process.platform === "darwin") {
    const initial = powerMonitor.getCurrentThermalState();
    thermalState = initial === "unknown" ? null : initial;
    powerMonitor.on("thermal-state-change", (details) => {
      thermalState = details.state === "unknown" ? null : details.state;
    });
  }

  const dataDir = app.getPath("userData");
  // The same schema, defaults, migrations and corrupt-file recovery as web mode's conf store
  // (settingsStoreOptions), kept by electron-store in <userData>/settings.json.
  const settings = openSettingsStore(
    dataDir,
    (options) => new Store({ ...options, name: options.configName }),
  );
  if (settings.recoveredFrom) {
    console.error(`redwing: unreadable settings kept as ${settings.recoveredFrom}: defaults used`);
  }
  controller = await createAppController({
    shell: "electron",
    dataDir,
    settingsStore: settings.store,
    reveal: (path: string) => shell.showItemInFolder(path),
    saveFile: async (suggestedName: string, content: string) => {
      const options = { defaultPath: join(app.getPath("documents"), suggestedName) };
      const choice = mainWindow
        ? await dialog.showSaveDialog(mainWindow, options)
        : await dialog.showSaveDialog(options);
      if (choice.canceled || !choice.filePath) return null;
      await writeFile(choice.filePath, content, "utf8");
      return choice.filePath;
    },
    thermal: () => thermalState,
    secretBox: keychain(),
  });

  ipcMain.handle(CALL_CHANNEL, (event, method: unknown, params: unknown) =>
    handleCall(requireController(), method, params, appSenderUrl(event)),
  );
  ipcMain.on(SUBSCRIBE_CHANNEL, (event) => {
    if (isTrustedSender(appSenderUrl(event))) void pump?.resync();
  });

  createWindow();
}

function requireController(): Controller {
  if (!controller) throw new Error("the app is still starting");
  return controller;
}

function fail(error: unknown): void {
  const message = error instanceof Error ? error.message : String(error);
  console.error(`redwing: ${message}`);
  dialog.showErrorBox("Redwing could not start", message);
  app.exit(1);
}

function createWindow(): void {
  const window = new BrowserWindow({
    width: 1280,
    height: 860,
    minWidth: 760,
    minHeight: 560,
    title: "Redwing",
    show: false,
    webPreferences: {
      preload: PRELOAD,
      contextIsolation: true,
      sandbox: true,
      nodeIntegration: false,
      nodeIntegrationInWorker: false,
      nodeIntegrationInSubFrames: false,
      webSecurity: true,
      allowRunningInsecureContent: false,
      webviewTag: false,
      navigateOnDragDrop: false,
      spellcheck: false,
      devTools: !app.isPackaged,
    },
  });
  mainWindow = window;
  pump = new EventPump(
    requireController(),
    (event) => {
      if (!window.isDestroyed()) window.webContents.send(EVENT_CHANNEL, event);
    },
    (error) => console.error("redwing: event delivery failed:", error),
  );
  window.once("ready-to-show", () => window.show());
  let lastReload = 0;
  window.webContents.on("render-process-gone", (_event, details) => {
    console.error(`redwing: the window's renderer ended (${details.reason})`);
    // The engine and the data live in main: a reload brings the interface back (not in a loop).
    if (details.reason === "clean-exit" || window.isDestroyed()) return;
    if (Date.now() - lastReload < 10_000) return;
    lastReload = Date.now();
    void window.loadURL(APP_INDEX_URL);
  });
  window.on("closed", () => {
    pump?.close();
    pump = null;
    mainWindow = null;
  });
  void window.loadURL(APP_INDEX_URL);
}

/**
 * The URL of the frame that sent an IPC message when it is the top frame of the app's window;
 * null for anything else (another window, a subframe, a destroyed window).
 */
function appSenderUrl(event: IpcMainInvokeEvent | IpcMainEvent): string | null {
  const window = mainWindow;
  const frame = event.senderFrame;
  if (!window || window.isDestroyed() || event.sender !== window.webContents) return null;
  if (!frame || frame.parent !== null) return null;
  return frame.url;
}

// ---- hardening -------------------------------------------------------------------------------

/** Every web contents (the window, and anything that might appear later) gets the same rules. */
function hardenContents(contents: WebContents): void {
  const denyNavigation = (event: { preventDefault(): void }, url: string): void => {
    if (isAllowedNavigation(url)) return;
    event.preventDefault();
    // A link in a reply (markdown) goes to the user's browser, never into the app's window.
    if (isSafeExternalUrl(url)) void shell.openExternal(url);
  };
  contents.on("will-navigate", (event) => denyNavigation(event, event.url));
  contents.on("will-frame-navigate", (event) => {
    if (!isAllowedNavigation(event.url)) event.preventDefault();
  });
  contents.on("will-redirect", (event) => {
    if (!isAllowedNavigation(event.url)) event.preventDefault();
  });
  contents.on("will-attach-webview", (event) => event.preventDefault());
  contents.setWindowOpenHandler(({ url }) => {
    if (isSafeExternalUrl(url)) void shell.openExternal(url);
    return { action: "deny" };
  });
}

function configureSession(): void {
  const ses = session.defaultSession;
  ses.setPermissionRequestHandler((_contents, permission, callback, details) =>
    callback(isPermissionAllowed(permission, details.requestingUrl)),
  );
  ses.setPermissionCheckHandler((_contents, permission, origin, details) =>
    isPermissionAllowed(permission, details.requestingUrl ?? origin),
  );
  ses.setDevicePermissionHandler(() => false);
  // No network and no file:// for the page, whatever its CSP says.
  ses.webRequest.onBeforeRequest((details, callback) =>
    callback({ cancel: !isAllowedRequest(details.url) }),
  );
  ses.on("will-download", (event) => event.preventDefault());
}

function buildMenu(): Menu {
  const mac = process.platform === "darwin";
  const template: MenuItemConstructorOptions[] = [
    ...(mac ? [{ role: "appMenu" } as const] : []),
    { role: "fileMenu" },
    { role: "editMenu" },
    { role: "viewMenu" },
    { role: "windowMenu" },
    {
      role: "help",
      submenu: [
        {
          label: "Show Data Folder",
          click: () => void shell.openPath(app.getPath("userData")),
        },
      ],
    },
  ];
  return Menu.buildFromTemplate(template);
}
