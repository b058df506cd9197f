/**
 * Keyboard shortcuts, in one place so the handlers and the tooltips that name them agree.
 * New chat is Ctrl+Shift+O (Cmd+Shift+O on a Mac), the key ChatGPT uses for the same thing.
 */

const MAC = typeof navigator !== "undefined" && /Mac|iPhone|iPad/.test(navigator.platform);

/** What tooltips show for the new-chat shortcut. */
export const NEW_CHAT_SHORTCUT = MAC ? "⌘⇧O" : "Ctrl+Shift+O";

/** Whether a key event is the new-chat shortcut. */
export function isNewChatKey(
  e: Pick<KeyboardEvent, "key" | "code" | "ctrlKey" | "metaKey" | "shiftKey" | "altKey">,
): boolean {
  const mod = MAC ? e.metaKey : e.ctrlKey;
  return mod && e.shiftKey && !e.altKey && (e.code === "KeyO" || e.key.toLowerCase() === "o");
}
