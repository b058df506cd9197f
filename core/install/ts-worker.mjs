// Starts a TypeScript worker thread from a checkout (tests, `bin/redwing`): registers tsx's
// loader in this thread, then imports the entry named in workerData. The packaged app runs
// bundled workers instead (scripts/build-electron.mjs) and never loads this file.
import { workerData } from "node:worker_threads";

const { register } = await import("tsx/esm/api");
register();
await import(workerData.entry);
