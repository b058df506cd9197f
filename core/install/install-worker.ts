/**
 * The worker-thread side of startInstallInWorker (isolated.ts): runs one install and reports
 * progress, then the result or the error, to the parent thread; a "cancel" message cancels it.
 */
import { parentPort, workerData } from "node:worker_threads";
import { startInstall, type InstallOptions, type InstallRequest } from "./installer.ts";
import type { WorkerReply } from "./isolated.ts";

const port = parentPort!;
const { request, options } = workerData as { request: InstallRequest; options: InstallOptions };
const post = (reply: WorkerReply): void => port.postMessage(reply);

const task = startInstall(request, {
  ...options,
  onProgress: (progress) => post({ type: "progress", progress }),
});
port.on("message", (message: { type: string }) => {
  if (message.type === "cancel") task.cancel();
});
try {
  post({ type: "result", result: await task.result });
} catch (error) {
  const e = error as { name?: unknown; message?: unknown; code?: unknown };
  post({
    type: "error",
    error: {
      name: typeof e?.name === "string" ? e.name : "Error",
      message: typeof e?.message === "string" ? e.message : String(error),
      code: typeof e?.code === "string" ? e.code : null,
    },
  });
} finally {
  port.close();
}
