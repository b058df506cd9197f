import type { Download } from "../core/app/api.ts";

/**
 * A download card as the app announces it: `taskId` downloading, 10 of 100 bytes done. Tests
 * override the fields they are about.
 */
export function runningDownload(taskId: string, over: Partial<Download> = {}): Download {
  return {
    taskId,
    ref: `owner/${taskId}`,
    name: taskId,
    state: "running",
    phase: "downloading",
    bytesDone: 10,
    bytesTotal: 100,
    rate: null,
    etaSeconds: null,
    file: null,
    note: null,
    error: null,
    ...over,
  };
}
