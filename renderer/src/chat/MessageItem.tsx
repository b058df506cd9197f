/**
 * One message. Memoized on its props, which for a finished message are the same objects from one
 * delta to the next: only the message being written re-renders while a reply streams. Rows use
 * `content-visibility: auto` (see styles.css), so off-screen messages in a long chat cost no
 * layout or paint, while staying in the DOM for find-in-page and screen readers.
 */
import { memo, useState, type KeyboardEvent } from "react";
import type { Message } from "../../../core/app/api.ts";
import { CopyButton } from "../components/CopyButton.tsx";
import { ErrorAlert } from "../components/ErrorAlert.tsx";
import { Button } from "../components/ui.tsx";
import { droppedNote, finishNote } from "../lib/context-note.ts";
import { useActions } from "../state/context.tsx";
import { Markdown } from "./Markdown.tsx";
import { WaitingNote } from "./WaitingNote.tsx";

export const MessageItem = memo(function MessageItem({
  message,
  text,
  conversationId,
  streaming,
  canEdit,
  canRegenerate,
}: {
  message: Message;
  text: string;
  conversationId: string;
  /** This reply is being written now. */
  streaming: boolean;
  canEdit: boolean;
  canRegenerate: boolean;
}) {
  const { client, store, run } = useActions();
  const [editing, setEditing] = useState(false);
  const isUser = message.role === "user";
  const note = finishNote(message);
  const dropped = message.contextNote ? droppedNote(message.contextNote) : null;
  const interrupted = !isUser && !message.finishReason && !streaming;
  const versions = (message.otherVersions?.length ?? 0) + 1;
  const versionIndex = Math.min(message.versionIndex ?? versions - 1, versions - 1);

  async function regenerate(): Promise<void> {
    const conversation = await run(() =>
      client.call("chat.regenerate", { conversationId, messageId: message.id }),
    );
    if (conversation) store.dispatch({ type: "conversation", conversation, reply: true });
  }

  async function showVersion(index: number): Promise<void> {
    const conversation = await run(() =>
      client.call("chat.selectVersion", { conversationId, messageId: message.id, index }),
    );
    if (conversation) store.dispatch({ type: "conversation", conversation });
  }

  async function saveEdit(content: string): Promise<void> {
    setEditing(false);
    const conversation = await run(() =>
      client.call("chat.edit", { conversationId, messageId: message.id, content }),
    );
    if (conversation) store.dispatch({ type: "conversation", conversation, reply: true });
  }

  return (
    <li
      id={`message-${message.id}`}
      data-role={message.role}
      aria-busy={streaming || undefined}
      className={`message flex flex-col gap-1 py-3 ${isUser ? "items-end" : "items-start"}`}
    >
      <span className="text-xs font-medium text-muted">
        {isUser ? "You" : (message.model ?? "Assistant")}
      </span>
      {editing ? (
        <EditForm initial={message.content} onSave={saveEdit} onCancel={() => setEditing(false)} />
      ) : isUser ? (
        <div className="max-w-[min(44rem,92%)] rounded-lg bg-accent/10 px-3 py-2 text-sm break-words whitespace-pre-wrap">
          {text}
        </div>
      ) : (
        <div className="w-full max-w-[min(48rem,100%)] text-sm break-words">
          {text ? <Markdown text={text} /> : streaming ? <WaitingNote /> : null}
          {streaming && text && <span aria-hidden="true" className="caret" />}
        </div>
      )}
      {dropped && (
        <p data-testid="context-note" className="text-xs text-muted">
          {dropped}
        </p>
      )}
      {note && <p className="text-xs text-muted">{note}</p>}
      {interrupted && <p className="text-xs text-muted">This reply was interrupted.</p>}
      {message.error && (
        <ErrorAlert
          error={message.error}
          model={message.model ?? null}
          onRetry={canRegenerate ? () => void regenerate() : undefined}
          className="w-full max-w-[min(48rem,100%)]"
        />
      )}
      {message.stats && message.stats.generatedTokens > 0 && (
        <p data-testid="stats-line" className="text-xs text-muted tabular-nums">
          {message.stats.line}
        </p>
      )}
      {!editing && !streaming && (
        <div className="flex flex-wrap items-center gap-1">
          {versions > 1 && (
            <VersionSwitch
              index={versionIndex}
              count={versions}
              // Each version is a branch with its own later messages; not while one is written.
              enabled={canEdit}
              onShow={(i) => void showVersion(i)}
            />
          )}
          <CopyButton label="Copy" getText={() => text} />
          {isUser && canEdit && (
            <Button small variant="ghost" onClick={() => setEditing(true)}>
              Edit
            </Button>
          )}
          {canRegenerate && (
            <Button small variant="ghost" onClick={() => void regenerate()}>
              Regenerate
            </Button>
          )}
        </div>
      )}
    </li>
  );
});

/** `‹ 2 / 3 ›`: the versions (branches) of a regenerated reply or an edited message. */
function VersionSwitch({
  index,
  count,
  enabled,
  onShow,
}: {
  index: number;
  count: number;
  enabled: boolean;
  onShow: (index: number) => void;
}) {
  return (
    <span role="group" aria-label="Versions" className="flex items-center text-xs text-muted">
      <Button
        small
        variant="ghost"
        aria-label="Previous version"
        title="Previous version"
        disabled={!enabled || index === 0}
        onClick={() => onShow(index - 1)}
      >
        ‹
      </Button>
      <span data-testid="version" className="tabular-nums">
        {index + 1} / {count}
      </span>
      <Button
        small
        variant="ghost"
        aria-label="Next version"
        title="Next version"
        disabled={!enabled || index === count - 1}
        onClick={() => onShow(index + 1)}
      >
        ›
      </Button>
    </span>
  );
}

function EditForm({
  initial,
  onSave,
  onCancel,
}: {
  initial: string;
  onSave: (content: string) => void;
  onCancel: () => void;
}) {
  const [value, setValue] = useState(initial);
  function onKeyDown(e: KeyboardEvent<HTMLTextAreaElement>): void {
    if (e.key === "Escape") {
      e.preventDefault();
      onCancel();
    } else if (e.key === "Enter" && !e.shiftKey && !e.nativeEvent.isComposing) {
      e.preventDefault();
      if (value.trim()) onSave(value);
    }
  }
  return (
    <form
      className="flex w-full max-w-[min(44rem,100%)] flex-col gap-2"
      onSubmit={(e) => {
        e.preventDefault();
        if (value.trim()) onSave(value);
      }}
    >
      <textarea
        aria-label="Edit message"
        autoFocus
        value={value}
        onChange={(e) => setValue(e.target.value)}
        onKeyDown={onKeyDown}
        className="field-sizing-content max-h-64 min-h-16 w-full rounded-md border border-line bg-bg px-3 py-2 text-sm"
      />
      <div className="flex justify-end gap-2">
        <Button small onClick={onCancel}>
          Cancel
        </Button>
        <Button small variant="primary" type="submit" disabled={!value.trim()}>
          Save and resend
        </Button>
      </div>
    </form>
  );
}
