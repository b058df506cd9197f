/**
 * Conversations on disk: one JSON file per conversation in `<dataDir>/conversations/<id>.json`,
 * written atomically (temporary file, fsync, rename, fsync of the directory), so a crash or a
 * full disk leaves either the old or the new version, never half a file. Files are validated
 * with ConversationSchema when read; one that fails is renamed aside
 * (`<id>.json.corrupt-<time>`) and skipped, never fatal.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { mkdir, open, readdir, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import {
  type Conversation,
  ConversationSchema,
  type ConversationSummary,
  type Message,
  type MessageVersion,
} from "./api.ts";
import { AppFailure } from "./errors.ts";

/** The title of a conversation nobody named yet; the first user message replaces it. */
export const UNTITLED = "New chat";
const TITLE_CHARS = 60;
const ID_RE = /^[A-Za-z0-9_-]{1,100}$/;

/** A title from the first line of a message: at most 60 characters, cut at a word. */
export function titleFrom(text: string): string {
  const line = text.trim().split("\n")[0]!.replace(/\s+/g, " ").trim();
  if (line.length <= TITLE_CHARS) return line || UNTITLED;
  const cut = line.slice(0, TITLE_CHARS - 1);
  const space = cut.lastIndexOf(" ");
  return `${space > TITLE_CHARS / 2 ? cut.slice(0, space) : cut}…`;
}

/** Versions kept per reply; Regenerate beyond this forgets the oldest. */
export const MAX_VERSIONS = 100;

function versionOf(m: Message): MessageVersion {
  const v: MessageVersion = { id: m.id, content: m.content, createdAt: m.createdAt };
  if (m.model !== undefined) v.model = m.model;
  if (m.stats !== undefined) v.stats = m.stats;
  if (m.finishReason !== undefined) v.finishReason = m.finishReason;
  if (m.error !== undefined) v.error = m.error;
  if (m.contextNote !== undefined) v.contextNote = m.contextNote;
  return v;
}

/**
 * Every version of a reply, oldest first: the message itself at its `versionIndex` among its
 * `otherVersions` (a message stored before versions existed, or never regenerated, has one).
 */
export function replyVersions(m: Message): MessageVersion[] {
  const others = m.otherVersions ?? [];
  const at = Math.min(m.versionIndex ?? others.length, others.length);
  return [...others.slice(0, at), versionOf(m), ...others.slice(at)];
}

function withVersions(role: Message["role"], all: MessageVersion[], index: number): Message {
  const others = all.filter((_, i) => i !== index);
  const shown: Message = { role, ...all[index]! };
  return others.length > 0 ? { ...shown, otherVersions: others, versionIndex: index } : shown;
}

/** A new reply written by Regenerate in place of `previous`, keeping its versions before it. */
export function regeneratedReply(previous: Message, reply: Message): Message {
  const all = [...replyVersions(previous), versionOf(reply)].slice(-MAX_VERSIONS);
  return withVersions(reply.role, all, all.length - 1);
}

/** The reply showing its version `index` (0 = oldest); AppFailure when there is no such one. */
export function showVersion(m: Message, index: number): Message {
  const all = replyVersions(m);
  if (m.role !== "assistant" || index >= all.length) {
    throw new AppFailure(
      "version_not_found",
      `That reply has no version ${index + 1}; it has ${all.length}.`,
      null,
    );
  }
  return withVersions(m.role, all, index);
}

function summaryOf(c: Conversation): ConversationSummary {
  return { id: c.id, title: c.title, updatedAt: c.updatedAt, messageCount: c.messages.length };
}

async function fsyncDir(dir: string): Promise<void> {
  const h = await open(dir, "r");
  try {
    await h.sync();
  } catch {
    // Some file systems cannot fsync a directory; the rename is still atomic.
  } finally {
    await h.close();
  }
}

/** Writes `data` to `path` atomically: a crash leaves the old file or the new one. */
export async function writeFileAtomic(path: string, data: string): Promise<void> {
  const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    const h = await open(tmp, "w");
    try {
      await h.writeFile(data, "utf8");
      await h.sync();
    } finally {
      await h.close();
    }
    await rename(tmp, path);
  } catch (error) {
    await rm(tmp, { force: true });
    throw error;
  }
  await fsyncDir(join(path, ".."));
}

export class ConversationStore {
  private readonly cache = new Map<string, Conversation>();
  private loaded: Promise<void> | null = null;
  /** Writes per conversation, in order (a later save never lands before an earlier one). */
  private readonly writes = new Map<string, Promise<void>>();

