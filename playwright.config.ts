/**
 * End-to-end tests of the app (e2e/): Debian's Chromium (/usr/bin/chromium, installed by
 * `node scripts/setup.mjs --chromium`, which `npm test` runs) against web mode (`redwing ui`),
 * and the same specs through Playwright's Electron support where an Electron binary exists
 * (skipped with a message otherwise). One worker: every test starts its own app process with
 * its own REDWING_HOME, and the engine wants the machine's cores.
 */
import { defineConfig } from "@playwright/test";
import type { Shell } from "./e2e/fixtures.ts";

export default defineConfig<{ shell: Shell }>({
  testDir: "e2e",
  testMatch: "*.spec.ts",
  globalSetup: "./e2e/global-setup.ts",
  outputDir: "e2e/results/output",
  workers: 1,
  retries: 0,
  fullyParallel: false,
  forbidOnly: true,
  timeout: 180_000,
  expect: { timeout: 20_000 },
  reporter: [["list"]],
  use: {
    viewport: { width: 1280, height: 800 },
    actionTimeout: 20_000,
    launchOptions: {
      executablePath: process.env.REDWING_E2E_CHROMIUM ?? "/usr/bin/chromium",
      args: [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--headless",
      ],
    },
  },
  projects: [
    { name: "web", use: { shell: "web" } },
    { name: "electron", use: { shell: "electron" } },
  ],
});
