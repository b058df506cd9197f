/**
 * The conversation list. Items are links (they switch what the page shows), so their names never
 * collide with the "New chat" button; Rename and Delete are buttons on each item, shown faintly
 * until the item is current, hovered or focused.
 */
import { useMemo, useRef, useState, type KeyboardEvent } from "react";
import type { ConversationSummary } from "../../../core/app/api.ts";
import { ConfirmDialog } from "../components/ConfirmDialog.tsx";
import { PencilIcon, TrashIcon } from "../components/icons.tsx";
import { Button } from "../components/ui.tsx";
import { NEW_CHAT_SHORTCUT } from "../lib/keys.ts";
import { useActions, useAppState } from "../state/context.tsx";

export function ConversationList() {
  const conversations = useAppState((s) => s.conversations);
  const currentId = useAppState((s) => s.current?.id ?? null);
  const { client, store, run, newChat } = useActions();
  const [renaming, setRenaming] = useState<string | null>(null);
  const [deleting, setDeleting] = useState<ConversationSummary | null>(null);
  const sorted = useMemo(
    () => [...(conversations ?? [])].sort((a, b) => b.updatedAt.localeCompare(a.updatedAt)),
    [conversations],
  );

  async function select(id: string): Promise<void> {
    const conversation = await run(() => client.call("chat.get", { id }));
    if (conversation) store.dispatch({ type: "conversation", conversation, select: true });
  }

  function create(): void {
    // Focus first: what is typed from now on belongs to the new conversation (the composer
    // waits for it to exist before sending).
    document.getElementById("composer")?.focus();
    void newChat();
  }

  async function rename(id: string, title: string): Promise<void> {
    setRenaming(null);
    const t = title.trim();
    if (!t) return;
    const conversation = await run(() =>
      client.call("chat.rename", { id, title: t.slice(0, 200) }),
    );
    if (conversation) store.dispatch({ type: "conversation", conversation });
  }

  async function remove(id: string): Promise<void> {
    const ok = await run(() => client.call("chat.delete", { id }));
    if (ok) store.dispatch({ type: "conversationDeleted", id });
  }

  return (
    <nav
      aria-label="Conversations"
      className="flex max-h-40 shrink-0 flex-col border-b border-line md:max-h-none md:w-56 md:border-r md:border-b-0 lg:w-72"
    >
      <div className="p-2">
        <Button
          variant="primary"
          className="w-full"
          onClick={create}
          title={`New chat (${NEW_CHAT_SHORTCUT})`}
          aria-keyshortcuts="Control+Shift+O Meta+Shift+O"
        >
          New chat
        </Button>
      </div>
      <ul className="min-h-0 flex-1 overflow-y-auto px-2 pb-2">
        {sorted.length === 0 && conversations && (
          <li className="px-2 py-1 text-xs text-muted">No conversations yet.</li>
        )}
        {sorted.map((c) => {
          const current = c.id === currentId;
          return (
            <li
              key={c.id}
              className={`group relative flex items-center gap-1 rounded-md px-1 ${
                current ? "bg-accent/10" : "hover:bg-panel-2"
              }`}
            >
              {renaming === c.id ? (
                <RenameInput
                  initial={c.title}
                  onDone={(title) => void rename(c.id, title)}
                  onCancel={() => setRenaming(null)}
                />
              ) : (
                <a
                  href={`#conversation-${c.id}`}
                  aria-current={current ? "true" : undefined}
                  onClick={(e) => {
                    e.preventDefault();
                    void select(c.id);
                  }}
                  className={`min-w-0 flex-1 truncate rounded px-1.5 py-1.5 text-sm no-underline ${
                    current ? "font-semibold text-fg" : "text-fg"
                  }`}
                  title={c.title}
                >
                  {c.title || "Untitled"}
                </a>
              )}
              {/* Over the end of the title, shown on hover and focus: the title gets the width. */}
              <span
                className={`flex shrink-0 ${
                  renaming === c.id
                    ? ""
                    : "absolute inset-y-0 right-1 items-center rounded-md bg-panel-2 opacity-0 group-focus-within:opacity-100 group-hover:opacity-100"
                }`}
              >
                {renaming !== c.id && (
                  <Button
                    small
                    variant="ghost"
                    aria-label="Rename"
                    title="Rename"
                    onClick={() => setRenaming(c.id)}
                  >
                    <PencilIcon />
                  </Button>
                )}
                <Button
                  small
                  variant="ghost"
                  aria-label="Delete"
                  title="Delete"
                  onClick={() => setDeleting(c)}
                >
                  <TrashIcon />
                </Button>
              </span>
            </li>
          );
        })}
      </ul>
      {deleting && (
        <ConfirmDialog
          title="Delete this conversation?"
          body={`“${deleting.title || "Untitled"}” and its ${deleting.messageCount} messages will be deleted. This cannot be undone.`}
          confirmLabel="Delete conversation"
          onConfirm={() => void remove(deleting.id)}
          onClose={() => setDeleting(null)}
        />
      )}
    </nav>
  );
}

function RenameInput({
  initial,
  onDone,
  onCancel,
}: {
  initial: string;
  onDone: (title: string) => void;
  onCancel: () => void;
}) {
  const [value, setValue] = useState(initial);
  // Enter unmounts the input, which can also fire blur: finish once.
  const finished = useRef(false);
  function finish(commit: boolean): void {
    if (finished.current) return;
    finished.current = true;
    if (commit && value.trim() && value !== initial) onDone(value);
    else onCancel();
  }
  function onKeyDown(e: KeyboardEvent<HTMLInputElement>): void {
    if (e.key === "Enter") {
      e.preventDefault();
      finish(true);
    } else if (e.key === "Escape") {
      e.preventDefault();
      finish(false);
    }
  }
  return (
    <input
      aria-label="Conversation title"
      autoFocus
      maxLength={200}
      value={value}
      onChange={(e) => setValue(e.target.value)}
      onKeyDown={onKeyDown}
      onBlur={() => finish(true)}
      className="min-w-0 flex-1 rounded border border-line bg-bg px-1.5 py-1 text-sm"
    />
  );
}
