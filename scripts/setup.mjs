#!/usr/bin/env node
// Bootstraps a checkout: Debian packages, npm packages, the native build, the app's renderer
// (renderer/dist) and Electron shell (electron/dist). Each step checks first and does nothing
// when everything is already in place, so `npm test` and `npm start` stay fast on a machine that
// is set up.
//
// Flags: --native-only (Debian packages and the native build), --chromium (also Debian's
// Chromium, which the end-to-end tests drive; scripts/test.mjs asks for it, `npm start` does not),
// --sanitizers (only: clang and its sanitizer/libFuzzer runtime, and the AddressSanitizer +
// UndefinedBehaviorSanitizer build of the native tests and fuzz targets in native/build-asan;
// scripts/test.mjs and `npm run fuzz` ask for it), --packages-only (only the Debian packages of
// the other flags: scripts/test.mjs installs the sanitizer build's in the foreground, where sudo
// can ask for a password, before it starts that build in the background).
//
// On a fresh clone the native build runs while `npm ci` and the renderer's build do (they are
// mostly one core and the network, and share nothing with it), which saves most of their time.
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  existsSync,
  lstatSync,
  readFileSync,
  readdirSync,
  realpathSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const nativeOnly = process.argv.includes("--native-only");
const withChromium = process.argv.includes("--chromium");
const sanitizersOnly = process.argv.includes("--sanitizers");
const packagesOnly = process.argv.includes("--packages-only");

// Debian packages the build and the tests need (package name -> why).
const debianPackages = {
  cmake: "native build",
  make: "native build",
  "g++": "native build",
  "doctest-dev": "C++ unit tests",
  "nlohmann-json3-dev": "JSON in the native engine",
  "clang-format": "C++ formatting check",
  "glslang-tools": "GPU kernels: GLSL compute -> SPIR-V (glslangValidator)",
  "libvulkan-dev": "GPU backend: the Vulkan loader and headers",
  "mesa-vulkan-drivers": "GPU backend tests: lavapipe, Mesa's software Vulkan device",
  "vulkan-tools": "GPU diagnostics (vulkaninfo)",
  "spirv-cross":
    "GPU kernels: SPIR-V -> Metal Shading Language (metal-kernels/, scripts/metal-kernels.mjs)",
};
// Only with --chromium: a browser for the end-to-end tests (Playwright drives /usr/bin/chromium).
const testDebianPackages = { chromium: "end-to-end tests (Playwright)" };
// Only with --sanitizers: clang with libFuzzer and the sanitizer runtimes (Debian 12: clang 14).
const sanitizerDebianPackages = {
  clang: "sanitizer build and fuzzing (libFuzzer)",
  "libclang-rt-14-dev": "libFuzzer and the sanitizer runtimes for clang 14",
};

function log(message) {
  console.error(`[setup] ${message}`);
}

function run(command, args, options = {}) {
  const result = spawnSync(command, args, { stdio: "inherit", cwd: root, ...options });
  if (result.status !== 0) {
    throw new Error(`${command} ${args.join(" ")} failed with exit status ${result.status}`);
  }
}

function isInstalled(pkg) {
  try {
    const status = execFileSync("dpkg-query", ["-W", "-f=${Status}", pkg], {
      stdio: ["ignore", "pipe", "ignore"],
    }).toString();
    return status.includes("install ok installed");
  } catch {
    return false;
  }
}

function ensureDebianPackages() {
  if (!existsSync("/usr/bin/dpkg-query")) {
    log(
      "not a Debian system: make sure cmake, a C++20 compiler, doctest and nlohmann-json are installed",
    );
    return;
  }
  const wanted = sanitizersOnly
    ? sanitizerDebianPackages
    : { ...debianPackages, ...(withChromium ? testDebianPackages : {}) };
  const missing = Object.keys(wanted).filter((pkg) => !isInstalled(pkg));
  if (missing.length === 0) return;
  log(`installing Debian packages: ${missing.join(", ")}`);
  const asRoot = process.getuid?.() === 0 ? [] : ["sudo"];
  const apt = (...args) =>
    asRoot.length ? run("sudo", ["apt-get", ...args]) : run("apt-get", args);
  apt("update", "-qq");
  apt("install", "-y", "-qq", "--no-install-recommends", ...missing);
}

function ensureNodeModules() {
  // Keyed by the lock file's content, not its mtime: a fresh checkout or worktree gives the lock
  // file a new mtime, and `npm ci` must not wipe a node_modules that already matches it.
  const lockHash = createHash("sha256")
    .update(readFileSync(join(root, "package-lock.json")))
    .digest("hex");
  const marker = join(root, "node_modules", ".redwing-lock-sha256");
  if (existsSync(marker) && readFileSync(marker, "utf8").trim() === lockHash) return;
  // A node_modules that links to an install shared by several checkouts (git worktrees): npm ci
  // would empty the install every other checkout uses (through the link) before replacing the
  // link with a directory of its own. Say so instead of doing it.
  const modules = join(root, "node_modules");
  if (existsSync(modules) && lstatSync(modules).isSymbolicLink()) {
    log(
      `node_modules links to a shared install (${realpathSync(modules)}) whose lock-file marker does not match: not running npm ci through the link; run it in the checkout that owns the install`,
    );
    return;
  }
  log("installing npm packages (npm ci)");
  // The electron package's postinstall downloads a ~100 MB binary from GitHub, which fails
  // without network; `npm start` fetches it later when it can (and falls back to web mode).
  run("npm", ["ci", "--no-audit", "--no-fund"], {
    env: { ...process.env, ELECTRON_SKIP_BINARY_DOWNLOAD: "1" },
  });
  writeFileSync(marker, `${lockHash}\n`);
}

