import { describe, expect, it } from "vitest";
import { SamplingSettingsSchema } from "../../../core/app/api.ts";
import { parseStopStrings, stopStringsText } from "./stop.ts";

describe("stop strings box", () => {
  it("reads one string per line, with \\n for a newline, skipping empty lines and repeats", () => {
    expect(parseStopStrings("")).toEqual({ ok: true, value: [] });
    expect(parseStopStrings("END\n\n###\\n\nEND")).toEqual({ ok: true, value: ["END", "###\n"] });
    expect(parseStopStrings("a\\\\n")).toEqual({ ok: true, value: ["a\\n"] });
  });

  it("refuses what the settings would reject, saying why", () => {
    const nine = Array.from({ length: 9 }, (_, i) => `s${i}`).join("\n");
    const many = parseStopStrings(nine);
    expect(many).toEqual({ ok: false, error: "At most 8 stop strings (there are 9)." });
    expect(SamplingSettingsSchema.shape.stop.safeParse(nine.split("\n")).success).toBe(false);
    const long = parseStopStrings("x".repeat(201));
    expect(long.ok).toBe(false);
    expect(!long.ok && long.error).toMatch(/at most 200 characters/);
    // Everything accepted here is accepted by the settings schema.
    const fine = parseStopStrings(["x".repeat(200), "\\n\\n", "User:"].join("\n"));
    expect(fine.ok && SamplingSettingsSchema.shape.stop.safeParse(fine.value).success).toBe(true);
  });

  it("shows saved strings so that they read back the same", () => {
    const stops = ["END", "line\nbreak", "back\\slash", "tab\there"];
    const text = stopStringsText(stops);
    expect(text.split("\n")).toHaveLength(4);
    expect(parseStopStrings(text)).toEqual({ ok: true, value: stops });
  });
});
