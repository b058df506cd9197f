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
  CONVERSATION_FORMAT,
  type Conversation,
  ConversationSchema,
  type ConversationSummary,
  type Message,
  MAX_VERSIONS,
  type MessageVersion,
} from "./api.ts";
import { AppFailure } from "./errors.ts";
import { SearchIndex, type SearchHit } from "./conversation-search.ts";

/** The title of a conversation nobody named yet; the first user message replaces it. */
export const UNTITLED = "New chat";
const TITLE_CHARS = 60;
const ID_RE = /^[A-Za-z0-9_-]{1,100}$/;

/** Whether `id` can name a conversation file (letters, digits, `_` and `-`). */
export function isConversationId(id: string): boolean {
  return ID_RE.test(id);
}

/** A title from the first line of a message: at most 60 characters, cut at a word. */
export function titleFrom(text: string): string {
  const line = text.trim().split("\n")[0]!.replace(/\s+/g, " ").trim();
  if (line.length <= TITLE_CHARS) return line || UNTITLED;
  const cut = line.slice(0, TITLE_CHARS - 1);
  const space = cut.lastIndexOf(" ");
  return `${space > TITLE_CHARS / 2 ? cut.slice(0, space) : cut}…`;
}

export { MAX_VERSIONS };

/** A message's own fields as a version (no role, no other versions, no branch). */
function versionOf(m: Message | MessageVersion): MessageVersion {
  const v: MessageVersion = { id: m.id, content: m.content, createdAt: m.createdAt };
  if (m.model !== undefined) v.model = m.model;
  if (m.stats !== undefined) v.stats = m.stats;
  if (m.finishReason !== undefined) v.finishReason = m.finishReason;
  if (m.error !== undefined) v.error = m.error;
  if (m.contextNote !== undefined) v.contextNote = m.contextNote;
  return v;
}

/**
 * Every version of a message, oldest first: the message itself at its `versionIndex` among its
 * `otherVersions` (a message stored before versions existed, or never regenerated nor edited,
 * has one). The shown one carries no `after` (its later messages are the conversation's).
 */
export function replyVersions(m: Message): MessageVersion[] {
  const others = m.otherVersions ?? [];
  const at = Math.min(m.versionIndex ?? others.length, others.length);
  return [...others.slice(0, at), versionOf(m), ...others.slice(at)];
}

/** The message showing `all[index]`, the others kept with their branches. */
function withVersions(role: Message["role"], all: MessageVersion[], index: number): Message {
  const others = all.filter((_, i) => i !== index);
  const shown: Message = { role, ...versionOf(all[index]!) };
  return others.length > 0 ? { ...shown, otherVersions: others, versionIndex: index } : shown;
}

/** Every version of messages[i], the shown one carrying the messages after it as its branch. */
function branchesAt(messages: Message[], i: number): MessageVersion[] {
  const m = messages[i]!;
  const after = messages.slice(i + 1);
  const all = replyVersions(m);
  const shown = Math.min(m.versionIndex ?? all.length - 1, all.length - 1);
  if (after.length > 0) all[shown] = { ...all[shown]!, after };
  return all;
}

/**
 * A new branch at messages[i]: `fresh` (a reply written again, or a user message edited) takes
 * its place as the newest version; the one shown before is kept with the messages that followed
 * it. Returns the new branch, which ends at `fresh`. Beyond MAX_VERSIONS the oldest is forgotten.
 */
export function branchAt(messages: Message[], i: number, fresh: Message): Message[] {
  const all = [...branchesAt(messages, i), versionOf(fresh)].slice(-MAX_VERSIONS);
  return [...messages.slice(0, i), withVersions(fresh.role, all, all.length - 1)];
}

/**
 * Shows version `index` (0 = oldest) of messages[i], and the messages of its branch after it; the
 * branch shown before is kept. AppFailure when there is no such version.
 */
export function switchBranch(messages: Message[], i: number, index: number): Message[] {
  const all = branchesAt(messages, i);
  if (index >= all.length) {
    throw new AppFailure(
      "version_not_found",
      `That message has no version ${index + 1}; it has ${all.length}.`,
      null,
    );
  }
  const chosen = all[index]!;
  return [
    ...messages.slice(0, i),
    withVersions(messages[i]!.role, all, index),
    ...(chosen.after ?? []),
  ];
}

/** A reply written again in place of `previous` (the last message), keeping it as a version. */
export function regeneratedReply(previous: Message, reply: Message): Message {
  return branchAt([previous], 0, reply)[0]!;
}

