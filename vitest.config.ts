import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: [
      "core/**/*.test.ts",
      "cli/**/*.test.ts",
      "tests/**/*.test.ts",
      "electron/**/*.test.ts",
      "build/**/*.test.ts",
      "renderer/src/**/*.test.ts",
    ],
    // e2e/ is Playwright's (npx playwright test), not vitest's.
    exclude: ["**/node_modules/**", "e2e/**", "**/dist/**"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    pool: "forks",
  },
});
