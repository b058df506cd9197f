import { describe, expect, it } from "vitest";
import {
  budgetText,
  downloadPercent,
  engineStateText,
  formatBytes,
  formatEta,
  formatMs,
  formatRate,
  parseBudgetText,
  verifyStateText,
} from "./format.ts";
import { DEFAULT_SETTINGS, type EngineStatus } from "../../../core/app/api.ts";
import { formatBytes as formatStatsBytes } from "../../../core/chat/stats.ts";

describe("formatBytes", () => {
  it("uses binary units, the engine's and the CLI's (core/units.ts)", () => {
    expect(formatBytes(0)).toBe("0 B");
    expect(formatBytes(1023)).toBe("1023 B");
    expect(formatBytes(1024)).toBe("1.0 KiB");
    expect(formatBytes(73 * 1024 ** 2)).toBe("73.0 MiB");
    expect(formatBytes(1.21 * 1024 ** 3)).toBe("1.21 GiB");
    expect(formatBytes(4_200_000_000)).toBe("3.91 GiB");
    // One byte count reads the same as the CLI's statistics line and `redwing models`.
    expect(formatBytes(123_456_789)).toBe(formatStatsBytes(123_456_789));
  });
  it("carries into the next unit instead of printing 1024", () => {
    expect(formatBytes(1024 ** 3 - 1)).toBe("1.00 GiB");
    expect(formatBytes(1024 * 1023.9)).toBe("1023.9 KiB");
  });
  it("shows unknown values as a dash", () => {
    expect(formatBytes(null)).toBe("—");
    expect(formatBytes(Number.NaN)).toBe("—");
  });
});

describe("formatRate and formatEta", () => {
  it("prints the rate in the unit that fits, never 0.0 MB/s for a slow download", () => {
    expect(formatRate(12_345_678)).toBe("11.8 MiB/s");
    expect(formatRate(17_000)).toBe("16.6 KiB/s");
    expect(formatRate(512)).toBe("512 B/s");
    expect(formatRate(2.5 * 1024 ** 3)).toBe("2.50 GiB/s");
    expect(formatRate(0)).toBe("0 B/s");
    expect(formatRate(null)).toBe("—");
  });
  it("prints the time left in the largest two units", () => {
    expect(formatEta(0.2)).toBe("less than a second left");
    expect(formatEta(45)).toBe("45 s left");
    expect(formatEta(120)).toBe("2 min left");
    expect(formatEta(185)).toBe("3 min 5 s left");
    expect(formatEta(7800)).toBe("2 h 10 min left");
    expect(formatEta(3600)).toBe("1 h left");
    expect(formatEta(null)).toBe("time left unknown");
    expect(formatEta(Infinity)).toBe("time left unknown");
  });
  it("prints durations", () => {
    expect(formatMs(660.1)).toBe("660 ms");
    expect(formatMs(4.25)).toBe("4.3 ms");
    expect(formatMs(1250)).toBe("1.25 s");
  });
});

describe("downloadPercent", () => {
  it("is an integer 0..100", () => {
    expect(downloadPercent({ bytesDone: 1, bytesTotal: 3, state: "running" })).toBe(33);
    expect(downloadPercent({ bytesDone: 5, bytesTotal: 0, state: "running" })).toBe(0);
    expect(downloadPercent({ bytesDone: 9, bytesTotal: 3, state: "running" })).toBe(100);
    expect(downloadPercent({ bytesDone: 0, bytesTotal: 0, state: "done" })).toBe(100);
  });
});

describe("state texts", () => {
  it("names verify states as the Models view shows them", () => {
    expect(verifyStateText({ state: "ok" })).toBe("verified");
    expect(verifyStateText({ state: "unchecked" })).toBe("not checked");
    expect(verifyStateText({ state: "checking", fraction: 0.404 })).toBe("checking 40%");
    expect(verifyStateText({ state: "corrupt", message: "model-00001.rw" })).toBe(
      "corrupt: model-00001.rw",
    );
  });
  it("describes the engine", () => {
    const base: EngineStatus = {
      state: "ready",
      model: "demo",
      pid: 1,
      loadFraction: null,
      loadedWith: DEFAULT_SETTINGS.engine,
      expertCacheSlots: null,
      reloadNeeded: false,
      memory: null,
      error: null,
    };
    expect(engineStateText(base)).toBe("ready · demo");
    expect(engineStateText({ ...base, state: "loading", loadFraction: 0.4 })).toBe(
      "loading 40% · demo",
    );
    expect(engineStateText({ ...base, state: "crashed" })).toBe("crashed");
    expect(engineStateText({ ...base, state: "stopped", model: null })).toBe("no model loaded");
    expect(engineStateText(null)).toBe("connecting");
  });
});

describe("memory budget field", () => {
  it("reads sizes with binary units, a bare number as GiB, empty as no budget", () => {
    expect(parseBudgetText("")).toBeNull();
    expect(parseBudgetText(" 8 ")).toBe(8 * 1024 ** 3);
    expect(parseBudgetText("1.5")).toBe(1.5 * 1024 ** 3);
    expect(parseBudgetText("512 MiB")).toBe(512 * 1024 ** 2);
    expect(parseBudgetText("8G")).toBe(8 * 1024 ** 3);
    expect(parseBudgetText("107.0 MiB")).toBe(107 * 1024 ** 2);
    expect(parseBudgetText("-1")).toBeUndefined();
    expect(parseBudgetText("0")).toBeUndefined();
    expect(parseBudgetText("abc")).toBeUndefined();
  });
  it("shows a budget the way the error message names it, and reads it back exactly", () => {
    expect(budgetText(null)).toBe("");
    expect(budgetText(1.5 * 1024 ** 3)).toBe("1.5 GiB");
    // The budget fix rounds to whole MiB: "Load with a 107.0 MiB budget" shows as 107 MiB.
    expect(budgetText(107 * 1024 ** 2)).toBe("107 MiB");
    for (const bytes of [107 * 1024 ** 2, 8 * 1024 ** 3, 1.5 * 1024 ** 3, 1024 ** 2])
      expect(parseBudgetText(budgetText(bytes))).toBe(bytes);
  });
});
