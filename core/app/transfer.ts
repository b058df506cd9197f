/**
 * Export and import of conversations. Markdown is for reading (title, system prompt, each message
 * of the branch shown with its author, model, time and statistics line); JSON (ExportFileSchema,
 * docs/app.md) is for keeping: every conversation in the storage format, branches included,
 * which `importConversations` reads back as it was. The shells only move the text: web mode
 * downloads it, Electron writes it where the save dialog says.
 */
import { randomUUID } from "node:crypto";
import { z } from "zod";
import {
  type Conversation,
  ConversationSchema,
  EXPORT_FORMAT,
  EXPORT_VERSION,
  type ExportFile,
  ExportFileSchema,
  MAX_IMPORT_BYTES,
  type Message,
} from "./api.ts";
import { isConversationId, migrateConversation, type ConversationStore } from "./conversations.ts";
import { AppFailure } from "./errors.ts";
import { formatBytes } from "../units.ts";

/** `2026-12-01 21:30 UTC` from an ISO time (as stored); the text itself when it is not one. */
function when(iso: string): string {
  const m = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})/.exec(iso);
  return m ? `${m[1]} ${m[2]} UTC` : iso;
}

/** A file name from a title: letters and digits of any script, dashes between words. */
export function fileStem(title: string): string {
  const stem = title
    .normalize("NFC")
    .replace(/[^\p{L}\p{N}]+/gu, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 60)
    .replace(/-+$/g, "");
  return stem || "conversation";
}

/** Message text as a Markdown block: headings in it cannot pose as the export's own. */
function body(text: string): string {
  return text.trim() === "" ? "*(empty)*" : text.trimEnd();
}

function messageMarkdown(m: Message): string {
  const who = m.role === "user" ? "You" : `Assistant (${m.model ?? "unknown model"})`;
  const lines = [`### ${who} · ${when(m.createdAt)}`, "", body(m.content)];
  const notes: string[] = [];
  const versions = (m.otherVersions?.length ?? 0) + 1;
  if (versions > 1) notes.push(`version ${(m.versionIndex ?? versions - 1) + 1} of ${versions}`);
  if (m.stats && m.stats.generatedTokens > 0) notes.push(m.stats.line);
  if (m.finishReason === "cancelled") notes.push("stopped");
  if (m.finishReason === "length") notes.push("stopped at the token limit");
  if (m.error) notes.push(`error: ${m.error.message}`);
  if (notes.length > 0) lines.push("", `*${notes.join(" · ")}*`);
  return lines.join("\n");
}

/** One conversation as Markdown: the branch shown (the JSON export keeps the others). */
export function conversationMarkdown(c: Conversation): string {
  const parts = [
    `# ${c.title.replace(/\n/g, " ")}`,
    "",
    `Created ${when(c.createdAt)}, last message ${when(c.updatedAt)}${c.pinned ? " · pinned" : ""}`,
  ];
  if (c.systemPrompt.trim() !== "") {
    parts.push(
      "",
      "**System prompt**",
      "",
      ...c.systemPrompt
        .trimEnd()
        .split("\n")
        .map((l) => `> ${l}`),
    );
  }
  for (const m of c.messages) parts.push("", "---", "", messageMarkdown(m));
  return parts.join("\n") + "\n";
}

export function exportMarkdown(conversations: Conversation[]): string {
  return conversations.map(conversationMarkdown).join("\n\n");
}

export function exportJson(conversations: Conversation[], now: Date = new Date()): string {
  const file: ExportFile = {
    format: EXPORT_FORMAT,
    version: EXPORT_VERSION,
    exportedAt: now.toISOString(),
    conversations,
  };
  return JSON.stringify(file, null, 1) + "\n";
}

export interface ExportedFile {
  filename: string;
  mimeType: string;
  content: string;
}

/** The file for `chat.export`: one conversation is named after its title, several after the day. */
export function exportFile(
  conversations: Conversation[],
  format: "markdown" | "json",
  now: Date = new Date(),
): ExportedFile {
  const stem =
    conversations.length === 1
      ? fileStem(conversations[0]!.title)
      : `redwing-conversations-${now.toISOString().slice(0, 10)}`;
  return format === "markdown"
    ? { filename: `${stem}.md`, mimeType: "text/markdown", content: exportMarkdown(conversations) }
    : {
        filename: `${stem}.json`,
        mimeType: "application/json",
        content: exportJson(conversations, now),
      };
}

function badImport(message: string): AppFailure {
  return new AppFailure("bad_import", message, null);
}

/** Where and why a zod check failed, in words. */
function firstIssue(error: z.ZodError): string {
  const issue = error.issues[0]!;
  const where = issue.path.map(String).join(".");
  return where ? `${where}: ${issue.message}` : issue.message;
}

/**
 * The conversations of a JSON export, or of one conversation file (`<id>.json` from the data
 * directory), validated; AppFailure `bad_import` saying what is wrong otherwise.
 */
export function parseImport(data: string): Conversation[] {
  const bytes = Buffer.byteLength(data, "utf8");
  if (bytes > MAX_IMPORT_BYTES) {
    throw badImport(
      `The file is ${formatBytes(bytes)}; Redwing imports files up to ${formatBytes(MAX_IMPORT_BYTES)}. Export fewer conversations per file.`,
    );
  }
  let json: unknown;
  try {
    json = JSON.parse(data);
  } catch (error) {
    throw badImport(
      `This file is not JSON (${(error as Error).message}); import reads the JSON that Export writes.`,
    );
  }
  const record = json !== null && typeof json === "object" ? (json as Record<string, unknown>) : {};
  if (record.format === EXPORT_FORMAT) {
    if (typeof record.version === "number" && record.version > EXPORT_VERSION) {
      throw badImport(
        `This export is version ${record.version}; this Redwing reads version ${EXPORT_VERSION}. Update Redwing to import it.`,
      );
    }
    const parsed = ExportFileSchema.safeParse(json);
    if (!parsed.success) {
      throw badImport(
        `This export is damaged (${firstIssue(parsed.error)}); nothing was imported.`,
      );
    }
    return parsed.data.conversations;
  }
  if ("messages" in record && "id" in record) {
    const parsed = ConversationSchema.safeParse(json);
    if (!parsed.success) {
      throw badImport(
        `This conversation file is damaged (${firstIssue(parsed.error)}); nothing was imported.`,
      );
    }
    return [parsed.data];
  }
  throw badImport(
    'This is not a Redwing conversations export (JSON with format "redwing-conversations"); nothing was imported.',
  );
}

/**
 * Adds the conversations of `data` to the store as they were (dates, pin, branches), never
 * replacing one: a conversation whose id is taken (or cannot name a file) gets a new one. All or nothing: when a write
 * fails, the ones already written are removed again.
 */
export async function importConversations(
  store: ConversationStore,
  data: string,
): Promise<Conversation[]> {
  const incoming = parseImport(data);
  const taken = new Set<string>();
  const ready: Conversation[] = [];
  for (const c of incoming) {
    const migrated = migrateConversation(c);
    let id = migrated.id;
    // A name no file can have (`../x`) is replaced like a taken one.
    if (!isConversationId(id) || taken.has(id) || (await store.has(id))) id = randomUUID();
    taken.add(id);
    ready.push({ ...migrated, id });
  }
  const written: Conversation[] = [];
  try {
    for (const c of ready) written.push(await store.save(c, false));
  } catch (error) {
    await Promise.all(written.map((c) => store.delete(c.id).catch(() => undefined)));
    throw error;
  }
  return written;
}
