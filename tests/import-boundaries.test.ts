/**
 * The import boundaries eslint.config.js enforces, checked by linting small sources as if they
 * were the named files: production code (core/, cli/, electron/, renderer/src) never imports test
 * support (testkit/, vitest), and the renderer's bundle (renderer/src and the core modules it
 * shares, core/app/api.ts) imports nothing from Node.
 */
import { ESLint } from "eslint";
import { describe, expect, it } from "vitest";

const eslint = new ESLint();
const BOUNDARY_RULES = new Set(["no-restricted-imports", "no-restricted-syntax"]);

/** The boundary rules' messages for `code` linted as `file`. */
async function violations(file: string, code: string): Promise<string[]> {
  const [result] = await eslint.lintText(`${code}\nexport {};\n`, { filePath: file });
  return result!.messages.filter((m) => BOUNDARY_RULES.has(m.ruleId ?? "")).map((m) => m.message);
}

describe("import boundaries (eslint.config.js)", () => {
  it("production code may not import test support, statically or dynamically", async () => {
    for (const [file, code] of [
      ["core/app/controller.ts", `import { TestHub } from "../../testkit/test-hub.ts";`],
      ["cli/commands/ui.ts", `const kit = await import("../../testkit/run-cli.ts");`],
      ["electron/main.ts", `import type { TestHub } from "../testkit/test-hub.ts";`],
      ["core/install/hash-worker.mjs", `import { fuzz } from "../../testkit/fuzz.ts";`],
      ["cli/main.ts", `import { vi } from "vitest";`],
      ["renderer/src/api/http.ts", `import { runCli } from "../../../testkit/run-cli.ts";`],
    ]) {
      expect(await violations(file!, code!), `${file}: ${code}`).toHaveLength(1);
    }
  });

  it("tests, testkit/, bench/ and scripts/ may", async () => {
    for (const [file, code] of [
      ["core/app/controller.test.ts", `import { TestHub } from "../../testkit/test-hub.ts";`],
      ["testkit/run-cli.ts", `import { vi } from "vitest";`],
      ["bench/install.ts", `import { TestHub } from "../testkit/test-hub.ts";`],
      ["scripts/manifest-corpus.ts", `import { rng } from "../testkit/checkpoints.ts";`],
    ]) {
      expect(await violations(file!, code!), `${file}: ${code}`).toEqual([]);
    }
  });

  it("the renderer's API module imports nothing from Node, directly or through core/", async () => {
    for (const code of [
      `import { readFileSync } from "node:fs";`,
      `import { join } from "path";`,
      `import { readFile } from "fs/promises";`,
      `const os = await import("node:os");`,
      `import { toAppError } from "./errors.ts";`,
      `import { modelsDir } from "../paths.ts";`,
    ]) {
      expect(await violations("core/app/api.ts", code), code).toHaveLength(1);
    }
    expect(await violations("core/app/api.ts", `import { z } from "zod";`)).toEqual([]);
  });

  it("the renderer reaches core/ only through the shared API module", async () => {
    const file = "renderer/src/api/http.ts";
    for (const code of [
      `import { EventEmitter } from "node:events";`,
      `import { Buffer } from "buffer";`,
      `import { ChatManager } from "../../../core/app/chat.ts";`,
      `import { modelsDir } from "../../../core/paths.ts";`,
    ]) {
      expect(await violations(file, code), code).toHaveLength(1);
    }
    for (const code of [
      `import { AppCallError } from "../../../core/app/api.ts";`,
      `import { create } from "zustand";`,
      `import { parseEvent } from "./validate.ts";`,
    ]) {
      expect(await violations(file, code), code).toEqual([]);
    }
  });

  it("core/ modules outside the renderer's bundle may use Node", async () => {
    expect(await violations("core/app/controller.ts", `import { join } from "node:path";`)).toEqual(
      [],
    );
  });
});
