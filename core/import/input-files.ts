/**
 * Reading a checkpoint's files as untrusted input: a checkpoint is a directory someone else
 * made (an unpacked archive, a download), so a file in it may be a symbolic link to a secret
 * (`chat_template.jinja -> /etc/shadow`, which would be copied into the model, readable by all),
 * a FIFO or a device (opening one blocks forever or reads without end), or far larger than any
 * real one. Every file the importer reads must be a regular file, not a link; files read whole
 * are size-capped.
 */
import { constants } from "node:fs";
import { lstat, open, type FileHandle } from "node:fs/promises";
import { basename } from "node:path";
import { UserError } from "../errors.ts";

/** Files the importer reads whole (config, index, tokenizer, template): far above real ones. */
export const MAX_WHOLE_INPUT_BYTES = 64 * 1024 * 1024;

function kindOf(st: {
  isSymbolicLink(): boolean;
  isFIFO(): boolean;
  isSocket(): boolean;
  isCharacterDevice(): boolean;
  isBlockDevice(): boolean;
  isDirectory(): boolean;
}): string {
  if (st.isSymbolicLink()) return "a symbolic link";
  if (st.isFIFO()) return "a FIFO (named pipe)";
  if (st.isSocket()) return "a socket";
  if (st.isCharacterDevice() || st.isBlockDevice()) return "a device";
  if (st.isDirectory()) return "a directory";
  return "not a regular file";
}

function notRegular(path: string, kind: string): UserError {
  return new UserError(
    `${basename(path)} in the checkpoint is ${kind}; Redwing reads only regular files there (a link could point at a file that is not part of the model). Copy the checkpoint with links resolved (cp -rL) if this one is meant`,
    "checkpoint_invalid",
  );
}

/**
 * Checks that `path` is a regular file without following a link, before anything opens it (so
 * that a FIFO is never opened). A missing file is left to the caller (it answers ENOENT).
 */
export async function checkRegularFile(path: string): Promise<void> {
  let st;
  try {
    st = await lstat(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw error;
  }
  if (!st.isFile()) throw notRegular(path, kindOf(st));
}

// O_NOFOLLOW: the last check against a link swapped in after checkRegularFile; O_NONBLOCK: a
// FIFO swapped in does not block the open. Neither changes reading a regular file. Windows has
// neither (0): there checkRegularFile alone applies.
const OPEN_FLAGS = constants.O_RDONLY | (constants.O_NOFOLLOW ?? 0) | (constants.O_NONBLOCK ?? 0);

/** Opens a checkpoint file for reading: a regular file, never through a link. */
export async function openInputFile(path: string): Promise<FileHandle> {
  await checkRegularFile(path);
  let handle: FileHandle;
  try {
    handle = await open(path, OPEN_FLAGS);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ELOOP" || code === "EMLINK") throw notRegular(path, "a symbolic link");
    throw error;
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw notRegular(path, kindOf(st));
  } catch (error) {
    await handle.close();
    throw error;
  }
  return handle;
}

/** A whole checkpoint file of at most `maxBytes` (default MAX_WHOLE_INPUT_BYTES). */
export async function readInputFile(
  path: string,
  maxBytes = MAX_WHOLE_INPUT_BYTES,
): Promise<Buffer> {
  const handle = await openInputFile(path);
  try {
    const { size } = await handle.stat();
    if (size > maxBytes) {
      throw new UserError(
        `${basename(path)} in the checkpoint has ${size} bytes; Redwing reads it whole and accepts at most ${maxBytes} (real ones are far smaller)`,
        "file_too_large",
      );
    }
    // Read to the end rather than trusting the size: the file may change meanwhile.
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const buf = Buffer.allocUnsafe(Math.min(1 << 20, maxBytes + 1 - total));
      const { bytesRead } = await handle.read(buf, 0, buf.length, null);
      if (bytesRead === 0) break;
      chunks.push(buf.subarray(0, bytesRead));
      total += bytesRead;
      if (total > maxBytes) {
        throw new UserError(
          `${basename(path)} in the checkpoint grew past ${maxBytes} bytes while being read`,
          "file_too_large",
        );
      }
    }
    return Buffer.concat(chunks, total);
  } finally {
    await handle.close();
  }
}
