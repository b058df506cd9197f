/**
 * The messages of the current conversation with stick-to-bottom scrolling: new text scrolls into
 * view while the reader is at the bottom, and stops doing so once they scroll up ("Jump to
 * latest" brings them back). A conversation opens at its latest message: rows off screen have
 * an estimated height (content-visibility) that changes as they are laid out, so the list is
 * kept at the bottom whenever its height changes, not only when the messages do.
 */
import { useDeferredValue, useEffect, useLayoutEffect, useRef } from "react";
import { Button } from "../components/ui.tsx";
import { useActions, useAppState } from "../state/context.tsx";
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
    if (el && stick.current) toBottom(el);
    showJump(el);
  }, [messages, live]);

  // A search hit was opened: show its message (centred, marked for a moment), and let go of the
  // bottom so later layout does not scroll it away.
  const jumpTo = useAppState((s) => s.jumpTo);
  const { store } = useActions();
  useLayoutEffect(() => {
    if (!jumpTo || !messages?.some((m) => m.id === jumpTo)) return;
    const row = document.getElementById(`message-${jumpTo}`);
    if (row) {
      stick.current = false;
      row.scrollIntoView({ block: "center" });
      row.classList.add("jumped");
      setTimeout(() => row.classList.remove("jumped"), 2000);
    }
    store.dispatch({ type: "jumpTo", messageId: null });
  }, [jumpTo, messages, store]);

  // Heights settle after the first layout (estimated rows, fonts, code highlighting): follow.
  const content = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const el = scroller.current;
    const inner = content.current;
    if (!el || !inner || typeof ResizeObserver === "undefined") return;
    const observer = new ResizeObserver(() => {
      if (stick.current) toBottom(el);
      showJump(el);
    });
    observer.observe(inner);
    observer.observe(el);
    return () => observer.disconnect();
  }, []);

  function showJump(el: HTMLDivElement | null): void {
    const away = !!el && el.scrollHeight - el.scrollTop - el.clientHeight >= STICK_PX;
    if (jumpButton.current) jumpButton.current.hidden = !away;
  }

  // Where the list was last scrolled to: only a move up (the reader) lets go of the bottom; rows
  // growing under a scroll we made ourselves must not.
  const lastTop = useRef(0);
  function onScroll(): void {
    const el = scroller.current;
    if (!el) return;
    if (el.scrollHeight - el.scrollTop - el.clientHeight < STICK_PX) stick.current = true;
    else if (el.scrollTop < lastTop.current - 1) stick.current = false;
    lastTop.current = el.scrollTop;
    showJump(el);
  }

  function jump(): void {
    const el = scroller.current;
    if (!el) return;
    stick.current = true;
    toBottom(el);
    showJump(el);
    document.getElementById("composer")?.focus();
  }

  function toBottom(el: HTMLDivElement): void {
    el.scrollTop = el.scrollHeight;
    lastTop.current = el.scrollTop;
  }

  const lastIndex = count - 1;
  return (
    <div className="relative min-h-0 flex-1">
      <div
        ref={scroller}
        onScroll={onScroll}
        data-testid="message-scroller"
        className="h-full overflow-y-auto px-4"
      >
        <div ref={content}>
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
                    // Any reply: an earlier one written again starts a branch there.
                    canRegenerate={!replying && m.role === "assistant"}
                  />
                );
              })}
            </ol>
          )}
        </div>
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
