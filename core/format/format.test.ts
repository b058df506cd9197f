import { spawn } from "node:child_process";
import {
  cp,
  mkdir,
  mkdtemp,
  readFile,
  readdir,
  rm,
  symlink,
  truncate,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { importForTest as imp } from "../../testkit/import.ts";
import { TINY_GEMMA4_MOE, writeTinyCheckpoint } from "../../testkit/checkpoints.ts";
import { EXPERT_ALIGNMENT, TENSOR_ALIGNMENT, isQuantized, type Manifest } from "./manifest.ts";
import { readModelDir, verifyModelFiles } from "./read.ts";
import { ModelWriter, removeLeftovers, type QuantizedMeta } from "./writer.ts";

let root: string;
let ckpt: string;
let model: string;
let n = 0;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "redwing-format-"));
  ckpt = join(root, "ckpt");
  await writeTinyCheckpoint(ckpt, TINY_GEMMA4_MOE, { form: "nested", kind: "float" });
  model = (await imp(ckpt, join(root, "model"))).dir;
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

/** A fresh copy of the imported model to damage. */
async function copy(): Promise<string> {
  const dir = join(root, `copy-${n++}`);
  await cp(model, dir, { recursive: true });
  return dir;
}

async function editManifest(
  dir: string,
  edit: (m: Record<string, unknown>) => void,
): Promise<void> {
  const path = join(dir, "manifest.json");
  const m = JSON.parse(await readFile(path, "utf8")) as Record<string, unknown>;
  edit(m);
  await writeFile(path, JSON.stringify(m));
}

describe("model directory layout", () => {
  it("aligns every region and pads expert blobs to the stride", async () => {
    const { manifest } = await readModelDir(model, { verifyHashes: true });
    for (const t of Object.values(manifest.tensors)) {
      const offsets = isQuantized(t)
        ? [t.weight.offset, t.scales.offset, t.biases.offset]
        : [t.offset];
      for (const o of offsets) expect(o % TENSOR_ALIGNMENT).toBe(0);
    }
    const layers = Object.entries(manifest.experts!.layers);
    expect(layers.map(([k]) => k)).toEqual(["0", "1", "2"]);
    for (const [k, layer] of layers) {
      expect(layer.file).toBe(`experts/layer_00${k}.bin`);
      expect(layer.stride % EXPERT_ALIGNMENT).toBe(0);
      const size = manifest.files.find((f) => f.path === layer.file)!.size;
      expect(size).toBe(layer.count * layer.stride);
      for (const part of Object.values(layer.parts)) {
        for (const r of [part.weight, part.scales, part.biases])
          expect(r.offset % TENSOR_ALIGNMENT).toBe(0);
      }
    }
    expect(manifest.format).toBe("redwing-model");
    expect(manifest.format_version).toBe(1);
    // No file lists manifest.json; every other file is listed.
    expect(manifest.files.map((f) => f.path)).not.toContain("manifest.json");
  });
});

