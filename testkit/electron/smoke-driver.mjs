// Drives electron/dist/main.mjs under the fake Electron (fake-electron.mjs) once its window
// loads: plays the renderer and the user (calls, events, navigation, permissions, quit) and
// prints what happened as one `SMOKE {json}` line for electron/main.smoke.test.ts. Test support.
/* global Request */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout } from "node:timers";
import { app, fake } from "electron";

const results = {};

async function until(predicate, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const value = predicate();
    if (value) return value;
    await new Promise((r) => setTimeout(r, 50));
  }
  return null;
}

function prevented(emitter, event, details) {
  let was = false;
  emitter.emit(event, { ...details, preventDefault: () => (was = true) });
  return was;
}

fake.onWindowLoad = async (win) => {
  try {
    const wc = win.webContents;
    const appUrl = win.loadedUrl;
    results.loadedUrl = appUrl;
    results.webPreferences = win.options.webPreferences;
    results.schemes = fake.schemes;
    results.sandboxEnabled = fake.sandboxEnabled;
    results.menuRoles = fake.menu?.template.map((item) => item.role);

    const serve = fake.protocolHandlers.get("app");
    const index = await serve(new Request(appUrl));
    results.index = {
      status: index.status,
      csp: index.headers.get("content-security-policy"),
      body: await index.text(),
    };
    results.traversal = (await serve(new Request("app://redwing/..%2f..%2fpackage.json"))).status;

    const call = fake.ipcHandlers.get("redwing:call");
    const trusted = { sender: wc, senderFrame: { url: appUrl, parent: null } };
    results.info = await call(trusted, "app.info", {});
    results.fromSubframe = await call(
      { sender: wc, senderFrame: { url: appUrl, parent: {} } },
      "app.info",
      {},
    );
    results.fromOtherContents = await call(
      { sender: {}, senderFrame: { url: appUrl, parent: null } },
      "app.info",
      {},
    );
    results.fromOtherOrigin = await call(
      { sender: wc, senderFrame: { url: "https://evil.example/", parent: null } },
      "app.info",
      {},
    );
    results.badParams = await call(trusted, "settings.update", { sampling: { temperature: 9 } });
    results.update = await call(trusted, "settings.update", { sampling: { temperature: 0.7 } });
    const settingsFile = join(app.getPath("userData"), "settings.json");
    results.settingsFile = existsSync(settingsFile)
      ? JSON.parse(readFileSync(settingsFile, "utf8"))
      : null;

    // The renderer's first onEvent: the current state arrives, settings first.
    const sentBefore = wc.sent.length;
    for (const listener of fake.ipcListeners.get("redwing:subscribe") ?? []) listener(trusted);
    await until(
      () => wc.sent.slice(sentBefore).some(([, e]) => e.type === "conversations"),
      10_000,
    );
    results.snapshot = wc.sent.slice(sentBefore).map(([channel, e]) => `${channel} ${e.type}`);

    // The engine starts on the demo model in the background; wait for it to be usable.
    const ready = await until(() => {
      for (const [, e] of wc.sent) {
        if (e.type === "engine" && e.status.state === "ready" && e.status.pid) return e.status;
      }
      return null;
    }, 90_000);
    results.engine = ready ?? (await call(trusted, "engine.status", {}));

    results.navigation = {
      external: prevented(wc, "will-navigate", { url: "https://example.com/page" }),
      inApp: prevented(wc, "will-navigate", { url: "app://redwing/index.html#/chat" }),
      file: prevented(wc, "will-navigate", { url: "file:///etc/passwd" }),
      redirect: prevented(wc, "will-redirect", { url: "https://example.com/" }),
      webview: prevented(wc, "will-attach-webview", {}),
    };
    results.windowOpen = {
      https: wc.windowOpenHandler({ url: "https://example.com/docs" }),
      file: wc.windowOpenHandler({ url: "file:///etc/passwd" }),
    };
    results.opened = [...fake.opened];

    const permission = (name, url) =>
      new Promise((resolve) =>
        fake.session.permissionRequest(wc, name, resolve, { requestingUrl: url }),
      );
    results.permissions = {
      media: await permission("media", appUrl),
      clipboardWrite: await permission("clipboard-sanitized-write", appUrl),
      clipboardRead: await permission("clipboard-read", appUrl),
    };
    const request = (url) =>
      new Promise((resolve) => fake.session.beforeRequest({ url }, (r) => resolve(r.cancel)));
    results.requestCancelled = {
      https: await request("https://example.com/x.png"),
      app: await request("app://redwing/assets/x.js"),
    };
    results.downloadPrevented = prevented(fake.session.events, "will-download", {});
  } catch (error) {
    results.error = String(error?.stack ?? error);
  }
  console.log(`SMOKE ${JSON.stringify(results)}`);
  app.quit();
};
