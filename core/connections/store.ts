/**
 * The saved OpenAI-compatible endpoints (docs/remote.md): a name, a base URL and an optional API
 * key, in `<data dir>/connections.json`. The file is written 0600 and checked on every read: a
 * file others may read gets its permissions put back (and a notice says so), since it can hold
 * keys. Keys never leave this module except to the client that sends them: the views answer
 * whether there is one and where it is kept, never the key.
 */
import { randomUUID } from "node:crypto";
import { chmod, mkdir, readFile, rename, stat, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { z } from "zod";
import { UserError } from "../errors.ts";
import { storeKey, type SecretBox } from "./secrets.ts";
import { checkBaseUrl } from "./url.ts";

export const CONNECTIONS_FILE = "connections.json";

const StoredKeySchema = z.discriminatedUnion("storage", [
  z.object({ storage: z.literal("keychain"), sealed: z.string() }),
  z.object({ storage: z.literal("file"), key: z.string() }),
]);

const StoredConnectionSchema = z.object({
  id: z.string().min(1),
  name: z.string().min(1),
  baseUrl: z.string().min(1),
  key: StoredKeySchema.nullable(),
});
type StoredConnection = z.infer<typeof StoredConnectionSchema>;

const FileSchema = z.object({
  version: z.literal(1),
  connections: z.array(StoredConnectionSchema),
});

/** A connection as the UI sees it: no key. */
export interface ConnectionView {
  id: string;
  name: string;
  baseUrl: string;
  /** Where its API key is kept; null: none. */
  keyStorage: "keychain" | "file" | null;
  /** A risk to know about (a key sent in clear over http), or null. */
  warning: string | null;
}

export interface ConnectionInput {
  name: string;
  baseUrl: string;
  /** undefined: keep (update) or none (add); null or "": remove. */
  apiKey?: string | null;
}

/** What a client needs to reach a connection. */
export interface Endpoint {
  name: string;
  baseUrl: string;
  apiKey: string | null;
}

const MAX_NAME = 100;

export class ConnectionStore {
  private connections: StoredConnection[] = [];
  private writing: Promise<void> = Promise.resolve();

  private constructor(
    private readonly path: string,
    private readonly box: SecretBox | null,
    private readonly notice: (text: string) => void,
  ) {}

  /**
   * Reads `<dataDir>/connections.json` (none yet: an empty list). A damaged file is set aside
   * (connections.json.bad) with a notice rather than lost on the next save.
   */
  static async open(
    dataDir: string,
    options: { secretBox?: SecretBox | null; notice?: (text: string) => void } = {},
  ): Promise<ConnectionStore> {
    const store = new ConnectionStore(
      join(dataDir, CONNECTIONS_FILE),
      options.secretBox ?? null,
      options.notice ?? (() => undefined),
    );
    await store.load();
    return store;
  }

  private async load(): Promise<void> {
    let text: string;
    try {
      await this.fixPermissions();
      text = await readFile(this.path, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
      throw error;
    }
    const parsed = (() => {
      try {
        return FileSchema.safeParse(JSON.parse(text));
      } catch {
        return null;
      }
    })();
    if (!parsed?.success) {
      const aside = `${this.path}.bad`;
      await rename(this.path, aside);
      this.notice(
        `The connections file could not be read; it was kept as ${aside} and the connection list starts empty.`,
      );
      return;
    }
    this.connections = parsed.data.connections;
  }

  /** A file others can read (or write) is put back to 0600, with a notice. */
  private async fixPermissions(): Promise<void> {
    if (process.platform === "win32") return; // ACLs, not modes: the profile folder is private
    const { mode } = await stat(this.path);
    if ((mode & 0o077) !== 0) {
      await chmod(this.path, 0o600);
      this.notice(
        `${this.path} could be read by other users (mode ${(mode & 0o777).toString(8)}); its permissions were set back to 0600. If others share this machine, consider changing the API keys in it.`,
      );
    }
  }

  list(): ConnectionView[] {
    return this.connections.map((c) => this.view(c));
  }

  get(id: string): ConnectionView {
    return this.view(this.find(id));
  }

  /** The connection with its key, for the client. */
  async endpoint(id: string): Promise<Endpoint> {
    await this.fixPermissions().catch(() => undefined);
    const c = this.find(id);
    return { name: c.name, baseUrl: c.baseUrl, apiKey: this.keyOf(c) };
  }

  async add(input: ConnectionInput): Promise<ConnectionView> {
    const name = this.checkName(input.name, null);
    const key = input.apiKey ? input.apiKey.trim() : "";
    const { url } = checkBaseUrl(input.baseUrl, key !== "");
    const c: StoredConnection = {
      id: randomUUID(),
      name,
      baseUrl: url,
      key: key !== "" ? storeKey(key, this.box) : null,
    };
    this.connections = [...this.connections, c];
    await this.save();
    return this.view(c);
  }

  async update(id: string, patch: Partial<ConnectionInput>): Promise<ConnectionView> {
    const old = this.find(id);
    const next: StoredConnection = { ...old };
    if (patch.name !== undefined) next.name = this.checkName(patch.name, id);
    if (patch.apiKey !== undefined) {
      const key = patch.apiKey?.trim() ?? "";
      next.key = key !== "" ? storeKey(key, this.box) : null;
    }
    next.baseUrl = checkBaseUrl(patch.baseUrl ?? old.baseUrl, next.key !== null).url;
    this.connections = this.connections.map((c) => (c.id === id ? next : c));
    await this.save();
    return this.view(next);
  }

  async remove(id: string): Promise<void> {
    this.find(id);
    this.connections = this.connections.filter((c) => c.id !== id);
    await this.save();
  }

  private find(id: string): StoredConnection {
    const c = this.connections.find((x) => x.id === id);
    if (!c) throw new UserError("That connection does not exist (it was removed).", "not_found");
    return c;
  }

  private checkName(input: string, id: string | null): string {
    const name = input.trim();
    if (name === "" || name.length > MAX_NAME) {
      throw new UserError(`a connection needs a name of 1 to ${MAX_NAME} characters`, "bad_name");
    }
    if (this.connections.some((c) => c.id !== id && c.name.toLowerCase() === name.toLowerCase())) {
      throw new UserError(`there is already a connection named "${name}"`, "bad_name");
    }
    return name;
  }

  private keyOf(c: StoredConnection): string | null {
    if (!c.key) return null;
    if (c.key.storage === "file") return c.key.key;
    if (!this.box?.isAvailable()) {
      throw new UserError(
        `The API key of "${c.name}" is kept in the OS keychain, which this session cannot read (the browser UI, or the keyring is locked). Open the desktop app, or enter the key again in Connections.`,
        "remote_key_unreadable",
      );
    }
    try {
      return this.box.decrypt(Buffer.from(c.key.sealed, "base64"));
    } catch {
      throw new UserError(
        `The API key of "${c.name}" could not be decrypted from the OS keychain (it was saved by another user or machine). Enter it again in Connections.`,
        "remote_key_unreadable",
      );
    }
  }

  private view(c: StoredConnection): ConnectionView {
    return {
      id: c.id,
      name: c.name,
      baseUrl: c.baseUrl,
      keyStorage: c.key?.storage ?? null,
      warning: checkBaseUrl(c.baseUrl, c.key !== null).warning,
    };
  }

  /** Writes the whole list atomically, 0600 from its first byte; saves run one at a time. */
  private save(): Promise<void> {
    const data = `${JSON.stringify({ version: 1, connections: this.connections }, null, 2)}\n`;
    const write = async (): Promise<void> => {
      await mkdir(dirname(this.path), { recursive: true });
      const temp = `${this.path}.${process.pid}.tmp`;
      await writeFile(temp, data, { mode: 0o600 });
      // The mode above is masked by the umask only towards fewer rights; set it exactly anyway.
      await chmod(temp, 0o600);
      await rename(temp, this.path);
    };
    const next = this.writing.then(write, write);
    this.writing = next.catch(() => undefined);
    return next;
  }
}
