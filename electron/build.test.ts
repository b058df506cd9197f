/**
 * scripts/build-electron.mjs: the bundles it writes are what Electron loads, so they are checked
 * as files (no Electron binary here): main.mjs is valid ESM whose every import is a Node builtin,
 * electron, or a production dependency (what electron-builder ships); preload.cjs requires only
 * electron and, run against a stand-in for it, exposes exactly the bridge of the contract.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { builtinModules } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { runInNewContext } from "node:vm";
import { Worker } from "node:worker_threads";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
  dependencies: Record<string, string>;
};

const DIST = join(ROOT, "electron", "dist");
mkdirSync(DIST, { recursive: true });
// Under electron/dist (ignored by git and eslint), so that main.mjs resolves node_modules as
// the real bundle does.
const outDir = mkdtempSync(join(DIST, ".build-test-"));
let main = "";
let preload = "";
let installWorker = "";
let buildMs = 0;

beforeAll(async () => {
  const script = pathToFileURL(join(ROOT, "scripts", "build-electron.mjs")).href;
  const { buildElectron } = (await import(script)) as {
    buildElectron(o: {
      outDir: string;
    }): Promise<{ main: string; preload: string; installWorker: string }>;
  };
  const started = performance.now();
  const out = await buildElectron({ outDir });
  buildMs = performance.now() - started;
  main = readFileSync(out.main, "utf8");
  preload = readFileSync(out.preload, "utf8");
  installWorker = readFileSync(out.installWorker, "utf8");
}, 60_000);
afterAll(() => rmSync(outDir, { recursive: true, force: true }));

/** Module specifiers of static imports, re-exports and dynamic imports with a literal. */
function importSpecifiers(code: string): string[] {
  const found = new Set<string>();
  const patterns = [
    /^\s*import\s[^;]*?from\s*["']([^"']+)["']/gm,
    /^\s*import\s*["']([^"']+)["']/gm,
    /^\s*export\s[^;]*?from\s*["']([^"']+)["']/gm,
    /\bimport\(\s*["']([^"']+)["']\s*\)/g,
  ];
  for (const re of patterns) for (const m of code.matchAll(re)) found.add(m[1]!);
  return [...found];
}

function packageName(specifier: string): string {
  const parts = specifier.split("/");
  return specifier.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0]!;
}

