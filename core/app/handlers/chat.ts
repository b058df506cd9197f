/**
 * `chat.*`: conversations (list, get, create, rename, system prompt, delete) from the store, and
 * replies (send, regenerate, select a version, edit, stop), passed straight through to ChatManager (core/app/chat.ts).
 */
import type { AppContext } from "../context.ts";
import { AppFailure } from "../errors.ts";
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
    "chat.regenerate": async ({ conversationId }) => chat.regenerate(conversationId),
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
  };
}
