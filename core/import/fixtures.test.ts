/**
 * Cross-check against the reference fixtures (fixtures/<name>/{mlx,bf16}/, made by
 * fixtures/make_fixtures.py with an independent Python quantizer): both forms must import, pass
 * verification, and give byte-identical weights.bin and expert files. Skipped while the
 * fixtures are absent.
 */
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isQuantized, type Manifest } from "../format/manifest.ts";
import { readModelDir, verifyModelFiles } from "../format/read.ts";
import { importForTest as imp } from "../../testkit/import.ts";

// REDWING_FIXTURES points the test at another copy (e.g. fixtures being generated elsewhere).
const FIXTURES =
  process.env.REDWING_FIXTURES ?? fileURLToPath(new URL("../../fixtures", import.meta.url));
const NAMES = ["gemma4-moe", "gemma4-dense", "gemma3"];

let root: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-fixtures-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

/** Names the first tensor region whose bytes differ, to make a mismatch diagnosable. */
function firstDifference(manifest: Manifest, a: Buffer, b: Buffer): string {
  for (const [name, t] of Object.entries(manifest.tensors)) {
    const regions = isQuantized(t)
      ? { weight: t.weight, scales: t.scales, biases: t.biases }
      : { data: { offset: t.offset, nbytes: t.nbytes } };
    for (const [what, r] of Object.entries(regions)) {
      const x = a.subarray(r.offset, r.offset + r.nbytes);
      const y = b.subarray(r.offset, r.offset + r.nbytes);
      if (!x.equals(y)) {
        let i = 0;
        while (x[i] === y[i]) i++;
        return `${name}.${what} differs first at byte ${i} of ${r.nbytes}`;
      }
    }
  }
  return "only padding differs";
}

for (const name of NAMES) {
  const mlx = join(FIXTURES, name, "mlx");
  const bf16 = join(FIXTURES, name, "bf16");
  const present = existsSync(join(mlx, "config.json")) && existsSync(join(bf16, "config.json"));
  describe.skipIf(!present)(`fixture ${name}`, () => {
    it("imports the mlx and bf16 forms to verified, byte-identical models", async () => {
      const a = await imp(mlx, join(root, `${name}-mlx`));
      const b = await imp(bf16, join(root, `${name}-bf16`));
      for (const dir of [a.dir, b.dir]) {
        await readModelDir(dir, { verifyHashes: true });
        const { checks } = await verifyModelFiles(dir);
        expect(checks.every((c) => c.status === "ok")).toBe(true);
      }
      expect(a.manifest.source.kind).toBe("mlx-affine");
      expect(b.manifest.source.kind).toBe("hf-float");
      expect(b.manifest.architecture).toEqual(a.manifest.architecture);
      expect(b.manifest.tensors).toEqual(a.manifest.tensors);
      expect(b.manifest.experts).toEqual(a.manifest.experts);
      const wa = await readFile(join(a.dir, "weights.bin"));
      const wb = await readFile(join(b.dir, "weights.bin"));
      expect(wa.equals(wb), firstDifference(a.manifest, wa, wb)).toBe(true);
      for (const layer of Object.values(a.manifest.experts?.layers ?? {})) {
        const ea = await readFile(join(a.dir, layer.file));
        const eb = await readFile(join(b.dir, layer.file));
        let at = -1;
        if (!ea.equals(eb)) {
          at = 0;
          while (ea[at] === eb[at]) at++;
        }
        expect(
          at,
          `${layer.file} differs first at byte ${at} (expert ${Math.floor(at / layer.stride)})`,
        ).toBe(-1);
      }
    });
  });
}
