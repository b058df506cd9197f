/**
 * The resume journal: one JSON object per line, appended and fsynced after the data it
 * describes has been fsynced. Line 1 is the header (which install, which plan); then one entry
 * per completed range with the SHA-256 of the source bytes fetched and of the bytes placed in
 * the model files, and, for shards whose whole-file hash is being computed, the hash state
 * after that range. A crash can only tear the last line, which is then ignored.
 */
import { open, readFile, type FileHandle } from "node:fs/promises";
import { dirname } from "node:path";
import { fsyncDir, writeFully } from "../fs.ts";

export interface JournalHeader {
  v: 1;
  repo: string;
  commit: string;
  /** InstallPlan.digest: entries are only valid for this plan. */
  plan: string;
}

export type JournalEntry =
  /** Range `r` is placed: `src` and `out` are SHA-256 of its source and placed bytes. */
  | { r: number; src: string; out: string; h?: string; h1?: string }
  /** Shard `reset` failed its whole-file check (attempt `attempt`): its ranges start over. */
  | { reset: number; attempt: number };

/** Reads a journal; null when it is missing or its header is unreadable. */
export async function readJournal(
  path: string,
): Promise<{ header: JournalHeader; entries: JournalEntry[] } | null> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch {
    return null;
  }
  const lines = text.split("\n");
  let header: JournalHeader;
  try {
    header = JSON.parse(lines[0] ?? "") as JournalHeader;
  } catch {
    return null;
  }
  if (header?.v !== 1 || typeof header.plan !== "string") return null;
  const entries: JournalEntry[] = [];
  for (const line of lines.slice(1)) {
    if (line === "") continue;
    try {
      entries.push(JSON.parse(line) as JournalEntry);
    } catch {
      break; // a torn last line: everything after it is unknown
    }
  }
  return { header, entries };
}

export class Journal {
  private constructor(
    private readonly handle: FileHandle,
    private readonly durable: boolean,
  ) {}

  /** Starts a new journal (replacing any old one) with `header`. */
  static async create(path: string, header: JournalHeader, durable: boolean): Promise<Journal> {
    const handle = await open(path, "w");
    const journal = new Journal(handle, durable);
    await journal.write(header);
    if (durable) await fsyncDir(dirname(path));
    return journal;
  }

  /** Continues an existing journal. A torn last line is cut off first. */
  static async append(path: string, durable: boolean): Promise<Journal> {
    const text = await readFile(path, "utf8");
    const cut = text.endsWith("\n") ? text.length : text.lastIndexOf("\n") + 1;
    const handle = await open(path, "r+");
    await handle.truncate(Buffer.byteLength(text.slice(0, cut)));
    return new Journal(handle, durable);
  }

  private position = -1;

  private async write(value: unknown): Promise<void> {
    if (this.position < 0) this.position = (await this.handle.stat()).size;
    const line = Buffer.from(JSON.stringify(value) + "\n");
    await writeFully(this.handle, line, this.position);
    this.position += line.length;
    if (this.durable) await this.handle.datasync();
  }

  async add(entry: JournalEntry): Promise<void> {
    await this.write(entry);
  }

  async close(): Promise<void> {
    await this.handle.close().catch(() => undefined);
  }
}
