import { useState } from "react";
import { ConversationList } from "../chat/ConversationList.tsx";
import { Composer } from "../chat/Composer.tsx";
import { DemoNote } from "../chat/DemoNote.tsx";
import { MessageList } from "../chat/MessageList.tsx";
import { ModelPicker, remoteLabel } from "../chat/ModelPicker.tsx";
import { SystemPrompt } from "../chat/SystemPrompt.tsx";
import { Button } from "../components/ui.tsx";
import { deliverExport } from "../lib/export.ts";
import { useActions, useAppState } from "../state/context.tsx";
import { isReplying, type State } from "../state/store.ts";

/** What screen readers hear: the start and end of a reply, never every token. */
function replyStatus(s: State): string {
  if (isReplying(s)) return "Writing a reply…";
  const last = s.current?.messages.at(-1);
  if (!last || last.role !== "assistant" || !last.finishReason) return "";
  if (last.finishReason === "error") return "The reply failed.";
  if (last.finishReason === "cancelled") return "Reply stopped.";
  if (last.finishReason === "context_full") return "Reply stopped: the context is full.";
  return "Reply finished.";
}

export function ChatView() {
  const current = useAppState((s) => s.current);
  const localModel = useAppState((s) => s.engine?.model ?? null);
  const remote = useAppState((s) => s.settings?.remote ?? null);
  const connections = useAppState((s) => s.connections);
  const model = remoteLabel(remote, connections) ?? localModel;
  const status = useAppState(replyStatus);
  // Before the first message there is no conversation: the draft starts from the default system
  // prompt (Tuning) and is what the new conversation is created with.
  const defaultSystemPrompt = useAppState((s) => s.settings?.systemPrompt ?? "");
  const [edited, setSystemPromptDraft] = useState<string | null>(null);
  const systemPromptDraft = edited ?? defaultSystemPrompt;
  return (
    <div className="flex h-full min-h-0 flex-col md:flex-row">
      <ConversationList />
      <section aria-label="Conversation" className="flex min-h-0 min-w-0 flex-1 flex-col">
        <div className="flex shrink-0 items-baseline gap-3 px-4 pt-3 pb-1">
          <h1 className="text-lg font-semibold">Chat</h1>
          <p className="min-w-0 truncate text-sm text-muted">
            {current?.title ?? "New conversation"}
            {model && <span> · {model}</span>}
          </p>
          <ModelPicker />
          {current && <ExportButtons id={current.id} />}
        </div>
        <DemoNote />
        <SystemPrompt
          key={current?.id ?? `new:${defaultSystemPrompt}`}
          conversation={current}
          draft={systemPromptDraft}
          setDraft={setSystemPromptDraft}
        />
        <MessageList />
        <p aria-live="polite" className="sr-only">
          {status}
        </p>
        <Composer systemPromptDraft={systemPromptDraft} />
      </section>
    </div>
  );
}

/** Exports the conversation shown: Markdown to read, JSON (with its branches) to import. */
function ExportButtons({ id }: { id: string }) {
  const { client, run } = useActions();
  async function exportAs(format: "markdown" | "json"): Promise<void> {
    const file = await run(() => client.call("chat.export", { ids: [id], format }));
    if (file) deliverExport(file);
  }
  return (
    <span
      role="group"
      aria-label="Export this conversation"
      className="flex shrink-0 items-center text-xs text-muted"
    >
      Export
      <Button
        small
        variant="ghost"
        aria-label="Export as Markdown"
        onClick={() => void exportAs("markdown")}
      >
        .md
      </Button>
      <Button
        small
        variant="ghost"
        aria-label="Export as JSON"
        onClick={() => void exportAs("json")}
      >
        .json
      </Button>
    </span>
  );
}
