/**
 * The messages of the current conversation with stick-to-bottom scrolling: new text scrolls into
 * view while the reader is at the bottom, and stops doing so once they scroll up.
 */
import { useDeferredValue, useLayoutEffect, useRef } from "react";
import { Button } from "../components/ui.tsx";
import { useAppState } from "../state/context.tsx";
import { isReplying, type State } from "../state/store.ts";
import { MessageItem } from "./MessageItem.tsx";

/** Within this many pixels of the bottom counts as "at the bottom". */
const STICK_PX = 64;

function streamingText(s: State): string | undefined {
  const last = s.current?.messages.at(-1);
  return last && last.role === "assistant" && !last.finishReason ? s.liveText[last.id] : undefined;
}

export function MessageList() {
  const current = useAppState((s) => s.current);
  const replying = useAppState(isReplying);
  // Low priority: typing and scrolling stay responsive while markdown re-renders.
  const live = useDeferredValue(useAppState(streamingText));
  const scroller = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  // Shown and hidden from scroll handlers directly: no re-render of the list per scroll event.
  const jumpButton = useRef<HTMLButtonElement>(null);
  const messages = current?.messages;
  const count = messages?.length ?? 0;
  const conversationId = current?.id;

  // A new conversation or a new message (the user sent one): follow the bottom again.
  useLayoutEffect(() => {
    stick.current = true;
  }, [conversationId, count]);

  useLayoutEffect(() => {
    const el = scroller.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
    showJump(el);
  }, [messages, live]);

  function showJump(el: HTMLDivElement | null): void {
    const away = !!el && el.scrollHeight - el.scrollTop - el.clientHeight >= STICK_PX;
    if (jumpButton.current) jumpButton.current.hidden = !away;
  }

  function onScroll(): void {
    const el = scroller.current;
    if (!el) return;
    stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < STICK_PX;
    showJump(el);
  }

  function jump(): void {
    const el = scroller.current;
    if (!el) return;
    stick.current = true;
    el.scrollTop = el.scrollHeight;
    showJump(el);
  }

  const lastIndex = count - 1;
  const lastAssistant = messages?.findLastIndex((m) => m.role === "assistant") ?? -1;
  return (
    <div className="relative min-h-0 flex-1">
      <div ref={scroller} onScroll={onScroll} className="h-full overflow-y-auto px-4">
        {!current && (
          <p className="mx-auto mt-16 max-w-sm text-center text-sm text-muted">
            Write a message below to start a conversation with the loaded model.
          </p>
        )}
        {current && count === 0 && (
          <p className="mx-auto mt-16 max-w-sm text-center text-sm text-muted">
            No messages yet. Enter sends, Shift+Enter starts a new line.
          </p>
        )}
        {current && (
          <ol aria-label="Messages" className="mx-auto max-w-4xl pb-4">
            {current.messages.map((m, i) => {
              const isStreaming = replying && i === lastIndex && m.role === "assistant";
              return (
                <MessageItem
                  key={m.id}
                  message={m}
                  text={
                    m.role === "assistant" && !m.finishReason && i === lastIndex
                      ? (live ?? m.content)
                      : m.content
                  }
                  conversationId={current.id}
                  streaming={isStreaming}
                  canEdit={!replying}
                  canRegenerate={!replying && i === lastAssistant && i === lastIndex}
                />
              );
            })}
          </ol>
        )}
      </div>
      <Button
        ref={jumpButton}
        hidden
        small
        className="absolute right-6 bottom-3 shadow"
        onClick={jump}
      >
        Jump to latest ↓
      </Button>
    </div>
  );
}