/** The newest modification time under `paths` (files or directories), skipping `skip` names. */
function newestMtime(paths, skip = new Set(["node_modules", "dist"])) {
  let newest = 0;
  const visit = (path) => {
    let st;
    try {
      st = statSync(path);
    } catch {
      return; // vanished or never there
    }
    if (!st.isDirectory()) {
      newest = Math.max(newest, st.mtimeMs);
      return;
    }
    for (const entry of readdirSync(path)) {
      if (!skip.has(entry) && !entry.startsWith(".")) visit(join(path, entry));
    }
  };
  for (const p of paths) visit(join(root, p));
  return newest;
}

function mtimeOf(path) {
  try {
    return statSync(join(root, path)).mtimeMs;
  } catch {
    return 0;
  }
}

/** renderer/dist: rebuilt with Vite when the renderer or the API contract changed. */
function ensureRenderer() {
  if (!existsSync(join(root, "renderer", "vite.config.ts"))) return;
  const built = mtimeOf("renderer/dist/index.html");
  const sources = newestMtime(["renderer", "core/app/api.ts", "package-lock.json"]);
  if (built >= sources) return;
  log("building the app's interface (renderer/dist)");
  run(process.execPath, [
    join(root, "node_modules", "vite", "bin", "vite.js"),
    "build",
    "--config",
    "renderer/vite.config.ts",
    // Rollup's warnings about dependencies' comments are not actionable here.
    "--logLevel",
    "error",
  ]);
}

/** electron/dist: the bundled main process and preload (esbuild, under a second). */
function ensureElectronShell() {
  if (!existsSync(join(root, "scripts", "build-electron.mjs"))) return;
  // main.mjs bundles electron/ and core/ (the controller, engine client, installer, server).
  const built = Math.min(mtimeOf("electron/dist/main.mjs"), mtimeOf("electron/dist/preload.cjs"));
  const sources = newestMtime([
    "electron",
    "core",
    "scripts/build-electron.mjs",
    "package-lock.json",
  ]);
  if (built >= sources) return;
  log("building the Electron shell (electron/dist)");
  run(process.execPath, ["scripts/build-electron.mjs"]);
}

/** A child process as a promise of its exit; throws (rejects) unless it exits with 0. */
function runAsync(command, args, options = {}) {
  const child = spawn(command, args, { stdio: "inherit", cwd: root, ...options });
  const done = new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code, signal) =>
      code === 0
        ? resolve()
        : reject(
            new Error(`${command} ${args.join(" ")} failed with exit status ${code ?? signal}`),
          ),
    );
  });
  return { child, done };
}

/** Configures native/build when it is new, then builds it; answers when the build is done. */
async function ensureNativeBuild(whileBuilding = () => {}) {
  const build = join(root, "native", "build");
  if (!existsSync(join(build, "CMakeCache.txt"))) {
    log("configuring the native build (Release)");
    run(
      "cmake",
      [
        "-S",
        "native",
        "-B",
        "native/build",
        "-DCMAKE_BUILD_TYPE=Release",
        // The engine and tools at Release's -O3; the test sources (doctest cases) at -O1, which
        // compiles them in half the time and runs them as fast (the time is in the engine).
        "-DREDWING_TEST_OPTIMIZATION=-O1",
      ],
      { stdio: ["ignore", "ignore", "inherit"] },
    );
  }
  // An up-to-date build returns in well under a second.
  const compile = runAsync("cmake", ["--build", "native/build", "--parallel", "2"], {
    stdio: ["ignore", process.env.REDWING_VERBOSE_BUILD ? "inherit" : "ignore", "inherit"],
  });
  try {
    whileBuilding();
  } catch (error) {
    compile.child.kill("SIGTERM");
    compile.done.catch(() => {}); // the first failure is the one to report
    throw error;
  }
  await compile.done;
}

/**
 * native/build-asan: the engine, its doctest binary and the libFuzzer targets with
 * AddressSanitizer and UndefinedBehaviorSanitizer (clang, -O1). Only what the tests and fuzzers
 * run is built, to keep `npm test` short.
 */
function ensureSanitizerBuild() {
  const build = join(root, "native", "build-asan");
  if (!existsSync(join(build, "CMakeCache.txt"))) {
    log("configuring the sanitizer build (native/build-asan: clang, ASan + UBSan, libFuzzer)");
    run(
      "cmake",
      [
        "-S",
        "native",
        "-B",
        "native/build-asan",
        "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g",
        // The test sources at -O0 (a third of -O1's compile time; sanitizer checks are the
        // same), the engine code they and the fuzzers run at -O1.
        "-DREDWING_TEST_OPTIMIZATION=-O0",
        "-DCMAKE_CXX_COMPILER=clang++",
        "-DREDWING_FUZZ=ON",
      ],
      { stdio: ["ignore", "ignore", "inherit"] },
    );
  }
  const targets = ["redwing_tests", "fuzz_manifest", "fuzz_protocol", "fuzz_routing_trace"];
  run("cmake", ["--build", "native/build-asan", "--parallel", "2", "--target", ...targets], {
    stdio: ["ignore", process.env.REDWING_VERBOSE_BUILD ? "inherit" : "ignore", "inherit"],
  });
}

try {
  ensureDebianPackages();
  if (packagesOnly) process.exit(0);
  if (sanitizersOnly) {
    ensureSanitizerBuild();
    process.exit(0);
  }
  await ensureNativeBuild(() => {
    if (nativeOnly) return;
    ensureNodeModules();
    ensureRenderer();
    ensureElectronShell();
  });
} catch (error) {
  log(`failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
}
