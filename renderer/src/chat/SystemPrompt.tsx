/**
 * The conversation's system prompt, saved as it is typed (debounced) and when the field loses
 * focus. Before the first message there is no conversation yet: the text is kept by the chat
 * panel and used when the conversation is created. Open by default; the open/closed choice is
 * remembered.
 */
import { useEffect, useRef, useState } from "react";
import type { Conversation } from "../../../core/app/api.ts";
import { useActions } from "../state/context.tsx";

const OPEN_KEY = "redwing.systemPromptOpen";
const SAVE_DELAY_MS = 600;

function initiallyOpen(): boolean {
  try {
    return localStorage.getItem(OPEN_KEY) !== "0";
  } catch {
    return true;
  }
}

export function SystemPrompt({
  conversation,
  draft,
  setDraft,
}: {
  conversation: Conversation | null;
  draft: string;
  setDraft: (text: string) => void;
}) {
  const { client, run } = useActions();
  const [text, setText] = useState(conversation ? conversation.systemPrompt : draft);
  const [open, setOpen] = useState(initiallyOpen);
  const pending = useRef<{ id: string; text: string } | null>(null);
  const timer = useRef<ReturnType<typeof setTimeout> | null>(null);

  const flush = useRef(() => {
    if (timer.current) clearTimeout(timer.current);
    timer.current = null;
    const p = pending.current;
    pending.current = null;
    if (p) void run(() => client.call("chat.setSystemPrompt", { id: p.id, systemPrompt: p.text }));
  });

  // Switching conversations (this component is keyed by id), leaving, or closing / reloading the
  // page before the save delay is over: save what is pending.
  useEffect(() => {
    const save = flush.current;
    window.addEventListener("pagehide", save);
    return () => {
      window.removeEventListener("pagehide", save);
      save();
    };
  }, []);

  function onChange(value: string): void {
    setText(value);
    if (!conversation) {
      setDraft(value);
      return;
    }
    pending.current = { id: conversation.id, text: value };
    if (timer.current) clearTimeout(timer.current);
    timer.current = setTimeout(() => flush.current(), SAVE_DELAY_MS);
  }

  return (
    <details
      open={open}
      onToggle={(e) => {
        const isOpen = e.currentTarget.open;
        setOpen(isOpen);
        try {
          localStorage.setItem(OPEN_KEY, isOpen ? "1" : "0");
        } catch {
          // Not remembered then.
        }
      }}
      className="shrink-0 border-b border-line px-4 py-2"
    >
      <summary className="cursor-pointer text-xs font-medium text-muted select-none">
        System prompt
        {!open && text && (
          <span className="ml-2 font-normal">
            “{text.slice(0, 60)}
            {text.length > 60 ? "…" : ""}”
          </span>
        )}
      </summary>
      <textarea
        aria-label="System prompt"
        value={text}
        placeholder="Instructions the model follows for this whole conversation (optional)"
        onChange={(e) => onChange(e.target.value)}
        onBlur={() => flush.current()}
        rows={2}
        className="field-sizing-content mt-2 max-h-40 min-h-12 w-full rounded-md border border-line bg-bg px-3 py-2 text-sm"
      />
    </details>
  );
}
