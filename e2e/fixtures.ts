/**
 * The `app` fixture: a running Redwing app with a fresh REDWING_HOME, the fake hub as
 * HF_ENDPOINT, and a page showing it.
 *
 * - web: `bin/redwing ui --no-open --port 0` as a child process; the `Redwing UI: <url>` line it
 *   prints gives the address and token; Debian's Chromium opens it. Calls made by the test
 *   itself (the engine's pid, a conversation's state) go over HTTP with that token.
 * - electron: Playwright's `_electron` on electron/dist/main.mjs through the ELECTRON helper's
 *   launcher (e2e/electron/launch.ts), with REDWING_USER_DATA inside the test's home; calls go
 *   through the page's `window.redwingBridge`. Skipped, with the reason, when there is no
 *   Electron binary (or no display for it).
 *
 * `restart()` stops the app (it must exit cleanly and take its engine with it) and starts it
 * again on the same data, for the persistence spec.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test as base, expect, type Browser, type Page, type TestInfo } from "@playwright/test";
import type { CallOutcome, Method, Params, Result } from "../core/app/api.ts";
import type { TestHub } from "../testkit/test-hub.ts";
import { electronExecutable, launchElectronApp } from "./electron/launch.ts";
import { ROOT, startE2eHub } from "./hub.ts";

export type Shell = "web" | "electron";

export const RESULTS = join(ROOT, "e2e", "results");
const START_TIMEOUT_MS = 120_000;
const STOP_TIMEOUT_MS = 20_000;

export interface RedwingApp {
  shell: Shell;
  /** The page showing the app (a new one after `restart()` in Electron). */
  readonly page: Page;
  home: string;
  /** A call to the app's backend, as the renderer makes it; throws on an AppError. */
  call<M extends Method>(method: M, params?: Params<M>): Promise<Result<M>>;
  /** Stops the app (asserting a clean exit) and starts it again on the same data. */
  restart(): Promise<void>;
  /** What the app process wrote (web mode: its stdout and stderr). */
  output(): string;
}

/** Whether a process is still running. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

function appEnv(home: string, hub: TestHub): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    REDWING_HOME: home,
    REDWING_USER_DATA: join(home, "electron-user-data"),
    HF_ENDPOINT: hub.url,
    BROWSER: "none",
  };
  // Downloads go to the fake hub only, without anyone's real credentials.
  delete env.HF_TOKEN;
  return env;
}

/** web mode: one `redwing ui` process. */
class WebProcess {
  readonly child: ChildProcess;
  url = "";
  log = "";
  private exited: Promise<number | null>;

  constructor(env: NodeJS.ProcessEnv) {
    this.child = spawn(
      process.execPath,
      [join(ROOT, "bin", "redwing"), "ui", "--no-open", "--port", "0"],
      { env, cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] },
    );
    this.child.stdout!.setEncoding("utf8");
    this.child.stderr!.setEncoding("utf8");
    this.child.stderr!.on("data", (chunk: string) => (this.log += chunk));
    this.exited = new Promise((resolve) =>
      this.child.on("exit", (code, signal) => resolve(signal ? null : code)),
    );
  }

  /** Waits for the `Redwing UI: <url>` line (exactly one line on stdout). */
  async started(): Promise<string> {
    let out = "";
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`redwing ui printed no address in ${START_TIMEOUT_MS} ms`)),
        START_TIMEOUT_MS,
      );
      this.child.stdout!.on("data", (chunk: string) => {
        out += chunk;
        this.log += chunk;
        const m = /^Redwing UI: (http:\/\/\S+)$/m.exec(out);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]!);
        }
      });
      void this.exited.then((code) => {
        clearTimeout(timer);
        reject(new Error(`redwing ui exited (status ${code}) before printing its address`));
      });
    });
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/#token=[0-9a-f]{32}$/);
    this.url = url;
    return url;
  }

  get origin(): string {
    return new URL(this.url).origin;
  }

  get token(): string {
    return new URL(this.url).hash.replace(/^#token=/, "");
  }

  /** SIGTERM, as Ctrl-C would; answers the exit status (null: it had to be killed). */
  async stop(): Promise<number | null> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return this.child.exitCode;
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), STOP_TIMEOUT_MS);
    const code = await this.exited;
    clearTimeout(timer);
    return code;
  }
}

async function webCall<M extends Method>(
  proc: WebProcess,
  method: M,
  params: Params<M> | undefined,
): Promise<Result<M>> {
  const res = await fetch(`${proc.origin}/api/call/${method}`, {
    method: "POST",
    headers: { authorization: `Bearer ${proc.token}`, "content-type": "application/json" },
    body: JSON.stringify(params ?? {}),
  });
  const outcome = (await res.json()) as CallOutcome<M>;
  if (!outcome.ok) throw new Error(`${method}: ${outcome.error.code}: ${outcome.error.message}`);
  return outcome.result;
}

interface Bridge {
  call(method: string, params: unknown): Promise<CallOutcome<Method>>;
}

async function electronCall<M extends Method>(
  page: Page,
  method: M,
  params: Params<M> | undefined,
): Promise<Result<M>> {
  const outcome = await page.evaluate(
    ([m, p]) => (window as unknown as { redwingBridge: Bridge }).redwingBridge.call(m, p),
    [method, params ?? {}] as const,
  );
  if (!outcome.ok) throw new Error(`${method}: ${outcome.error.code}: ${outcome.error.message}`);
  return outcome.result as Result<M>;
}

/** Collects console errors and CSP violations of a page (reported, and CSP ones fail the test). */
function watchConsole(page: Page, into: string[]): void {
  page.on("console", (msg) => {
    if (msg.type() === "error") into.push(msg.text());
  });
  page.on("pageerror", (error) => into.push(`page error: ${error.message}`));
  page.on("response", (response) => {
    if (response.status() >= 400) into.push(`HTTP ${response.status()} ${response.url()}`);
  });
}

