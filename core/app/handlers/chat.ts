/**
 * `chat.*`: conversations (list, get, create, rename, system prompt, delete, pin, search, export,
 * import) from the store (core/app/conversations.ts, search.ts, transfer.ts), and replies (send,
 * regenerate, select a version, edit, stop), passed straight through to ChatManager
 * (core/app/chat.ts).
 */
import type { AppContext } from "../context.ts";
import { AppFailure } from "../errors.ts";
import { exportFile, importConversations } from "../transfer.ts";
import type { HandlerGroup } from "./group.ts";

export function chatHandlers(ctx: AppContext): HandlerGroup<"chat"> {
  const { conversations, chat } = ctx;
  return {
    "chat.list": async () => conversations.list(),
    "chat.get": async ({ id }) => conversations.get(id),
    "chat.create": async ({ title, systemPrompt }) => {
      const c = await conversations.create(title, systemPrompt ?? ctx.settings().systemPrompt);
      ctx.emitConversations();
      return c;
    },
    "chat.rename": async ({ id, title }) => {
      const c = await conversations.get(id);
      c.title = title.trim() || c.title;
      const saved = await conversations.save(c);
      ctx.emitConversations();
      return saved;
    },
    "chat.setSystemPrompt": async ({ id, systemPrompt }) => {
      const c = await conversations.get(id);
      c.systemPrompt = systemPrompt;
      return conversations.save(c);
    },
    "chat.delete": async ({ id }) => {
      await conversations.get(id);
      await chat.stop(id);
      await conversations.delete(id);
      ctx.emitConversations();
      return { ok: true as const };
    },
    "chat.send": async ({ conversationId, content }) => chat.send(conversationId, content),
    "chat.regenerate": async ({ conversationId, messageId }) =>
      chat.regenerate(conversationId, messageId),
    "chat.selectVersion": async ({ conversationId, messageId, index }) => {
      if (chat.replying(conversationId)) {
        throw new AppFailure("busy", "Wait for the reply being written, or stop it.", null);
      }
      return conversations.selectVersion(conversationId, messageId, index);
    },
    "chat.edit": async ({ conversationId, messageId, content }) =>
      chat.edit(conversationId, messageId, content),
    "chat.stop": async ({ conversationId }) => {
      await chat.stop(conversationId);
      return { ok: true as const };
    },
    "chat.pin": async ({ id, pinned }) => {
      const c = await conversations.setPinned(id, pinned);
      ctx.emitConversations();
      return c;
    },
    "chat.search": async ({ query, limit }) => conversations.search(query, limit),
    "chat.export": async ({ ids, format }) => {
      const chosen = ids
        ? await Promise.all(ids.map((id) => conversations.get(id)))
        : await conversations.all();
      if (chosen.length === 0) {
        throw new AppFailure(
          "nothing_to_export",
          "There are no conversations to export yet.",
          null,
        );
      }
      const file = exportFile(chosen, format);
      const save = ctx.options.saveFile;
      if (!save) return { ...file, savedTo: null };
      // Electron: the save dialog; the text never crosses to the renderer.
      const savedTo = await save(file.filename, file.content);
      return { ...file, content: null, savedTo: savedTo ?? null };
    },
    "chat.import": async ({ data }) => {
      const imported = await importConversations(conversations, data);
      ctx.emitConversations();
      const ids = new Set(imported.map((c) => c.id));
      return { imported: (await conversations.list()).filter((c) => ids.has(c.id)) };
    },
  };
}
