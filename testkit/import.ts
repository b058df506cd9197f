/** Test helper: imports a checkpoint the way the tests want it. */
import { importCheckpoint } from "../core/import/importer.ts";

/** Imports without fsync: the durability path is exercised by the CLI and kill tests. */
export function importForTest(
  src: string,
  dest: string,
  options: Parameters<typeof importCheckpoint>[2] = {},
): ReturnType<typeof importCheckpoint> {
  return importCheckpoint(src, dest, { durable: false, ...options });
}
