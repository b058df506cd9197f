#!/usr/bin/env node
// `npm start`: opens Redwing on the built-in demo model. Until the desktop app lands, that is the
// CLI's interactive chat on a terminal; without a terminal it lists the models and the commands.
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const redwing = (...args) =>
  spawnSync(process.execPath, [join(root, "bin", "redwing"), ...args], { stdio: "inherit" })
    .status ?? 1;

if (process.stdin.isTTY) {
  console.log("Redwing: chatting with the built-in demo model (/exit to quit).\n");
  process.exit(redwing("chat"));
}
console.log("Redwing is set up. The desktop app is not built yet; installed models and the CLI:\n");
const status = redwing("install", "demo") || redwing("models");
process.exit(status === 0 ? redwing("--help") : status);
