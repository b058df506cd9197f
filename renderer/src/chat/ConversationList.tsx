/**
 * The conversation list: search on top (titles and message text; a hit opens its conversation at
 * the message), pinned conversations first, then the newest. Items are links (they switch what
 * the page shows), so their names never collide with the "New chat" button; Pin, Rename and
 * Delete are buttons on each item, shown faintly until the item is current, hovered or focused.
 * Below: export all (Markdown, JSON) and import.
 */
import { useEffect, useMemo, useRef, useState, type KeyboardEvent, type ReactNode } from "react";
import type { ConversationSummary, SearchHit } from "../../../core/app/api.ts";
import { ConfirmDialog } from "../components/ConfirmDialog.tsx";
import { PencilIcon, PinIcon, TrashIcon } from "../components/icons.tsx";
import { Button } from "../components/ui.tsx";
import { deliverExport, importTooLarge } from "../lib/export.ts";
import { NEW_CHAT_SHORTCUT } from "../lib/keys.ts";
import { useActions, useAppState } from "../state/context.tsx";

/** Wait this long after the last keystroke before searching. */
const SEARCH_DELAY_MS = 120;

/** Pinned first, then newest first (as the store lists them). */
export function listOrder(a: ConversationSummary, b: ConversationSummary): number {
  return Number(b.pinned) - Number(a.pinned) || b.updatedAt.localeCompare(a.updatedAt);
}

export function ConversationList() {
  const conversations = useAppState((s) => s.conversations);
  const currentId = useAppState((s) => s.current?.id ?? null);
  const { client, store, run, notify, newChat } = useActions();
  const [renaming, setRenaming] = useState<string | null>(null);
  const [deleting, setDeleting] = useState<ConversationSummary | null>(null);
  const [query, setQuery] = useState("");
  // The hits of the query they answer: while a newer one is pending, none are shown.
  const [found, setFound] = useState<{ query: string; hits: SearchHit[] } | null>(null);
  const hits = found?.query === query ? found.hits : null;
  const [note, setNote] = useState("");
  const fileInput = useRef<HTMLInputElement>(null);
  const sorted = useMemo(() => [...(conversations ?? [])].sort(listOrder), [conversations]);

  // Search as the user types (after a pause), again when the conversations change.
  useEffect(() => {
    if (query.trim() === "") return;
    let stale = false;
    const timer = setTimeout(() => {
      void run(() => client.call("chat.search", { query: query.slice(0, 500) })).then((result) => {
        if (!stale && result) setFound({ query, hits: result });
      });
    }, SEARCH_DELAY_MS);
    return () => {
      stale = true;
      clearTimeout(timer);
    };
  }, [query, conversations, client, run]);

  async function select(id: string, messageId?: string): Promise<void> {
    const conversation = await run(() => client.call("chat.get", { id }));
    if (!conversation) return;
    store.dispatch({ type: "conversation", conversation, select: true });
    if (messageId) store.dispatch({ type: "jumpTo", messageId });
  }

  async function pin(c: ConversationSummary): Promise<void> {
    const conversation = await run(() => client.call("chat.pin", { id: c.id, pinned: !c.pinned }));
    if (conversation) store.dispatch({ type: "conversation", conversation });
  }

  async function exportAll(format: "markdown" | "json"): Promise<void> {
    const file = await run(() => client.call("chat.export", { format }));
    if (file) setNote(deliverExport(file) ?? "");
  }

  async function importFile(file: File): Promise<void> {
    const tooLarge = importTooLarge(file);
    if (tooLarge) {
      notify(tooLarge);
      return;
    }
    const data = await file.text();
    const result = await run(() => client.call("chat.import", { data }));
    if (!result) return;
    const n = result.imported.length;
    setNote(`Imported ${n} conversation${n === 1 ? "" : "s"} from ${file.name}`);
    const first = result.imported[0];
    if (first) await select(first.id);
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
      <div className="px-2 pb-2">
        <input
          type="search"
          aria-label="Search conversations"
          placeholder="Search"
          value={query}
          maxLength={500}
          onChange={(e) => setQuery(e.target.value)}
          onKeyDown={(e) => {
            if (e.key === "Escape" && query) {
              e.preventDefault();
              setQuery("");
            }
          }}
          className="w-full rounded-md border border-line bg-bg px-2 py-1 text-sm"
        />
      </div>
      {query.trim() !== "" ? (
        <SearchResults
          hits={hits}
          onOpen={(h) => void select(h.conversationId, h.messageId ?? undefined)}
        />
      ) : (
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
                    {c.pinned && (
                      <span
                        aria-hidden="true"
                        className="mr-1 inline-block align-[-2px] text-muted"
                      >
                        <PinIcon />
                      </span>
                    )}
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
                      aria-label={c.pinned ? "Unpin" : "Pin"}
                      aria-pressed={c.pinned}
                      title={c.pinned ? "Unpin" : "Pin to the top"}
                      onClick={() => void pin(c)}
                    >
                      <PinIcon />
                    </Button>
                  )}
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
      )}
      {/* Not on a narrow window, where the list is 10rem tall (the header still exports one). */}
      <div className="hidden flex-wrap items-center gap-1 border-t border-line px-2 py-1.5 text-xs md:flex">
        <span className="text-muted">All:</span>
        <Button
          small
          variant="ghost"
          onClick={() => void exportAll("markdown")}
          title="Export every conversation as Markdown"
        >
          Export Markdown
        </Button>
        <Button
          small
          variant="ghost"
          onClick={() => void exportAll("json")}
          title="Export every conversation as JSON (branches included), to import later"
        >
          Export JSON
        </Button>
        <Button
          small
          variant="ghost"
          onClick={() => fileInput.current?.click()}
          title="Import conversations from a JSON export"
        >
          Import…
        </Button>
        <input
          ref={fileInput}
          type="file"
          accept=".json,application/json"
          aria-label="Import conversations file"
          hidden
          onChange={(e) => {
            const file = e.target.files?.[0];
            e.target.value = "";
            if (file) void importFile(file);
          }}
        />
        <p role="status" className="w-full truncate text-muted empty:hidden" title={note}>
          {note}
        </p>
      </div>
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