  constructor(
    readonly dir: string,
    private readonly log: (line: string) => void = () => undefined,
    private readonly now: () => Date = () => new Date(),
  ) {}

  /** Reads every file once; corrupt ones are moved aside. */
  private load(): Promise<void> {
    this.loaded ??= (async () => {
      await mkdir(this.dir, { recursive: true });
      for (const name of await readdir(this.dir)) {
        if (!name.endsWith(".json")) continue;
        const id = name.slice(0, -".json".length);
        const path = join(this.dir, name);
        try {
          const parsed = ConversationSchema.parse(JSON.parse(await readFile(path, "utf8")));
          if (parsed.id !== id) throw new Error(`it holds conversation ${parsed.id}`);
          this.cache.set(id, parsed);
        } catch (error) {
          const aside = `${path}.corrupt-${this.now().toISOString().replace(/[:.]/g, "-")}`;
          await rename(path, aside).catch(() => undefined);
          this.log(
            `conversation file ${path} is damaged (${(error as Error).message.split("\n")[0]}); moved it to ${aside}`,
          );
        }
      }
    })();
    return this.loaded;
  }

  /** Newest first. */
  async list(): Promise<ConversationSummary[]> {
    await this.load();
    return [...this.cache.values()]
      .sort((a, b) => b.updatedAt.localeCompare(a.updatedAt) || a.id.localeCompare(b.id))
      .map(summaryOf);
  }

  /** A copy of the conversation; AppFailure not_found when there is none. */
  async get(id: string): Promise<Conversation> {
    await this.load();
    const c = ID_RE.test(id) ? this.cache.get(id) : undefined;
    if (!c) {
      throw new AppFailure(
        "conversation_not_found",
        "This conversation does not exist any more.",
        null,
        id,
      );
    }
    return structuredClone(c);
  }

  async create(title?: string, systemPrompt = ""): Promise<Conversation> {
    await this.load();
    const at = this.now().toISOString();
    const c: Conversation = {
      id: randomUUID(),
      title: title?.trim() || UNTITLED,
      systemPrompt,
      createdAt: at,
      updatedAt: at,
      messages: [],
    };
    await this.save(c);
    return structuredClone(c);
  }

  /**
   * Stores `c` (stamping updatedAt unless `touch` is false) and names an untitled conversation
   * after its first user message. Returns the stored copy.
   */
  async save(c: Conversation, touch = true): Promise<Conversation> {
    await this.load();
    if (!ID_RE.test(c.id)) throw new Error(`bad conversation id ${JSON.stringify(c.id)}`);
    const stored = structuredClone(c);
    if (touch) stored.updatedAt = this.now().toISOString();
    if (stored.title === UNTITLED) {
      const first = stored.messages.find((m) => m.role === "user");
      if (first) stored.title = titleFrom(first.content);
    }
    ConversationSchema.parse(stored);
    this.cache.set(stored.id, stored);
    const path = join(this.dir, `${stored.id}.json`);
    const data = JSON.stringify(stored, null, 1) + "\n";
    const previous = this.writes.get(stored.id) ?? Promise.resolve();
    const write = previous.catch(() => undefined).then(() => writeFileAtomic(path, data));
    this.writes.set(stored.id, write);
    try {
      await write;
    } finally {
      if (this.writes.get(stored.id) === write) this.writes.delete(stored.id);
    }
    return structuredClone(stored);
  }

  /**
   * Shows version `index` of reply `messageId` (Regenerate keeps earlier replies): that version is
   * then the message's text, the one later turns build on. Not a new activity: updatedAt stays.
   */
  async selectVersion(
    conversationId: string,
    messageId: string,
    index: number,
  ): Promise<Conversation> {
    const c = await this.get(conversationId);
    const i = c.messages.findIndex((m) => m.id === messageId);
    if (i === -1) {
      throw new AppFailure(
        "message_not_found",
        "That reply is not in this conversation any more.",
        null,
      );
    }
    c.messages[i] = showVersion(c.messages[i]!, index);
    return this.save(c, false);
  }

  async delete(id: string): Promise<void> {
    await this.get(id); // not found: AppFailure
    this.cache.delete(id);
    await (this.writes.get(id) ?? Promise.resolve()).catch(() => undefined);
    await rm(join(this.dir, `${id}.json`), { force: true });
  }

  /** Waits for every write under way. */
  async flush(): Promise<void> {
    await Promise.all([...this.writes.values()].map((w) => w.catch(() => undefined)));
  }
}
