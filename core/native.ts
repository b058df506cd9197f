/**
 * Finding and running the native executables (native/build by default; the environment
 * variable REDWING_NATIVE_BUILD names another build directory).
 */
import { spawn } from "node:child_process";
import { statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { UserError } from "./errors.ts";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** The native build directory: $REDWING_NATIVE_BUILD (relative to the working directory) or native/build. */
export function nativeBuildDir(): string {
  const override = process.env.REDWING_NATIVE_BUILD;
  return override ? resolve(override) : join(ROOT, "native", "build");
}

/** The path of a native executable; a UserError saying how to build it when it is missing. */
export function nativeBinary(name: string): string {
  const file = process.platform === "win32" ? `${name}.exe` : name;
  const path = join(nativeBuildDir(), file);
  let isFile: boolean;
  try {
    isFile = statSync(path).isFile();
  } catch {
    isFile = false;
  }
  if (!isFile) {
    throw new UserError(
      `the native engine is not built (${path} is missing); run \`npm run build:native\``,
      "native_missing",
    );
  }
  return path;
}

/**
 * Runs a native executable with the caller's stdin, stdout and stderr, and resolves with its exit
 * status (a signal counts as status 1).
 */
export function runNative(name: string, args: string[]): Promise<number> {
  const binary = nativeBinary(name);
  return new Promise((resolvePromise, reject) => {
    const child = spawn(binary, args, { stdio: "inherit" });
    child.on("error", (error) =>
      reject(new UserError(`cannot run ${binary}: ${error.message}`, "native_failed")),
    );
    child.on("close", (code) => resolvePromise(code ?? 1));
  });
}
