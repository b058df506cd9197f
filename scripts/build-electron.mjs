#!/usr/bin/env node
// Bundles the Electron shell with esbuild (no Electron binary needed, well under a second):
// - electron/main.ts -> electron/dist/main.mjs: ESM for Electron's Node, our TypeScript (electron/
//   and core/) bundled in, every npm package left external (resolved from node_modules at run
//   time, so packages that locate their own files keep working; electron-builder ships the
//   production dependencies);
// - electron/preload.ts -> electron/dist/preload.cjs: CommonJS, because a sandboxed preload can
//   only `require("electron")`; everything else is inlined;
// - core/install/install-worker.ts -> electron/dist/install-worker.mjs: the installer's worker
//   thread (core/install/isolated.ts finds it next to main.mjs), built like main.mjs.
//
// `import.meta.url` in each bundled source is rewritten to the URL that source file has in the
// app (relative to the bundle), so core code that finds files next to itself (chat templates,
// the hash worker, package.json) finds them in the checkout and in app.asar alike.
import { mkdir, readFile } from "node:fs/promises";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { performance } from "node:perf_hooks";
import { build } from "esbuild";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
export const DEFAULT_OUT_DIR = join(ROOT, "electron", "dist");

/** esbuild plugin: per-source `import.meta.url`, relative to the bundle in `outDir`. */
function sourceUrlPlugin(outDir) {
  return {
    name: "redwing-source-url",
    setup(b) {
      b.onLoad({ filter: /\.[cm]?ts$/ }, async (args) => {
        if (args.path.split(sep).includes("node_modules")) return undefined;
        const source = await readFile(args.path, "utf8");
        if (!source.includes("import.meta.url")) return { contents: source, loader: "ts" };
        const rel = relative(outDir, args.path).split(sep).join("/");
        const expr = `new URL(${JSON.stringify(rel)}, import.meta.url).href`;
        return { contents: source.replaceAll("import.meta.url", expr), loader: "ts" };
      });
    },
  };
}

/**
 * Builds main.mjs, preload.cjs and install-worker.mjs into `outDir` (default electron/dist);
 * resolves with their paths. Throws with esbuild's messages on a compile error.
 */
export async function buildElectron({ outDir = DEFAULT_OUT_DIR } = {}) {
  await mkdir(outDir, { recursive: true });
  const main = join(outDir, "main.mjs");
  const preload = join(outDir, "preload.cjs");
  const installWorker = join(outDir, "install-worker.mjs");
  const common = { bundle: true, logLevel: "warning", legalComments: "none", charset: "utf8" };
  await Promise.all([
    build({
      ...common,
      entryPoints: [join(ROOT, "electron", "main.ts")],
      outfile: main,
      format: "esm",
      platform: "node",
      // Electron 45 runs Node 22 or later.
      target: "node22",
      packages: "external",
      plugins: [sourceUrlPlugin(outDir)],
    }),
    build({
      ...common,
      entryPoints: [join(ROOT, "core", "install", "install-worker.ts")],
      outfile: installWorker,
      format: "esm",
      platform: "node",
      target: "node22",
      packages: "external",
      plugins: [sourceUrlPlugin(outDir)],
    }),
    build({
      ...common,
      entryPoints: [join(ROOT, "electron", "preload.ts")],
      outfile: preload,
      format: "cjs",
      platform: "browser",
      target: "es2022",
      external: ["electron"],
    }),
  ]);
  return { main, preload, installWorker };
}

if (process.argv[1] && pathToFileURL(process.argv[1]).href === import.meta.url) {
  const started = performance.now();
  const { main, preload } = await buildElectron();
  const ms = Math.round(performance.now() - started);
  console.error(`[build-electron] ${relative(ROOT, main)}, ${relative(ROOT, preload)} (${ms} ms)`);
}