/** The reply showing its version `index` (0 = oldest); AppFailure when there is no such one. */
export function showVersion(m: Message, index: number): Message {
  return switchBranch([m], 0, index)[0]!;
}

/**
 * Format 1 (no `format`): a message's other versions shared the messages after it, whichever was
 * shown. Format 2 gives each version its own branch: each version kept gets a copy of them, so
 * switching shows what it showed before.
 */
export function migrateConversation(c: Conversation): Conversation {
  if (c.format === CONVERSATION_FORMAT) return c;
  // From the end, so the messages copied into a branch are migrated already.
  const messages = [...c.messages];
  for (let i = messages.length - 2; i >= 0; i--) {
    const m = messages[i]!;
    if (!m.otherVersions?.length) continue;
    const after = messages.slice(i + 1);
    messages[i] = {
      ...m,
      otherVersions: m.otherVersions.map((v) => ({ ...v, after: structuredClone(after) })),
    };
  }
  return { ...c, format: CONVERSATION_FORMAT, messages };
}

function summaryOf(c: Conversation): ConversationSummary {
  return {
    id: c.id,
    title: c.title,
    updatedAt: c.updatedAt,
    messageCount: c.messages.length,
    pinned: c.pinned === true,
  };
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
  private readonly index = new SearchIndex();
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
          // Migrated in memory; the file is rewritten in the new format on its next save.
          this.remember(migrateConversation(parsed));
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

  private remember(c: Conversation): void {
    this.cache.set(c.id, c);
    this.index.set(c);
  }

  /** Pinned first, then newest first. */
  async list(): Promise<ConversationSummary[]> {
    await this.load();
    return [...this.cache.values()]
      .sort(
        (a, b) =>
          Number(b.pinned === true) - Number(a.pinned === true) ||
          b.updatedAt.localeCompare(a.updatedAt) ||
          a.id.localeCompare(b.id),
      )
      .map(summaryOf);
  }

  /** Titles and the messages shown, case- and diacritics-insensitive (core/app/conversation-search.ts). */
  async search(query: string, limit?: number): Promise<SearchHit[]> {
    await this.load();
    return this.index.search(query, limit);
  }

  /** Every conversation, copies, in list order. */
  async all(): Promise<Conversation[]> {
    const list = await this.list();
    return list.map((s) => structuredClone(this.cache.get(s.id)!));
  }

  /** Whether a conversation with this id exists. */
  async has(id: string): Promise<boolean> {
    await this.load();
    return this.cache.has(id);
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
      format: CONVERSATION_FORMAT,
      title: title?.trim() || UNTITLED,
      systemPrompt,
      createdAt: at,
      updatedAt: at,
      messages: [],
    };
    return this.save(c, false);
  }

  /**
   * Stores `c` (stamping updatedAt unless `touch` is false) and names an untitled conversation
   * after its first user message. Returns the stored copy.
   */
  async save(c: Conversation, touch = true): Promise<Conversation> {
    await this.load();
    if (!ID_RE.test(c.id)) throw new Error(`bad conversation id ${JSON.stringify(c.id)}`);
    const stored = structuredClone(c);
    stored.format = CONVERSATION_FORMAT;
    if (touch) stored.updatedAt = this.now().toISOString();
    if (stored.title === UNTITLED) {
      const first = stored.messages.find((m) => m.role === "user");
      if (first) stored.title = titleFrom(first.content);
    }
    ConversationSchema.parse(stored);
    this.remember(stored);
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
   * Shows version `index` of message `messageId` and the branch that followed it (Regenerate and
   * Edit keep the earlier ones): that branch is then the one shown and the one the model sees.
   * Not a new activity: updatedAt stays.
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
        "That message is not in this conversation any more.",
        null,
      );
    }
    c.messages = switchBranch(c.messages, i, index);
    return this.save(c, false);
  }

  /** Pins a conversation to the top of the list, or unpins it; updatedAt stays. */
  async setPinned(id: string, pinned: boolean): Promise<Conversation> {
    const c = await this.get(id);
    if (pinned) c.pinned = true;
    else delete c.pinned;
    return this.save(c, false);
  }

  async delete(id: string): Promise<void> {
    await this.get(id); // not found: AppFailure
    this.cache.delete(id);
    this.index.delete(id);
    await (this.writes.get(id) ?? Promise.resolve()).catch(() => undefined);
    await rm(join(this.dir, `${id}.json`), { force: true });
  }

  /** Waits for every write under way. */
  async flush(): Promise<void> {
    await Promise.all([...this.writes.values()].map((w) => w.catch(() => undefined)));
  }
}
