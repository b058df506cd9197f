#!/usr/bin/env node
// `npm start`: opens the app. Until the desktop app lands (docs/README "Status"), it shows what
// a set-up checkout can run: the engine's CPU features and the CLI's commands.
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const redwing = join(root, "bin", "redwing");
console.log("Redwing is set up. The desktop app and web UI are not built yet; the CLI is:\n");
const result = spawnSync(process.execPath, [redwing, "--help"], { stdio: "inherit" });
process.exit(result.status ?? 1);