describe("readModelDir rejects bad directories with clear messages", () => {
  it("no manifest: not installed", async () => {
    const dir = await copy();
    await rm(join(dir, "manifest.json"));
    await expect(readModelDir(dir)).rejects.toThrow(
      /no model is installed at .*copy-\d+ \(it has no manifest\.json\)/,
    );
    await expect(readModelDir(join(root, "nowhere"))).rejects.toThrow(/no model is installed/);
  });

  it("unknown format or version, naming both versions", async () => {
    const dir = await copy();
    await editManifest(dir, (m) => (m.format_version = 2));
    await expect(readModelDir(dir)).rejects.toThrow(
      /format_version 2; this Redwing reads format_version 1/,
    );
    await editManifest(dir, (m) => (m.format = "gguf"));
    await expect(readModelDir(dir)).rejects.toThrow(
      /format "gguf"; this Redwing reads "redwing-model"/,
    );
  });

  it("a flipped byte in any file: verify and readModelDir name that file", async () => {
    const { manifest } = await readModelDir(model);
    for (const file of manifest.files) {
      const dir = await copy();
      const path = join(dir, file.path);
      const bytes = await readFile(path);
      bytes[Math.floor(bytes.length / 2)]! ^= 0x01;
      await writeFile(path, bytes);
      await readModelDir(dir); // sizes still match: only a rehash finds it
      await expect(readModelDir(dir, { verifyHashes: true })).rejects.toThrow(
        new RegExp(`${file.path.replace(/[./]/g, "\\$&")} in .* is corrupt`),
      );
      const { checks } = await verifyModelFiles(dir);
      expect(checks.filter((c) => c.status !== "ok").map((c) => c.path)).toEqual([file.path]);
      await rm(dir, { recursive: true });
    }
  });

  it("a truncated or missing file", async () => {
    const dir = await copy();
    await truncate(join(dir, "experts/layer_001.bin"), 1000);
    await expect(readModelDir(dir)).rejects.toThrow(
      /experts\/layer_001\.bin in .* has 1000 bytes, the manifest says \d+/,
    );
    const { checks } = await verifyModelFiles(dir);
    expect(checks.find((c) => c.path === "experts/layer_001.bin")!.status).toBe("size");
    const dir2 = await copy();
    await rm(join(dir2, "tokenizer.json"));
    await expect(readModelDir(dir2)).rejects.toThrow(/tokenizer\.json is missing from/);
    expect(
      (await verifyModelFiles(dir2)).checks.find((c) => c.path === "tokenizer.json")!.status,
    ).toBe("missing");
  });

  it("symbolic links, extra files and extra directories", async () => {
    const dir = await copy();
    await rm(join(dir, "tokenizer.json"));
    await symlink(join(model, "tokenizer.json"), join(dir, "tokenizer.json"));
    await expect(readModelDir(dir)).rejects.toThrow(/tokenizer\.json in .* is a symbolic link/);
    expect(
      (await verifyModelFiles(dir)).checks.find((c) => c.path === "tokenizer.json")!.status,
    ).toBe("not_regular");
    const dir2 = await copy();
    await symlink("/etc/passwd", join(dir2, "experts", "evil"));
    await expect(readModelDir(dir2)).rejects.toThrow(/experts\/evil in .* is a symbolic link/);
    const dir3 = await copy();
    await writeFile(join(dir3, "notes.txt"), "hi");
    await expect(readModelDir(dir3)).rejects.toThrow(
      /notes\.txt in .* is not listed in the manifest/,
    );
    const dir4 = await copy();
    await mkdir(join(dir4, "extra"));
    await expect(readModelDir(dir4)).rejects.toThrow(/extra in .* is an unexpected directory/);
  });

  it("paths that escape the directory or are absolute", async () => {
    for (const bad of [
      "../model/weights.bin",
      "/etc/passwd",
      "experts/../weights.bin",
      "a\\b",
      "",
    ]) {
      const dir = await copy();
      await editManifest(dir, (m) => {
        (m.files as { path: string }[])[1]!.path = bad;
      });
      await expect(readModelDir(dir), bad).rejects.toThrow(/path must be relative/);
      await rm(dir, { recursive: true });
    }
  });

  it("inconsistent layouts: misaligned or overlapping regions, wrong sizes, missing tensors", async () => {
    const cases: [string, (m: Manifest) => void, RegExp][] = [
      [
        "misaligned",
        (m) => ((m.tensors["norm"] as { offset: number }).offset += 2),
        /offset \d+ is not a multiple of 64/,
      ],
      [
        "overlap",
        (m) =>
          ((m.tensors["norm"] as { offset: number }).offset = (
            m.tensors["layers.0.input_layernorm"] as { offset: number }
          ).offset),
        /overlap/,
      ],
      [
        "nbytes",
        (m) => ((m.tensors["norm"] as { nbytes: number }).nbytes = 4),
        /tensor norm: nbytes 4, expected 256/,
      ],
      [
        "missing",
        (m) => delete m.tensors["layers.2.layer_scalar"],
        /tensor layers\.2\.layer_scalar is missing/,
      ],
      [
        "stride",
        (m) => (m.experts!.layers["0"]!.stride = 1000),
        /stride 1000 is not a multiple of 16384/,
      ],
      [
        "past end",
        (m) => ((m.tensors["norm"] as { offset: number }).offset = 1 << 30),
        /past the end of weights\.bin/,
      ],
      [
        "expert file",
        (m) => (m.experts!.layers["0"]!.file = "experts/layer_009.bin"),
        /file must be experts\/layer_000\.bin/,
      ],
    ];
    for (const [label, edit, pattern] of cases) {
      const dir = await copy();
      await editManifest(dir, (m) => edit(m as unknown as Manifest));
      await expect(readModelDir(dir), label).rejects.toThrow(pattern);
      await rm(dir, { recursive: true });
    }
  });

  it("a .partial directory is never a model, even with a manifest", async () => {
    const partial = join(root, `.model.partial-999999-abcdef`);
    await cp(model, partial, { recursive: true });
    await expect(readModelDir(partial)).rejects.toThrow(/unfinished import/);
    await rm(partial, { recursive: true });
  });
});

