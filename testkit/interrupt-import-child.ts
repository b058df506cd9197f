/**
 * Test helper for format.test.ts: runs an import and, once it is writing experts, prints
 * MIDWAY and blocks so the test can kill the process in the middle of an import.
 * Usage: node --import tsx testkit/interrupt-import-child.ts <checkpoint-dir> <model-dir>
 */
import { writeSync } from "node:fs";
import { importCheckpoint } from "../core/import/importer.ts";

const [src, dest] = process.argv.slice(2);
if (!src || !dest) throw new Error("usage: interrupt-import-child.ts <checkpoint-dir> <model-dir>");
let parked = false;
await importCheckpoint(src, dest, {
  onProgress: (p) => {
    if (p.phase === "experts" && p.done >= 2 && !parked) {
      parked = true;
      writeSync(1, "MIDWAY\n");
      // Block the whole process (no further writes) until the test kills it.
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 60_000);
    }
  },
});
writeSync(1, "FINISHED\n");
