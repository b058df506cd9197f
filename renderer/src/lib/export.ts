/**
 * Exports and imports from the renderer's side: the text comes from `chat.export` (core/app/
 * transfer.ts). Web mode downloads it; in Electron the main process already wrote it where the
 * save dialog said. Import reads a picked file and hands its text to `chat.import`.
 */
import { MAX_IMPORT_BYTES, type AppError, type Result } from "../../../core/app/api.ts";
import { formatBytes } from "../../../core/units.ts";

/** Saves an export's text as a download (web mode); nothing to do when Electron saved it. */
export function deliverExport(file: Result<"chat.export">): string | null {
  if (file.content === null) return file.savedTo ? `Saved to ${file.savedTo}` : null;
  const url = URL.createObjectURL(new Blob([file.content], { type: file.mimeType }));
  const link = document.createElement("a");
  link.href = url;
  link.download = file.filename;
  link.rel = "noopener";
  document.body.append(link);
  link.click();
  link.remove();
  // Revoked once the browser has taken the download.
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
  return `Downloaded ${file.filename}`;
}

/** The error for a file too large to import, before it is read (null when it fits). */
export function importTooLarge(file: { size: number }): AppError | null {
  if (file.size <= MAX_IMPORT_BYTES) return null;
  return {
    code: "bad_import",
    message: `The file is ${formatBytes(file.size)}; Redwing imports files up to ${formatBytes(MAX_IMPORT_BYTES)}. Export fewer conversations per file.`,
    action: null,
  };
}
