/**
 * The shared corpus of good and bad model directories (fixtures/manifest-corpus, written by
 * scripts/manifest-corpus.ts): this reader accepts exactly the good ones and refuses each bad one
 * with an error naming its fault. native/tests/manifest_corpus_test.cpp holds the native reader
 * to the same list.
 */
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readModelDir } from "./read.ts";

const CORPUS = join(import.meta.dirname, "..", "..", "fixtures", "manifest-corpus");
const cases = JSON.parse(readFileSync(join(CORPUS, "cases.json"), "utf8")) as Record<
  string,
  { valid: boolean; error?: string }
>;

describe("the shared manifest corpus", () => {
  it("lists every directory of the corpus", () => {
    const dirs = readdirSync(CORPUS, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
      .sort();
    expect(dirs).toEqual(Object.keys(cases).sort());
    expect(Object.values(cases).filter((c) => c.valid).length).toBeGreaterThan(0);
    expect(Object.values(cases).filter((c) => !c.valid).length).toBeGreaterThan(20);
  });

  for (const [name, c] of Object.entries(cases)) {
    it(`${c.valid ? "accepts" : "refuses"} ${name}`, async () => {
      const result = readModelDir(join(CORPUS, name));
      if (c.valid) {
        await expect(result).resolves.toMatchObject({ manifest: { format: "redwing-model" } });
      } else {
        await expect(result).rejects.toThrow(c.error!);
      }
    });
  }
});
