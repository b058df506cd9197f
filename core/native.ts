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

/**
 * Runs `argv` (a native executable, possibly wrapped, e.g. by a memory limiter) and resolves with
 * its stdout. stderr is shown as it comes with `inheritStderr`, else kept and put in the error
 * when the command fails.
 */
export function captureOutput(
  argv: string[],
  options: { inheritStderr?: boolean } = {},
): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(argv[0]!, argv.slice(1), {
      stdio: ["ignore", "pipe", options.inheritStderr ? "inherit" : "pipe"],
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout?.on("data", (chunk: Buffer) => out.push(chunk));
    child.stderr?.on("data", (chunk: Buffer) => err.push(chunk));
    child.on("error", reject);
    child.on("close", (code, signal) =>
      code === 0
        ? resolvePromise(Buffer.concat(out).toString("utf8"))
        : reject(
            new Error(
              `${argv.join(" ").slice(0, 200)} exited with ${code ?? signal}${err.length ? `: ${Buffer.concat(err).toString("utf8")}` : ""}`,
            ),
          ),
    );
  });
}