async function startWebApp(
  home: string,
  hub: TestHub,
  browser: Browser,
  viewport: { width: number; height: number },
  testInfo: TestInfo,
  consoleErrors: string[],
): Promise<{ app: RedwingApp; close: () => Promise<void> }> {
  let proc = new WebProcess(appEnv(home, hub));
  const outputs: string[] = [];
  await proc.started();
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  watchConsole(page, consoleErrors);
  await page.goto(proc.url);
  const app: RedwingApp = {
    shell: "web",
    page,
    home,
    call: (method, params) => webCall(proc, method, params),
    output: () => [...outputs, proc.log].join("\n--- restart ---\n"),
    async restart() {
      const engine = await app.call("engine.status");
      const code = await proc.stop();
      outputs.push(proc.log);
      expect(code, `redwing ui exit status on SIGTERM; its output:\n${proc.log}`).toBe(0);
      if (engine.pid !== null) {
        await expect
          .poll(() => alive(engine.pid!), { message: "the engine stops with the app" })
          .toBe(false);
      }
      proc = new WebProcess(appEnv(home, hub));
      await proc.started();
      await page.goto(proc.url);
    },
  };
  return {
    app,
    close: async () => {
      await context.close();
      const code = await proc.stop();
      await testInfo.attach("redwing-ui.log", { body: app.output(), contentType: "text/plain" });
      expect(code, `redwing ui exit status on SIGTERM; its output:\n${proc.log}`).toBe(0);
    },
  };
}

async function startElectronApp(
  home: string,
  hub: TestHub,
  viewport: { width: number; height: number },
  consoleErrors: string[],
  testInfo: TestInfo,
): Promise<{ app: RedwingApp; close: () => Promise<void> }> {
  const userData = join(home, "electron-user-data");
  const launch = async (): Promise<{ close: () => Promise<void>; page: Page }> => {
    const launched = await launchElectronApp({ home, userData, env: { HF_ENDPOINT: hub.url } });
    if (!launched.ok) {
      testInfo.skip(true, `Electron: ${launched.reason}`);
      throw new Error(launched.reason); // not reached: skip() throws
    }
    await launched.page.setViewportSize(viewport);
    watchConsole(launched.page, consoleErrors);
    return launched;
  };
  let current = await launch();
  const app: RedwingApp = {
    shell: "electron",
    get page() {
      return current.page;
    },
    home,
    call: (method, params) => electronCall(current.page, method, params),
    output: () => "",
    async restart() {
      const engine = await app.call("engine.status");
      await current.close();
      if (engine.pid !== null) {
        await expect
          .poll(() => alive(engine.pid!), { message: "the engine stops with the app" })
          .toBe(false);
      }
      current = await launch();
    },
  };
  return { app, close: () => current.close() };
}

let electronSkipSaid = false;

export const test = base.extend<
  { shell: Shell; app: RedwingApp },
  { scratch: string; hub: TestHub }
>({
  shell: ["web", { option: true }],
  scratch: [
    // eslint-disable-next-line no-empty-pattern
    async ({}, use) => {
      const dir = await mkdtemp(join(tmpdir(), "redwing-e2e-"));
      await use(dir);
      await rm(dir, { recursive: true, force: true });
    },
    { scope: "worker" },
  ],
  hub: [
    async ({ scratch }, use) => {
      const hub = await startE2eHub(scratch);
      await use(hub);
      await hub.close();
    },
    { scope: "worker" },
  ],
  app: async ({ shell, hub, scratch, playwright, launchOptions, viewport }, use, testInfo) => {
    if (shell === "electron") {
      // Cheap checks first, so a machine without the binary skips before making anything.
      const found = electronExecutable();
      if ("reason" in found) {
        const why =
          `no Electron binary: ${found.reason}; npm ci runs with ELECTRON_SKIP_BINARY_DOWNLOAD=1 ` +
          "and `npm start` fetches it where there is network";
        // The list reporter does not show skip reasons: say it once.
        if (!electronSkipSaid) console.log(`[electron] skipped: ${why}`);
        electronSkipSaid = true;
        testInfo.skip(true, why);
      }
    }
    hub.faults.length = 0;
    const home = join(scratch, `home-${testInfo.testId}-${Date.now()}`);
    await mkdir(home, { recursive: true });
    const size = viewport ?? { width: 1280, height: 800 };
    const consoleErrors: string[] = [];
    let browser: Browser | null = null;
    let running: { app: RedwingApp; close: () => Promise<void> };
    if (shell === "web") {
      browser = await playwright.chromium.launch(launchOptions);
      running = await startWebApp(home, hub, browser, size, testInfo, consoleErrors);
    } else {
      running = await startElectronApp(home, hub, size, consoleErrors, testInfo);
    }
    try {
      await use(running.app);
      if (testInfo.status !== testInfo.expectedStatus) {
        const path = join(
          RESULTS,
          "failures",
          `${shell}-${testInfo.title.replace(/\W+/g, "-")}.png`,
        );
        await running.app.page.screenshot({ path }).catch(() => {});
        console.log(`failure screenshot: ${path}`);
      }
    } finally {
      await running.close();
      await browser?.close();
      if (consoleErrors.length > 0) {
        console.log(`page console errors:\n  ${consoleErrors.join("\n  ")}`);
        await testInfo.attach("console-errors.txt", {
          body: consoleErrors.join("\n"),
          contentType: "text/plain",
        });
      }
    }
    const csp = consoleErrors.filter((e) => /Content Security Policy/i.test(e));
    expect(csp, "the page broke its Content-Security-Policy").toEqual([]);
  },
});

export { expect };
