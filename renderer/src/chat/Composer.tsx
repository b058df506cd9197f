import { useState, type KeyboardEvent } from "react";
import { Button } from "../components/ui.tsx";
import { useActions, useAppState } from "../state/context.tsx";
import { isReplying } from "../state/store.ts";

/** The message box: Enter sends, Shift+Enter starts a new line; Stop replaces Send while replying. */
export function Composer({ systemPromptDraft }: { systemPromptDraft: string }) {
  const { client, store, run } = useActions();
  const current = useAppState((s) => s.current);
  const replying = useAppState(isReplying);
  const engineState = useAppState((s) => s.engine?.state ?? null);
  const [draft, setDraft] = useState("");
  const [sending, setSending] = useState(false);

  async function send(): Promise<void> {
    const content = draft.trim() ? draft : "";
    if (!content || sending || replying) return;
    setSending(true);
    try {
      let conversation = current;
      if (!conversation) {
        conversation =
          (await run(() => client.call("chat.create", { systemPrompt: systemPromptDraft }))) ??
          null;
        if (!conversation) return;
        store.dispatch({ type: "conversation", conversation, select: true });
      }
      const id = conversation.id;
      setDraft("");
      const updated = await run(() => client.call("chat.send", { conversationId: id, content }));
      if (updated) store.dispatch({ type: "conversation", conversation: updated, reply: true });
      else setDraft(content); // keep what was typed so it can be sent again
    } finally {
      setSending(false);
    }
  }

  async function stop(): Promise<void> {
    if (current) await run(() => client.call("chat.stop", { conversationId: current.id }));
  }

  function onKeyDown(e: KeyboardEvent<HTMLTextAreaElement>): void {
    if (e.key === "Enter" && !e.shiftKey && !e.altKey && !e.nativeEvent.isComposing) {
      e.preventDefault();
      void send();
    }
  }

  const hint =
    engineState === "crashed"
      ? "The engine stopped: restart it from the banner above."
      : engineState === "loading" || engineState === "starting"
        ? "The model is loading; you can already write."
        : engineState === "stopped"
          ? "No model is loaded: load one in Models."
          : null;

  return (
    <form
      className="shrink-0 border-t border-line bg-panel px-4 py-3"
      onSubmit={(e) => {
        e.preventDefault();
        void send();
      }}
    >
      <div className="mx-auto flex max-w-4xl items-end gap-2">
        <label htmlFor="composer" className="sr-only">
          Message
        </label>
        <textarea
          id="composer"
          value={draft}
          onChange={(e) => setDraft(e.target.value)}
          onKeyDown={onKeyDown}
          rows={1}
          placeholder="Message the model (Enter sends, Shift+Enter for a new line)"
          aria-describedby={hint ? "composer-hint" : undefined}
          className="field-sizing-content max-h-48 min-h-10 min-w-0 flex-1 resize-none rounded-md border border-line bg-bg px-3 py-2 text-sm"
        />
        {replying ? (
          <Button variant="danger" onClick={() => void stop()}>
            Stop
          </Button>
        ) : (
          <Button variant="primary" type="submit" disabled={sending || !draft.trim()}>
            Send
          </Button>
        )}
      </div>
      {hint && (
        <p id="composer-hint" className="mx-auto mt-1 max-w-4xl text-xs text-muted">
          {hint}
        </p>
      )}
    </form>
  );
}
