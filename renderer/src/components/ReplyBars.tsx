/**
 * The aside's compact per-reply chart: one bar per finished reply of the current conversation
 * (height = decode tokens/s), each with a tooltip, and the latest reply's figures as text under
 * it. The SVG is one image whose accessible name summarises the bars.
 */
import { useId } from "react";
import { formatMs, formatTokensPerSecond } from "../lib/format.ts";
import type { ReplyPoint } from "../lib/live.ts";

/** Bars shown at most (the newest); the Live view has them all. */
const MAX_BARS = 24;
/** Slots the width is divided into, so one or two replies do not make one huge bar. */
const MIN_SLOTS = 10;
const W = 256;
const H = 48;
/** The band above the tallest bar that the scale label sits in. */
const LABEL_BAND = 13;

export function ReplyBars({ replies }: { replies: ReplyPoint[] }) {
  const labelId = useId();
  const shown = replies.slice(-MAX_BARS);
  const last = shown.at(-1);
  const max = Math.max(1, ...shown.map((r) => r.tokensPerSecond));
  const slot = W / Math.max(MIN_SLOTS, shown.length);
  const summary = last
    ? `Tokens per second per reply, ${shown.length === 1 ? "1 reply" : `replies ${shown[0]!.n} to ${last.n}`}: ${shown
        .map((r) => `#${r.n} ${formatTokensPerSecond(r.tokensPerSecond)}`)
        .join(", ")}`
    : "";
  return (
    <figure aria-labelledby={labelId} className="min-w-0">
      <figcaption id={labelId} className="mb-1 text-xs text-muted">
        Tokens per second per reply
      </figcaption>
      {last ? (
        <>
          <div className="relative">
            {/* The scale: the tallest bar's figure, above the bars in the top right corner. */}
            <span
              aria-hidden="true"
              className="absolute top-0.5 right-1 text-[10px] leading-none text-muted tabular-nums"
            >
              {formatTokensPerSecond(max)}
            </span>
            <svg
              role="img"
              aria-label={summary}
              viewBox={`0 0 ${W} ${H}`}
              preserveAspectRatio="none"
              className="h-12 w-full rounded bg-panel-2 text-gauge"
            >
              {shown.map((r, i) => {
                const h = Math.max(1.5, (r.tokensPerSecond / max) * (H - LABEL_BAND));
                return (
                  <rect
                    key={r.messageId}
                    x={i * slot + slot * 0.15}
                    y={H - h}
                    width={slot * 0.7}
                    height={h}
                    rx={1}
                    fill="currentColor"
                    opacity={r === last ? 1 : 0.55}
                  >
                    <title>
                      {`Reply ${r.n}: ${formatTokensPerSecond(r.tokensPerSecond)}, TTFT ${formatMs(r.ttftMs)}, ${r.tokens} tokens`}
                    </title>
                  </rect>
                );
              })}
            </svg>
          </div>
          <p className="mt-1 text-xs text-muted tabular-nums">
            Reply {last.n}: {formatTokensPerSecond(last.tokensPerSecond)} · TTFT{" "}
            {formatMs(last.ttftMs)}
          </p>
        </>
      ) : (
        <p className="rounded bg-panel-2 px-2 py-3 text-xs text-muted">
          No replies in this conversation yet.
        </p>
      )}
    </figure>
  );
}