/** Search hits: title, then the snippet with its matches marked; a click opens the message. */
function SearchResults({
  hits,
  onOpen,
}: {
  hits: SearchHit[] | null;
  onOpen: (hit: SearchHit) => void;
}) {
  if (hits === null) return <p className="px-3 py-1 text-xs text-muted">Searching…</p>;
  if (hits.length === 0) return <p className="px-3 py-1 text-xs text-muted">No matches.</p>;
  return (
    <ul aria-label="Search results" className="min-h-0 flex-1 overflow-y-auto px-2 pb-2">
      {hits.map((h) => (
        <li key={`${h.conversationId}:${h.messageId ?? "title"}`}>
          <a
            href={`#conversation-${h.conversationId}`}
            onClick={(e) => {
              e.preventDefault();
              onOpen(h);
            }}
            className="block rounded px-1.5 py-1.5 text-sm text-fg no-underline hover:bg-panel-2"
          >
            <span className="block truncate text-xs font-semibold">
              {h.messageId === null ? <Marked text={h.snippet} ranges={h.highlights} /> : h.title}
            </span>
            {h.messageId !== null && (
              <span className="line-clamp-2 text-xs text-muted">
                <span className="font-medium">{h.role === "user" ? "You: " : "Reply: "}</span>
                <Marked text={h.snippet} ranges={h.highlights} />
              </span>
            )}
          </a>
        </li>
      ))}
    </ul>
  );
}

/** `text` with `ranges` in <mark>. */
function Marked({ text, ranges }: { text: string; ranges: [number, number][] }) {
  const parts: ReactNode[] = [];
  let at = 0;
  for (const [a, b] of ranges) {
    if (a < at || b > text.length) continue;
    if (a > at) parts.push(text.slice(at, a));
    parts.push(
      <mark key={a} className="hit">
        {text.slice(a, b)}
      </mark>,
    );
    at = b;
  }
  parts.push(text.slice(at));
  return <>{parts}</>;
}
