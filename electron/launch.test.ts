import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { describe, expect, it } from "vitest";
import { electronExecutable, launchElectronApp } from "../e2e/electron/launch.ts";

describe("e2e Electron launcher", () => {
  it("finds the Electron binary without downloading it, or says why not", async () => {
    const found = electronExecutable();
    if ("path" in found) {
      expect(existsSync(found.path)).toBe(true);
      return;
    }
    expect(found.reason).toMatch(/Electron binary is not installed|not installed/);
    // Without the binary, launching answers the same reason instead of throwing.
    const launched = await launchElectronApp({ home: tmpdir() });
    expect(launched).toEqual({ ok: false, reason: found.reason });
  });
});
