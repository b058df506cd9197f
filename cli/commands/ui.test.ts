import { describe, expect, it } from "vitest";
import { runCli } from "../../testkit/run-cli.ts";
import { canOpenBrowser } from "./ui.ts";

describe("redwing ui", () => {
  it("refuses a non-loopback host before starting anything", async () => {
    const r = await runCli("ui", "--host", "0.0.0.0", "--no-open");
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/only listens on this machine .*not on 0\.0\.0\.0/);
    expect(r.out).toBe("");
  });

  it("rejects a port out of range", async () => {
    const r = await runCli("ui", "--port", "70000", "--no-open");
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/expected a port from 0 to 65535/);
  });

  it("opens a browser only where one can show", () => {
    expect(canOpenBrowser({}, "linux")).toBe(false);
    expect(canOpenBrowser({ DISPLAY: ":0" }, "linux")).toBe(true);
    expect(canOpenBrowser({ WAYLAND_DISPLAY: "wayland-0" }, "linux")).toBe(true);
    expect(canOpenBrowser({ DISPLAY: ":0", BROWSER: "none" }, "linux")).toBe(false);
    expect(canOpenBrowser({}, "darwin")).toBe(true);
    expect(canOpenBrowser({}, "win32")).toBe(true);
  });
});
