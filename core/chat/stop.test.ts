import { describe, expect, it } from "vitest";
import { StopMatcher } from "./stop.ts";

/** Feeds pieces one by one and returns what was emitted, and whether it stopped. */
function feed(
  stops: string[],
  pieces: string[],
): { out: string; stopped: boolean; steps: string[] } {
  const m = new StopMatcher(stops);
  const steps: string[] = [];
  for (const p of pieces) {
    const r = m.push(p);
    steps.push(r.text);
    if (r.stopped) return { out: steps.join(""), stopped: true, steps };
  }
  steps.push(m.flush());
  return { out: steps.join(""), stopped: false, steps };
}

describe("StopMatcher", () => {
  it("emits the text before a stop string and not the stop string", () => {
    expect(feed(["END"], ["hello END world"])).toMatchObject({ out: "hello ", stopped: true });
  });

  it("finds a stop string split across pieces and holds back only a possible prefix", () => {
    const r = feed(["</answer>"], ["42 </", "ans", "wer> trailing"]);
    expect(r).toMatchObject({ out: "42 ", stopped: true });
    // "42 " goes out at once; "</" and "</ans" are held as they may start the stop string.
    expect(r.steps).toEqual(["42 ", "", ""]);
  });

  it("releases held text as soon as it can no longer start a stop string", () => {
    const r = feed(["STOP"], ["a ST", "ar", "t"]);
    expect(r.steps).toEqual(["a ", "STar", "t", ""]);
    expect(r).toMatchObject({ out: "a STart", stopped: false });
  });

  it("keeps a partial stop string held back to the end and flushes it", () => {
    expect(feed(["STOP"], ["ab", "STO"])).toMatchObject({ out: "abSTO", stopped: false });
  });

  it("stops at the earliest of several stop strings", () => {
    expect(feed(["bb", "a b"], ["xa", " bb"])).toMatchObject({ out: "x", stopped: true });
    const m = new StopMatcher(["\n\n", "User:"]);
    expect(m.push("one\nUser: two\n\n")).toEqual({ text: "one\n", stopped: true, stop: "User:" });
    expect(m.push("more")).toEqual({ text: "", stopped: true });
  });

  it("matches a stop string arriving one character at a time, with overlapping prefixes", () => {
    // "aab" inside "aaab": a naive matcher that holds only "aa" and restarts would miss it.
    const r = feed(["aab"], [..."xaaab!"]);
    expect(r).toMatchObject({ out: "xa", stopped: true });
  });

  it("passes text through unchanged without stop strings", () => {
    expect(feed([], ["a", "b", ""])).toMatchObject({ out: "ab", stopped: false });
    expect(feed([""], ["a"])).toMatchObject({ out: "a", stopped: false });
  });
});
