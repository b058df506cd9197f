import { describe, expect, it } from "vitest";
import {
  bytesToGigabytesText,
  downloadPercent,
  engineStateText,
  formatBytes,
  formatEta,
  formatMs,
  formatRate,
  parseGigabytes,
  verifyStateText,
} from "./format.ts";
import { DEFAULT_SETTINGS, type EngineStatus } from "../../../core/app/api.ts";

describe("formatBytes", () => {
  it("uses decimal units with three significant digits", () => {
    expect(formatBytes(0)).toBe("0 B");
    expect(formatBytes(999)).toBe("999 B");
    expect(formatBytes(1000)).toBe("1.00 kB");
    expect(formatBytes(1_234_567)).toBe("1.23 MB");
    expect(formatBytes(45_600_000)).toBe("45.6 MB");
    expect(formatBytes(4_200_000_000)).toBe("4.20 GB");
    expect(formatBytes(123_400_000_000)).toBe("123 GB");
  });
  it("carries into the next unit instead of printing 1000", () => {
    expect(formatBytes(999_960)).toBe("1.00 MB");
    expect(formatBytes(999_400)).toBe("999 kB");
  });
  it("shows unknown values as a dash", () => {
    expect(formatBytes(null)).toBe("—");
    expect(formatBytes(Number.NaN)).toBe("—");
  });
});

describe("formatRate and formatEta", () => {
  it("prints the rate in the unit that fits, never 0.0 MB/s for a slow download", () => {
    expect(formatRate(12_345_678)).toBe("12.3 MB/s");
    expect(formatRate(17_000)).toBe("17.0 kB/s");
    expect(formatRate(512)).toBe("512 B/s");
    expect(formatRate(2.5e9)).toBe("2.50 GB/s");
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
  it("round-trips gigabytes and treats empty as no budget", () => {
    expect(parseGigabytes("")).toBeNull();
    expect(parseGigabytes(" 8 ")).toBe(8e9);
    expect(parseGigabytes("1.5")).toBe(1.5e9);
    expect(parseGigabytes("-1")).toBeUndefined();
    expect(parseGigabytes("abc")).toBeUndefined();
    expect(bytesToGigabytesText(1.5e9)).toBe("1.5");
    expect(bytesToGigabytesText(null)).toBe("");
  });
});
