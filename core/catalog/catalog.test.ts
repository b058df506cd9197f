import { describe, expect, it } from "vitest";
import { UserError } from "../errors.ts";
import { CATALOG, isRepoId, parseRepoRef, repoDirName, resolveModelRef } from "./catalog.ts";

describe("catalog", () => {
  it("has the demo and the three hub models, with complete entries", () => {
    expect(CATALOG.map((e) => e.id)).toEqual([
      "demo",
      "gemma-4-26b-a4b-it",
      "gemma-3-4b-it",
      "mamaylm-gemma-3-4b-it",
    ]);
    const ids = new Set<string>();
    for (const e of CATALOG) {
      expect(ids.has(e.id)).toBe(false);
      ids.add(e.id);
      expect(e.memory.bytes).toBeGreaterThan(0);
      expect(e.install.bytes).toBeGreaterThan(0);
      expect(e.licence.url).toMatch(/^https:\/\//);
      if (e.kind === "hub") {
        expect(isRepoId(e.repo)).toBe(true);
        expect(e.revision === null || /^[0-9a-f]{40}$/.test(e.revision)).toBe(true);
        expect(e.download.bytes).toBeGreaterThanOrEqual(e.install.bytes);
        expect(e.files.metadata).toContain("config.json");
        expect(e.tensors.skip).toContain("vision_tower");
      }
    }
    const g4 = CATALOG.find((e) => e.id === "gemma-4-26b-a4b-it")!;
    expect(g4.kind === "hub" && g4.revision).toBe("0d77464eeb233a2da68ebf9d7dc4edaac7db956d");
    expect(g4.kind === "hub" && g4.download).toEqual({ bytes: 14_620_479_420, approx: false });
    const mamay = CATALOG.find((e) => e.id === "mamaylm-gemma-3-4b-it")!;
    expect(mamay.kind === "hub" && mamay.format).toBe("hf-float");
  });

  it("resolves names, catalogued repos and any repo[@revision]", () => {
    expect(resolveModelRef("gemma-4-26b-a4b-it")).toMatchObject({
      repo: "mlx-community/gemma-4-26b-a4b-it-4bit",
      revision: "0d77464eeb233a2da68ebf9d7dc4edaac7db956d",
      dirName: "gemma-4-26b-a4b-it",
    });
    // A catalogued repo keeps its id and pinned revision unless one is given.
    expect(resolveModelRef("MLX-community/gemma-4-26b-a4b-it-4bit@main")).toMatchObject({
      revision: "main",
      dirName: "gemma-4-26b-a4b-it",
    });
    expect(resolveModelRef("mlx-community/gemma-3-4b-it-4bit").revision).toBeNull();
    expect(resolveModelRef("someone/model-x@v1.0")).toEqual({
      entry: null,
      repo: "someone/model-x",
      revision: "v1.0",
      dirName: "someone--model-x",
    });
    expect(resolveModelRef("demo")).toMatchObject({ repo: null, dirName: "demo" });
    expect(repoDirName("a/b")).toBe("a--b");
  });

  it("rejects what is not a repository id", () => {
    for (const bad of ["", "a/b/c", "a b", "../x", "a/..", "a--b/c", "a/b@", "-a/b", "a/b@x y"]) {
      expect(() => parseRepoRef(bad), bad).toThrow(UserError);
    }
    expect(parseRepoRef("gpt2")).toEqual({ repo: "gpt2", revision: null });
  });
});
