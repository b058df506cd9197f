import { mkdtemp, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SafetensorsCheckpoint, SafetensorsFile } from "./safetensors.ts";
import { writeSafetensors } from "../../testkit/checkpoints.ts";

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "redwing-st-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

function header(obj: unknown, data = Buffer.alloc(0)): Buffer {
  const json = Buffer.from(JSON.stringify(obj));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([len, json, data]);
}

async function expectBad(name: string, bytes: Buffer, pattern: RegExp): Promise<void> {
  const path = join(dir, name);
  await writeFile(path, bytes);
  await expect(SafetensorsFile.open(path)).rejects.toThrow(pattern);
}

describe("safetensors reader", () => {
  it("reads tensors and byte ranges", async () => {
    const path = join(dir, "ok.safetensors");
    const a = Buffer.from([1, 2, 3, 4, 5, 6, 7, 8]);
    const b = Buffer.from([9, 10]);
    await writeSafetensors(path, [
      { name: "a", dtype: "F32", shape: [2], data: a },
      { name: "b", dtype: "BF16", shape: [1], data: b },
    ]);
    const f = await SafetensorsFile.open(path);
    expect([...f.tensors.keys()]).toEqual(["a", "b"]);
    expect(f.tensors.get("a")).toMatchObject({ dtype: "F32", shape: [2], nbytes: 8 });
    const ckpt = await SafetensorsCheckpoint.open(dir, ["ok.safetensors"]);
    expect([...(await ckpt.read(ckpt.get("a")!, 2, 4))]).toEqual([3, 4, 5, 6]);
    expect([...(await ckpt.read(ckpt.get("b")!))]).toEqual([9, 10]);
    await expect(ckpt.read(ckpt.get("b")!, 1, 2)).rejects.toThrow(/out of range/);
    await ckpt.close();
  });

  it("rejects bad headers naming the file and tensor", async () => {
    await expectBad(
      "short.safetensors",
      Buffer.from([1, 2, 3]),
      /short\.safetensors.*only 3 bytes/,
    );
    const huge = Buffer.alloc(16);
    huge.writeBigUInt64LE(1000n);
    await expectBad("huge.safetensors", huge, /huge\.safetensors.*header length 1000 does not fit/);
    const notJson = Buffer.concat([Buffer.from([4, 0, 0, 0, 0, 0, 0, 0]), Buffer.from("{abc")]);
    await expectBad("notjson.safetensors", notJson, /notjson\.safetensors.*not JSON/);
    await expectBad("array.safetensors", header([1, 2]), /not a JSON object/);
    await expectBad(
      "dtype.safetensors",
      header({ w: { dtype: "Q4", shape: [1], data_offsets: [0, 1] } }, Buffer.alloc(1)),
      /dtype\.safetensors: tensor w: unknown dtype "Q4"/,
    );
    await expectBad(
      "shape.safetensors",
      header({ w: { dtype: "F32", shape: [-1], data_offsets: [0, 4] } }, Buffer.alloc(4)),
      /tensor w: invalid shape/,
    );
    await expectBad(
      "size.safetensors",
      header({ w: { dtype: "F32", shape: [3], data_offsets: [0, 8] } }, Buffer.alloc(8)),
      /tensor w: data_offsets \[0, 8\] hold 8 bytes but F32 \[3\] needs 12/,
    );
    await expectBad(
      "trunc.safetensors",
      header({ w: { dtype: "F32", shape: [4], data_offsets: [0, 16] } }, Buffer.alloc(10)),
      /trunc\.safetensors: tensor w: data ends at byte .* \(truncated\?\)/,
    );
    await expectBad(
      "overlap.safetensors",
      header(
        {
          a: { dtype: "F32", shape: [2], data_offsets: [0, 8] },
          b: { dtype: "F32", shape: [2], data_offsets: [4, 12] },
        },
        Buffer.alloc(12),
      ),
      /tensors a and b overlap/,
    );
    await expectBad(
      "offsets.safetensors",
      header({ w: { dtype: "F32", shape: [1], data_offsets: [8] } }, Buffer.alloc(8)),
      /tensor w: invalid data_offsets/,
    );
  });

  it("detects a file truncated after it was written", async () => {
    const sub = await mkdtemp(join(dir, "trunc-"));
    const path = join(sub, "model.safetensors");
    await writeSafetensors(path, [
      { name: "w", dtype: "F32", shape: [64], data: Buffer.alloc(256) },
    ]);
    await truncate(path, 200);
    await expect(SafetensorsCheckpoint.open(sub, ["model.safetensors"])).rejects.toThrow(
      /model\.safetensors: tensor w: data ends at byte \d+ but the file has \d+ bytes/,
    );
  });

  it("follows model.safetensors.index.json across shards", async () => {
    const sub = await mkdtemp(join(dir, "sharded-"));
    await writeSafetensors(join(sub, "a.safetensors"), [
      { name: "x", dtype: "U8", shape: [1], data: Buffer.from([7]) },
    ]);
    await writeSafetensors(join(sub, "b.safetensors"), [
      { name: "y", dtype: "U8", shape: [1], data: Buffer.from([8]) },
    ]);
    await writeFile(
      join(sub, "model.safetensors.index.json"),
      JSON.stringify({ weight_map: { x: "a.safetensors", y: "b.safetensors" } }),
    );
    const ckpt = await SafetensorsCheckpoint.open(sub, [
      "a.safetensors",
      "b.safetensors",
      "model.safetensors.index.json",
    ]);
    expect([...(await ckpt.read(ckpt.get("y")!))]).toEqual([8]);
    expect(ckpt.files).toEqual(["model.safetensors.index.json", "a.safetensors", "b.safetensors"]);
    await ckpt.close();
  });

  it("rejects broken indexes: missing shard, escaping path, missing tensor, duplicates", async () => {
    const sub = await mkdtemp(join(dir, "badindex-"));
    await writeSafetensors(join(sub, "a.safetensors"), [
      { name: "x", dtype: "U8", shape: [1], data: Buffer.from([7]) },
    ]);
    const index = (map: Record<string, string>): Promise<void> =>
      writeFile(join(sub, "model.safetensors.index.json"), JSON.stringify({ weight_map: map }));
    await index({ x: "a.safetensors", y: "gone.safetensors" });
    await expect(SafetensorsCheckpoint.open(sub, [])).rejects.toThrow(
      /gone\.safetensors is missing/,
    );
    await index({ x: "../a.safetensors" });
    await expect(SafetensorsCheckpoint.open(sub, [])).rejects.toThrow(
      /maps x to "\.\.\/a\.safetensors"/,
    );
    await index({ x: "/etc/passwd" });
    await expect(SafetensorsCheckpoint.open(sub, [])).rejects.toThrow(
      /not a file inside the checkpoint/,
    );
    await index({ x: "a.safetensors", z: "a.safetensors" });
    await expect(SafetensorsCheckpoint.open(sub, [])).rejects.toThrow(
      /a\.safetensors has no tensor z/,
    );
    await rm(join(sub, "model.safetensors.index.json"));
    await writeSafetensors(join(sub, "b.safetensors"), [
      { name: "x", dtype: "U8", shape: [1], data: Buffer.from([1]) },
    ]);
    await expect(
      SafetensorsCheckpoint.open(sub, ["a.safetensors", "b.safetensors"]),
    ).rejects.toThrow(/tensor x appears in both a\.safetensors and b\.safetensors/);
  });
});
