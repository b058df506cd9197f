import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";

// Files that assert on wall-clock time (an answer within 100 ms while the engine works, a timer
// never held up, a build that is quick): they run after all the others, one at a time, so that
// no other test file competes with them for the cores.
const TIMED = [
  "core/server/server-hardening.test.ts",
  "core/app/controller.test.ts",
  "core/chat/tokenizer.test.ts",
  "electron/build.test.ts",
  "electron/ipc.test.ts",
];

export default defineConfig({
  test: {
    // e2e/ is Playwright's (npx playwright test), not vitest's.
    exclude: ["**/node_modules/**", "e2e/**", "**/dist/**"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    pool: "forks",
    // One test file per core (vitest's default leaves one core free): most files spend their
    // time waiting on an engine, a server or a child process, so a second file fills the gap.
    maxWorkers: Math.max(availableParallelism(), 1),
    projects: [
      {
        extends: true,
        test: {
          name: "parallel",
          include: [
            "core/**/*.test.ts",
            "cli/**/*.test.ts",
            "tests/**/*.test.ts",
            "electron/**/*.test.ts",
            "build/**/*.test.ts",
            "renderer/src/**/*.test.ts",
          ],
          exclude: ["**/node_modules/**", "e2e/**", "**/dist/**", ...TIMED],
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: {
          name: "timed",
          include: TIMED,
          sequence: { groupOrder: 1 },
          poolOptions: { forks: { singleFork: true } },
        },
      },
    ],
  },
});
