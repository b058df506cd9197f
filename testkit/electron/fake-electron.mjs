// A stand-in for the `electron` module, for running electron/dist/main.mjs in plain Node (the
// Electron binary is not available everywhere): it implements the few APIs main.mjs and
// electron-store use and records what main does with them in `fake`, which a driver script
// (smoke-driver.mjs) inspects. Loaded through register-fake-electron.mjs. Test support only.
import { EventEmitter } from "node:events";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setImmediate } from "node:timers";

/** Everything main did, for the driver. */
export const fake = {
  schemes: [],
  protocolHandlers: new Map(),
  ipcHandlers: new Map(),
  ipcListeners: new Map(),
  windows: [],
  opened: [],
  shown: [],
  menu: null,
  sandboxEnabled: false,
  errors: [],
  session: {
    permissionRequest: null,
    permissionCheck: null,
    devicePermission: null,
    beforeRequest: null,
    events: new EventEmitter(),
  },
  /** Called with each window once main has asked it to load a URL. */
  onWindowLoad: null,
};

const paths = new Map();

class App extends EventEmitter {
  isPackaged = false;
  #ready = Promise.resolve();
  setPath(name, value) {
    paths.set(name, value);
  }
  getPath(name) {
    // Made on first use only: main normally sets userData from REDWING_USER_DATA first.
    if (name === "userData" && !paths.has(name)) {
      paths.set(name, mkdtempSync(join(tmpdir(), "redwing-fake-userdata-")));
    }
    if (!paths.has(name)) throw new Error(`fake electron: no path ${name}`);
    return paths.get(name);
  }
  getVersion() {
    return "0.0.0-fake";
  }
  getName() {
    return "Redwing";
  }
  getAppPath() {
    return process.cwd();
  }
  enableSandbox() {
    fake.sandboxEnabled = true;
  }
  requestSingleInstanceLock() {
    return true;
  }
  whenReady() {
    return this.#ready.then(() => new Promise((resolve) => setImmediate(resolve)));
  }
  /** Like Electron: before-quit may be prevented; otherwise the process ends. */
  quit() {
    let prevented = false;
    this.emit("before-quit", { preventDefault: () => (prevented = true) });
    if (prevented) {
      console.error("[fake electron] quit deferred by before-quit");
      return;
    }
    console.error("[fake electron] quitting");
    this.emit("will-quit", { preventDefault() {} });
    this.emit("quit");
    setImmediate(() => process.exit(0));
  }
  exit(code = 0) {
    process.exit(code);
  }
}
export const app = new App();

export const protocol = {
  registerSchemesAsPrivileged(schemes) {
    if (fake.protocolHandlers.size) throw new Error("schemes must be registered before ready");
    fake.schemes.push(...schemes);
  },
  handle(scheme, handler) {
    fake.protocolHandlers.set(scheme, handler);
  },
};

export const ipcMain = {
  handle(channel, fn) {
    if (fake.ipcHandlers.has(channel)) throw new Error(`second handler for ${channel}`);
    fake.ipcHandlers.set(channel, fn);
  },
  on(channel, fn) {
    const list = fake.ipcListeners.get(channel) ?? [];
    list.push(fn);
    fake.ipcListeners.set(channel, list);
  },
};

class WebContents extends EventEmitter {
  sent = [];
  windowOpenHandler = null;
  mainFrame = { url: "", parent: null };
  send(channel, payload) {
    // What IPC does: a copy (JSON is enough for AppEvents).
    this.sent.push([channel, JSON.parse(JSON.stringify(payload))]);
  }
  setWindowOpenHandler(handler) {
    this.windowOpenHandler = handler;
  }
}

export class BrowserWindow extends EventEmitter {
  #destroyed = false;
  constructor(options) {
    super();
    this.options = options;
    this.webContents = new WebContents();
    fake.windows.push(this);
    app.emit("web-contents-created", {}, this.webContents);
  }
  async loadURL(url) {
    this.webContents.mainFrame.url = url;
    this.loadedUrl = url;
    setImmediate(() => fake.onWindowLoad?.(this));
  }
  isDestroyed() {
    return this.#destroyed;
  }
  isMinimized() {
    return false;
  }
  restore() {}
  focus() {}
  show() {}
  close() {
    this.#destroyed = true;
    this.emit("closed");
  }
}

export const Menu = {
  buildFromTemplate(template) {
    return { template };
  },
  setApplicationMenu(menu) {
    fake.menu = menu;
  },
};

export const dialog = {
  showErrorBox(title, message) {
    fake.errors.push(`${title}: ${message}`);
    console.error(`[fake dialog] ${title}: ${message}`);
  },
};

export const powerMonitor = Object.assign(new EventEmitter(), {
  getCurrentThermalState: () => "nominal",
});

export const shell = {
  async openExternal(url) {
    fake.opened.push(url);
  },
  showItemInFolder(path) {
    fake.shown.push(path);
  },
  async openPath() {
    return "";
  },
};

export const session = {
  defaultSession: {
    setPermissionRequestHandler(fn) {
      fake.session.permissionRequest = fn;
    },
    setPermissionCheckHandler(fn) {
      fake.session.permissionCheck = fn;
    },
    setDevicePermissionHandler(fn) {
      fake.session.devicePermission = fn;
    },
    webRequest: {
      onBeforeRequest(fn) {
        fake.session.beforeRequest = fn;
      },
    },
    on(event, fn) {
      fake.session.events.on(event, fn);
    },
  },
};

/** A Linux desktop without a keyring: Electron's "basic_text" fallback, which main treats as none. */
export const safeStorage = {
  isEncryptionAvailable: () => true,
  getSelectedStorageBackend: () => "basic_text",
  encryptString: (plain) => Buffer.from(plain, "utf8"),
  decryptString: (sealed) => sealed.toString("utf8"),
};

export default {
  app,
  safeStorage,
  protocol,
  ipcMain,
  BrowserWindow,
  Menu,
  dialog,
  powerMonitor,
  shell,
  session,
  fake,
};