describe("ModelWriter installation", () => {
  it("refuses to overwrite without force, replaces a model with force, never a non-model", async () => {
    const dest = join(root, "dest-force");
    const first = await imp(ckpt, dest, { revision: "one" });
    await expect(imp(ckpt, dest)).rejects.toThrow(
      /a model is already installed at .*; pass --force to replace it/,
    );
    const second = await imp(ckpt, dest, { force: true, revision: "two", durable: true });
    expect(first.manifest.source.revision).toBe("one");
    expect((await readModelDir(dest)).manifest.source.revision).toBe("two");
    expect(second.dir).toBe(dest);
    const other = join(root, "not-a-model");
    await mkdir(other);
    await writeFile(join(other, "precious.txt"), "keep me");
    await expect(imp(ckpt, other, { force: true })).rejects.toThrow(
      /is not a Redwing model .*refusing/,
    );
    expect(await readFile(join(other, "precious.txt"), "utf8")).toBe("keep me");
    expect(
      (await readdir(root)).filter((e) => e.includes(".partial-") || e.includes(".old-")),
    ).toEqual([]);
  });

  it("an import that fails midway leaves no model and no partial directory", async () => {
    const dest = join(root, "dest-throw");
    await expect(
      imp(ckpt, dest, {
        onProgress: (p) => {
          if (p.phase === "experts" && p.done === 3) throw new Error("disk on fire");
        },
      }),
    ).rejects.toThrow(/disk on fire/);
    const controller = new AbortController();
    await expect(
      imp(ckpt, dest, {
        signal: controller.signal,
        onProgress: (p) => {
          if (p.phase === "tensors") controller.abort();
        },
      }),
    ).rejects.toThrow(/import interrupted/);
    expect((await readdir(root)).filter((e) => e.includes("dest-throw"))).toEqual([]);
    await expect(readModelDir(dest)).rejects.toThrow(/no model is installed/);
  });

  it("a killed import leaves nothing that looks installed; the next import cleans up", async () => {
    const parent = join(root, "killed");
    await mkdir(parent);
    const dest = join(parent, "m");
    const child = spawn(
      process.execPath,
      [
        "--import",
        "tsx",
        fileURLToPath(new URL("../../testkit/interrupt-import-child.ts", import.meta.url)),
        ckpt,
        dest,
      ],
      {
        cwd: fileURLToPath(new URL("../..", import.meta.url)),
        stdio: ["ignore", "pipe", "inherit"],
      },
    );
    const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
    await new Promise<void>((resolve, reject) => {
      let out = "";
      child.stdout!.on("data", (d: Buffer) => {
        out += d.toString();
        if (out.includes("MIDWAY")) resolve();
        if (out.includes("FINISHED")) reject(new Error("the child finished before it was killed"));
      });
      child.on("exit", (code) => reject(new Error(`child exited early (${code})`)));
    });
    const during = await readdir(parent);
    expect(during).toHaveLength(1);
    expect(during[0]).toMatch(new RegExp(`^\\.m\\.partial-${child.pid}-[0-9a-f]+$`));
    child.kill("SIGKILL");
    await exited;
    await expect(readModelDir(dest)).rejects.toThrow(/no model is installed/);
    await expect(readModelDir(join(parent, during[0]!))).rejects.toThrow(/unfinished import/);
    // The next import removes the dead writer's directory and succeeds.
    await imp(ckpt, dest);
    expect(await readdir(parent)).toEqual(["m"]);
    await readModelDir(dest, { verifyHashes: true });
  });

  it("leaves partial directories of live processes alone, restores an orphaned old model", async () => {
    const parent = join(root, "live");
    await mkdir(parent);
    const mine = join(parent, `.m.partial-${process.ppid}-00aa`);
    await mkdir(mine);
    expect(await removeLeftovers(parent, "m")).toEqual([]);
    // A dead writer's old model with no replacement installed is restored...
    await cp(model, join(parent, ".m.old-999999999-00bb"), { recursive: true });
    expect(await removeLeftovers(parent, "m")).toEqual([]);
    await readModelDir(join(parent, "m"));
    // ...and removed when the destination holds a model.
    await mkdir(join(parent, ".m.old-999999999-00cc"));
    expect(await removeLeftovers(parent, "m")).toEqual([".m.old-999999999-00cc"]);
    expect((await readdir(parent)).sort()).toEqual([`.m.partial-${process.ppid}-00aa`, "m"]);
  });

  it("rejects experts written out of order and incomplete expert layers", async () => {
    const w = await ModelWriter.create(join(root, "manual"));
    const meta: QuantizedMeta = { bits: 4, group_size: 64, scale_dtype: "bf16", shape: [64, 128] };
    const lw = await w.beginExpertLayer(0, 2, {
      gate_proj: meta,
      up_proj: meta,
      down_proj: { ...meta, shape: [128, 64] },
    });
    await expect(lw.write(1, {} as never)).rejects.toThrow(
      /must be written in order: got 1, expected 0/,
    );
    const { manifest } = await readModelDir(model);
    await expect(w.commit(manifest)).rejects.toThrow(/expert layer 0: 0 of 2 experts written/);
    await w.abort();
    expect((await readdir(root)).some((e) => e.startsWith(".manual.partial"))).toBe(false);
  });
});
