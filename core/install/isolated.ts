/**
 * An install on a worker thread, for the app: the importer's work (parsing the checkpoint's
 * config and headers, planning, quantizing) then runs outside the app's own thread, under its own
 * heap limit. A checkpoint that makes that work run out of memory, or crash, ends its install
 * with a clear error; the app (its window, its engine, other downloads) carries on.
 *
 * From a checkout the worker runs the TypeScript source through tsx (ts-worker.mjs); the packaged
 * app runs electron/dist/install-worker.mjs, bundled next to main.mjs by scripts/build-electron.mjs.
 */
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
import { UserError } from "../errors.ts";
import type {
  InstallOptions,
  InstallProgress,
  InstallRequest,
  InstallResult,
} from "./installer.ts";

/** The worker's heap: far above what installing a real checkpoint needs (tens of MB). */
export const INSTALL_WORKER_HEAP_MB = 1024;

/** What the worker reports. */
export type WorkerReply =
  | { type: "progress"; progress: InstallProgress }
  | { type: "result"; result: InstallResult }
  | { type: "error"; error: { name: string; message: string; code: string | null } };

/** InstallOptions that can cross to a worker (no functions, no signal). */
export type IsolatedInstallOptions = Omit<InstallOptions, "signal" | "onProgress" | "testHooks"> & {
  onProgress?: (progress: InstallProgress) => void;
  /** The worker's heap limit in MiB (default INSTALL_WORKER_HEAP_MB). */
  heapLimitMb?: number;
};

/** Like InstallTask: the result, and cancel (the partial download is kept). */
export interface IsolatedInstallTask {
  readonly result: Promise<InstallResult>;
  cancel(): void;
}

/** The bundled worker next to the bundle that runs this code, when there is one. */
function bundledWorker(): URL | null {
  // `import.meta["url"]`: the bundle's own URL; scripts/build-electron.mjs rewrites only the
  // spelling `import.meta.url` (to the source file's place).
  const url = new URL("./install-worker.mjs", import.meta["url"]);
  return existsSync(fileURLToPath(url)) ? url : null;
}

function startWorker(data: unknown, heapMb: number): Worker {
  const resourceLimits = { maxOldGenerationSizeMb: heapMb };
  const bundled = bundledWorker();
  if (bundled) return new Worker(bundled, { workerData: data, resourceLimits });
  return new Worker(new URL("./ts-worker.mjs", import.meta.url), {
    workerData: {
      ...(data as object),
      entry: new URL("./install-worker.ts", import.meta.url).href,
    },
    resourceLimits,
  });
}

export function startInstallInWorker(
  request: InstallRequest,
  options: IsolatedInstallOptions = {},
): IsolatedInstallTask {
  const { onProgress, heapLimitMb, ...rest } = options;
  const worker = startWorker({ request, options: rest }, heapLimitMb ?? INSTALL_WORKER_HEAP_MB);
  let cancelled = false;
  const result = new Promise<InstallResult>((resolve, reject) => {
    let settled = false;
    const settle = (f: () => void): void => {
      if (settled) return;
      settled = true;
      f();
    };
    worker.on("message", (reply: WorkerReply) => {
      if (reply.type === "progress") onProgress?.(reply.progress);
      else if (reply.type === "result") settle(() => resolve(reply.result));
      else {
        const { name, message, code } = reply.error;
        const error =
          code !== null || name === "UserError"
            ? new UserError(message, code ?? "user_error")
            : new Error(message);
        settle(() => reject(error));
      }
    });
    worker.on("error", (error: Error & { code?: string }) => {
      settle(() =>
        reject(
          error.code === "ERR_WORKER_OUT_OF_MEMORY"
            ? new UserError(
                `installing ${request.repo} ran out of memory (the ${heapLimitMb ?? INSTALL_WORKER_HEAP_MB} MiB the installer may use); the checkpoint asks for far more than a real model needs`,
                "install_out_of_memory",
              )
            : new UserError(
                `the installer of ${request.repo} failed: ${error.message}`,
                "install_failed",
              ),
        ),
      );
    });
    worker.on("exit", (code) => {
      settle(() =>
        reject(
          cancelled
            ? new UserError("the install was cancelled", "interrupted")
            : new UserError(
                `the installer of ${request.repo} stopped unexpectedly (exit code ${code})`,
                "install_failed",
              ),
        ),
      );
    });
  });
  return {
    result,
    cancel() {
      cancelled = true;
      worker.postMessage({ type: "cancel" });
    },
  };
}
