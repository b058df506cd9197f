/** The connection store: URL checks, keys in a 0600 file or sealed by a (fake) OS keychain. */
import { chmod, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { SecretBox } from "./secrets.ts";
import { CONNECTIONS_FILE, ConnectionStore } from "./store.ts";
import { checkBaseUrl } from "./url.ts";

/** Stands in for Electron's safeStorage: reversible, and visibly not the plain key. */
function fakeBox(available = true): SecretBox & { sealed: number } {
  const box = {
    sealed: 0,
    isAvailable: () => available,
    encrypt(plain: string): Buffer {
      box.sealed++;
      return Buffer.from(`sealed:${[...plain].reverse().join("")}`);
    },
    decrypt(sealed: Buffer): string {
      const text = sealed.toString();
      if (!text.startsWith("sealed:")) throw new Error("not ours");
      return [...text.slice(7)].reverse().join("");
    },
  };
  return box;
}

const modeOf = async (path: string): Promise<number> => (await stat(path)).mode & 0o777;

describe("checkBaseUrl", () => {
  it("takes http and https, adds /v1 to a bare address, drops a trailing slash", () => {
    expect(checkBaseUrl("http://127.0.0.1:8080", false)).toEqual({
      url: "http://127.0.0.1:8080/v1",
      warning: null,
    });
    expect(checkBaseUrl(" https://gpu.example.com/v1/ ", true)).toEqual({
      url: "https://gpu.example.com/v1",
      warning: null,
    });
    expect(checkBaseUrl("http://localhost:8000/api/v1", true).warning).toBeNull();
    expect(checkBaseUrl("http://[::1]:8000/v1", true).warning).toBeNull();
  });

  it("warns that a key would go in clear over http to another machine", () => {
    expect(checkBaseUrl("http://10.0.0.5:8000/v1", true).warning).toMatch(
      /API key would be sent in clear over http to 10\.0\.0\.5:8000/,
    );
    expect(checkBaseUrl("http://gpu-box:8000/v1", false).warning).toMatch(/in clear over http/);
  });

  it("refuses other schemes, non-URLs and credentials in the URL", () => {
    expect(() => checkBaseUrl("ftp://host/v1", false)).toThrow(/ftp URLs are not supported/);
    expect(() => checkBaseUrl("gpu-box:8000", false)).toThrow(/not supported|not a URL/);
    expect(() => checkBaseUrl("not a url", false)).toThrow(/is not a URL/);
    expect(() => checkBaseUrl("http://user:pw@host/v1", true)).toThrow(/its own field/);
  });
});

describe("ConnectionStore", () => {
  let dir: string;
  let notices: string[];
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "redwing-connections-"));
    notices = [];
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  const open = (secretBox: SecretBox | null = null) =>
    ConnectionStore.open(dir, { secretBox, notice: (t) => notices.push(t) });
  const file = () => join(dir, CONNECTIONS_FILE);

  it.skipIf(process.platform === "win32")(
    "keeps a key in a file only the user can read, and puts the permissions back on read",
    async () => {
      const store = await open();
      const view = await store.add({
        name: "GPU box",
        baseUrl: "http://127.0.0.1:8000",
        apiKey: "sk-secret",
      });
      expect(view).toMatchObject({
        name: "GPU box",
        baseUrl: "http://127.0.0.1:8000/v1",
        keyStorage: "file",
        warning: null,
      });
      expect(JSON.stringify(view)).not.toContain("sk-secret");
      expect(await modeOf(file())).toBe(0o600);
      expect((await store.endpoint(view.id)).apiKey).toBe("sk-secret");

      await chmod(file(), 0o644);
      const again = await open();
      expect(await modeOf(file())).toBe(0o600);
      expect(notices.join("\n")).toMatch(/could be read by other users \(mode 644\).*0600/);
      expect(again.list()).toEqual([view]);
    },
  );

  it("seals the key with the OS keychain when there is one", async () => {
    const box = fakeBox();
    const store = await open(box);
    const view = await store.add({ name: "a", baseUrl: "https://x.example/v1", apiKey: "sk-1" });
    expect(view.keyStorage).toBe("keychain");
    expect(box.sealed).toBe(1);
    const text = await readFile(file(), "utf8");
    expect(text).not.toContain("sk-1");
    expect((await (await open(box)).endpoint(view.id)).apiKey).toBe("sk-1");

    // Without the keychain (web mode) the key cannot be read: said plainly, nothing lost.
    const web = await open(null);
    await expect(web.endpoint(view.id)).rejects.toThrow(/kept in the OS keychain/);
    // An unavailable keychain (Linux without a keyring) means the 0600 file.
    const other = await open(fakeBox(false));
    const plain = await other.add({ name: "b", baseUrl: "https://y.example", apiKey: "sk-2" });
    expect(plain.keyStorage).toBe("file");
  });

  it("edits, removes the key, renames, refuses duplicates, removes", async () => {
    const store = await open();
    const a = await store.add({ name: "a", baseUrl: "http://gpu:8000/v1", apiKey: "k" });
    expect(a.warning).toMatch(/API key would be sent in clear/);
    const edited = await store.update(a.id, { apiKey: null, name: "gpu" });
    expect(edited).toMatchObject({ name: "gpu", keyStorage: null });
    expect(edited.warning).toMatch(/conversation goes in clear/);
    expect((await store.endpoint(a.id)).apiKey).toBeNull();
    await store.add({ name: "b", baseUrl: "http://127.0.0.1:1/v1" });
    await expect(store.update(a.id, { name: "B" })).rejects.toThrow(/already a connection named/);
    await expect(store.add({ name: "c", baseUrl: "file:///etc/passwd" })).rejects.toThrow(
      /file URLs are not supported/,
    );
    await store.remove(a.id);
    expect((await open()).list().map((c) => c.name)).toEqual(["b"]);
    await expect(store.remove(a.id)).rejects.toThrow(/does not exist/);
  });

  it("sets a damaged file aside instead of losing it", async () => {
    await writeFile(file(), "{ not json", { mode: 0o600 });
    const store = await open();
    expect(store.list()).toEqual([]);
    expect(notices.join("\n")).toMatch(
      /could not be read; it was kept as .*connections\.json\.bad/,
    );
    expect(await readFile(`${file()}.bad`, "utf8")).toBe("{ not json");
  });
});
