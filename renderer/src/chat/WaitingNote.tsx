/**
 * What a reply shows before its first text: "Thinking…", or, while the OpenAI-compatible server's
 * request holds the engine (the chat takes its turn after it), which request it waits for and a
 * way to cancel it.
 */
import { useState } from "react";
import { Button } from "../components/ui.tsx";
import { useActions, useAppState } from "../state/context.tsx";

export function WaitingNote() {
  const running = useAppState((s) => s.server?.requests.find((r) => r.state === "running") ?? null);
  const { client, run } = useActions();
  const [cancelling, setCancelling] = useState<string | null>(null);
  if (!running) return <p className="text-muted">Thinking…</p>;
  return (
    <div data-testid="waiting-for-server" className="flex flex-wrap items-center gap-2 text-muted">
      <p role="status">
        Waiting for a server request to finish (from {running.client}, {running.tokens} of at most{" "}
        {running.maxTokens} tokens so far); this reply starts after it.
      </p>
      <Button
        variant="secondary"
        disabled={cancelling === running.id}
        onClick={() => {
          setCancelling(running.id);
          void run(() => client.call("server.cancel", { id: running.id }));
        }}
      >
        Cancel it
      </Button>
    </div>
  );
}