describe("build-electron", () => {
  it("is quick", () => {
    expect(buildMs).toBeLessThan(5000);
  });

  it("writes main.mjs as ESM that Node parses", () => {
    expect(main).toMatch(/^import\s[^;]*?\sfrom\s*"electron";?$/m);
    expect(main).not.toMatch(/\brequire\(\s*["']electron["']\s*\)/);
    const check = spawnSync(process.execPath, ["--check", join(outDir, "main.mjs")], {
      encoding: "utf8",
    });
    expect(check.status, check.stderr).toBe(0);
  });

  it("imports only builtins, electron and production dependencies", () => {
    const specifiers = importSpecifiers(main);
    expect(specifiers).toContain("electron");
    expect(specifiers).toContain("electron-store");
    const builtins = new Set(builtinModules);
    for (const s of specifiers) {
      if (s === "electron" || s.startsWith("node:") || builtins.has(s)) continue;
      expect(s.startsWith("."), `relative import ${s} left in the bundle`).toBe(false);
      expect(Object.keys(pkg.dependencies), `${s} is not a production dependency`).toContain(
        packageName(s),
      );
    }
  });

  it("writes the installer's worker (install-worker.mjs) as ESM with only shipped imports", () => {
    const check = spawnSync(process.execPath, ["--check", join(outDir, "install-worker.mjs")], {
      encoding: "utf8",
    });
    expect(check.status, check.stderr).toBe(0);
    const builtins = new Set(builtinModules);
    for (const s of importSpecifiers(installWorker)) {
      if (s.startsWith("node:") || builtins.has(s)) continue;
      expect(s.startsWith("."), `relative import ${s} left in the bundle`).toBe(false);
      expect(s.endsWith(".ts"), `TypeScript import ${s}`).toBe(false);
      expect(Object.keys(pkg.dependencies), `${s} is not a production dependency`).toContain(
        packageName(s),
      );
    }
    // main.mjs finds it next to itself (core/install/isolated.ts reads import.meta["url"]).
    expect(main).toMatch(/new URL\("\.\/install-worker\.mjs", import\.meta\["url"\]\)/);
  });

  it("the bundled installer worker runs and reports an install's error to its parent", async () => {
    const worker = new Worker(join(outDir, "install-worker.mjs"), {
      workerData: {
        request: { repo: "test/x", dest: join(outDir, "no-model") },
        options: {
          env: { HF_ENDPOINT: "http://127.0.0.1:9" },
          hub: { retry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 1, maxRetryAfterMs: 1 } },
        },
      },
    });
    const reply = await new Promise<{ type: string; error?: { code: string | null } }>(
      (resolve, reject) => {
        worker.on("message", (m: { type: string }) => m.type !== "progress" && resolve(m));
        worker.once("error", reject);
      },
    );
    await worker.terminate();
    expect(reply).toMatchObject({ type: "error", error: { code: "network" } });
  });

  it("keeps the window's security settings and no TypeScript imports", () => {
    expect(main).not.toMatch(/nodeIntegration\w*:\s*true/);
    expect(main).toMatch(/contextIsolation:\s*true/);
    expect(main).toMatch(/sandbox:\s*true/);
    expect(main).toMatch(/webSecurity:\s*true/);
    expect(importSpecifiers(main).filter((s) => s.endsWith(".ts"))).toEqual([]);
  });

  it("points each source's import.meta.url at that source, relative to the bundle", () => {
    const urls = [...main.matchAll(/new URL\(("[^"]+"), import\.meta\.url\)\.href/g)].map(
      (m) => JSON.parse(m[1]!) as string,
    );
    // main.ts itself, core/native.ts and core/version.ts at least.
    expect(urls.length).toBeGreaterThanOrEqual(3);
    for (const rel of urls) {
      const file = resolve(outDir, rel);
      expect(file.startsWith(ROOT), rel).toBe(true);
      expect(existsSync(file), `${rel} -> ${file}`).toBe(true);
    }
    const files = urls.map((rel) => resolve(outDir, rel));
    expect(files).toContain(join(ROOT, "electron", "main.ts"));
    expect(files).toContain(join(ROOT, "core", "models", "gemma4.ts"));
  });
});

describe("preload.cjs", () => {
  it("requires nothing but electron", () => {
    const required = [...preload.matchAll(/\brequire\(\s*["']([^"']+)["']\s*\)/g)].map((m) => m[1]);
    expect(required).toEqual(["electron"]);
    expect(preload).not.toMatch(/\bimport\s*\(|^\s*import\s/m);
  });

  /** Runs the bundle as a sandboxed preload would, against a recording stand-in for electron. */
  function loadPreload() {
    const exposed: Array<[string, unknown]> = [];
    const invoked: unknown[][] = [];
    const sent: unknown[][] = [];
    const onHandlers = new Map<string, (...args: unknown[]) => void>();
    const electron = {
      contextBridge: { exposeInMainWorld: (key: string, api: unknown) => exposed.push([key, api]) },
      ipcRenderer: {
        invoke: (...args: unknown[]) => {
          invoked.push(args);
          return Promise.resolve({ ok: true, result: "answer" });
        },
        send: (...args: unknown[]) => sent.push(args),
        on: (channel: string, fn: (...args: unknown[]) => void) => onHandlers.set(channel, fn),
      },
    };
    const errors: unknown[] = [];
    const module = { exports: {} };
    runInNewContext(preload, {
      require: (name: string) => {
        if (name !== "electron") throw new Error(`preload required ${name}`);
        return electron;
      },
      module,
      exports: module.exports,
      console: { error: (...args: unknown[]) => errors.push(args) },
    });
    return { exposed, invoked, sent, onHandlers, errors };
  }

  it("exposes exactly { shell, call, onEvent } as redwingBridge, frozen", async () => {
    const { exposed, invoked } = loadPreload();
    expect(exposed.map(([key]) => key)).toEqual(["redwingBridge"]);
    const bridge = exposed[0]![1] as {
      shell: string;
      call(m: unknown, p: unknown): Promise<unknown>;
      onEvent(cb: unknown): () => void;
    };
    expect(Object.keys(bridge).sort()).toEqual(["call", "onEvent", "shell"]);
    expect(Object.isFrozen(bridge)).toBe(true);
    expect(bridge.shell).toBe("electron");

    expect(await bridge.call("chat.get", { id: "c1" })).toEqual({ ok: true, result: "answer" });
    expect(invoked).toEqual([["redwing:call", "chat.get", { id: "c1" }]]);
    await expect(bridge.call(42, {})).rejects.toThrow(/string/);
    expect(invoked).toHaveLength(1);
  });

  it("delivers events to listeners, asks for the state once, and unsubscribes", () => {
    const { exposed, sent, onHandlers, errors } = loadPreload();
    const bridge = exposed[0]![1] as { onEvent(cb: (e: unknown) => void): () => void };
    const a: unknown[] = [];
    const b: unknown[] = [];
    const offA = bridge.onEvent((e) => a.push(e));
    bridge.onEvent(() => {
      throw new Error("broken listener");
    });
    bridge.onEvent((e) => b.push(e));
    expect(sent).toEqual([["redwing:subscribe"]]);

    const deliver = onHandlers.get("redwing:event")!;
    deliver({}, { type: "live" });
    expect(a).toEqual([{ type: "live" }]);
    expect(b).toEqual([{ type: "live" }]); // after the broken one
    expect(errors).toHaveLength(1);

    offA();
    deliver({}, { type: "server" });
    expect(a).toHaveLength(1);
    expect(b).toHaveLength(2);
    expect(() => bridge.onEvent("nope" as never)).toThrow(/needs a function/);
  });
});
