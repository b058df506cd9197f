import { describe, expect, it } from "vitest";
import { Template } from "./jinja.ts";

const render = (text: string, items: Record<string, unknown>) => new Template(text).render(items);

describe("template engine: Python Jinja2's upper/lower/map on non-strings", () => {
  it("upper-cases str() of a list, None and an undefined value as Jinja2 does", () => {
    // Expected strings from Python 3 / Jinja2 3.1.6 rendering the same template and values.
    expect(
      render("{{ x | upper }}|{{ y | upper }}|{{ z | lower }}|{{ n | upper }}", {
        x: ["a", "b'c", null, true, 1, "tab\t"],
        z: { K: [1.5] },
        n: null,
      }),
    ).toBe(`['A', "B'C", NONE, TRUE, 1, 'TAB\\T']||{'k': [1.5]}|NONE`);
  });

  it("maps a filter by name over a list", () => {
    expect(render("{{ ['a', 'b'] | map('upper') | join(',') }}", {})).toBe("A,B");
    expect(render("{{ t | map('upper') | list | length }}", { t: ["x", "y", "z"] })).toBe("3");
  });

  it("leaves what the port already renders alone", () => {
    expect(render("{{ 'abc' | upper }}{{ 'ABC' | lower }}", {})).toBe("ABCabc");
    expect(render("{{ xs | map(attribute='n') | join }}", { xs: [{ n: 1 }, { n: 2 }] })).toBe("12");
  });
});
