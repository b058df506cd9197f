/**
 * Before the e2e specs: the same checks `npm test` makes first (scripts/setup.mjs: native build,
 * renderer/dist and electron/dist rebuilt when their sources changed), so `npx playwright test`
 * alone never runs against a stale interface. A no-op run takes about a second.
 */
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { ROOT } from "./hub.ts";

export default function globalSetup(): void {
  const result = spawnSync(process.execPath, [join(ROOT, "scripts", "setup.mjs")], {
    cwd: ROOT,
    stdio: "inherit",
  });
  if (result.status !== 0) throw new Error("scripts/setup.mjs failed (see above)");
}
