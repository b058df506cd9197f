#!/usr/bin/env node
// Bootstraps a checkout: Debian packages, npm packages and the native build.
// Each step checks first and does nothing when everything is already in place,
// so `npm test` and `npm start` stay fast on a machine that is set up.
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const nativeOnly = process.argv.includes("--native-only");

// Debian packages the build and the tests need (package name -> why).
const debianPackages = {
  cmake: "native build",
  make: "native build",
  "g++": "native build",
  "doctest-dev": "C++ unit tests",
  "nlohmann-json3-dev": "JSON in the native engine",
  "clang-format": "C++ formatting check",
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
  const missing = Object.keys(debianPackages).filter((pkg) => !isInstalled(pkg));
  if (missing.length === 0) return;
  log(`installing Debian packages: ${missing.join(", ")}`);
  const asRoot = process.getuid?.() === 0 ? [] : ["sudo"];
  const apt = (...args) =>
    asRoot.length ? run("sudo", ["apt-get", ...args]) : run("apt-get", args);
  apt("update", "-qq");
  apt("install", "-y", "-qq", "--no-install-recommends", ...missing);
}

function ensureNodeModules() {
  const lock = join(root, "package-lock.json");
  const marker = join(root, "node_modules", ".package-lock.json");
  if (existsSync(marker) && statSync(marker).mtimeMs >= statSync(lock).mtimeMs) return;
  log("installing npm packages (npm ci)");
  run("npm", ["ci", "--no-audit", "--no-fund"]);
}

function ensureNativeBuild() {
  const build = join(root, "native", "build");
  if (!existsSync(join(build, "CMakeCache.txt"))) {
    log("configuring the native build (Release)");
    run("cmake", ["-S", "native", "-B", "native/build", "-DCMAKE_BUILD_TYPE=Release"], {
      stdio: ["ignore", "ignore", "inherit"],
    });
  }
  // An up-to-date build returns in well under a second.
  run("cmake", ["--build", "native/build", "--parallel", "2"], {
    stdio: ["ignore", process.env.REDWING_VERBOSE_BUILD ? "inherit" : "ignore", "inherit"],
  });
}

try {
  ensureDebianPackages();
  if (!nativeOnly) ensureNodeModules();
  ensureNativeBuild();
} catch (error) {
  log(`failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
}
