/**
 * The Live view's per-reply chart (uPlot): decode tokens/s of each finished reply of the current
 * conversation as bars (left axis), time to first token as a dashed line with points (right
 * axis), x = reply number. The legend under it shows the hovered (else the latest) reply's
 * figures. The canvas is
 * hidden from assistive tech: the table next to it has the same numbers.
 */
import { useMemo } from "react";
import uPlot from "uplot";
import { formatMs, formatTokensPerSecond } from "../lib/format.ts";
import type { ReplyPoint } from "../lib/live.ts";
import { chartTheme } from "./chart-theme.ts";
import { useUplot } from "./use-uplot.ts";

const HEIGHT = 200;
/** The x axis spans at least this many replies, so the first bars are not a wall of colour. */
const MIN_SPAN = 8;

type Data = [number[], number[], number[]];

function toData(replies: ReplyPoint[]): Data {
  return [
    replies.map((r) => r.n),
    replies.map((r) => r.tokensPerSecond),
    replies.map((r) => r.ttftMs),
  ];
}

/**
 * A legend value: the hovered reply's, else (cursor away) the latest reply's, so the legend
 * always says something.
 */
function legendValue(format: (v: number) => string) {
  return (u: uPlot, v: number | null, seriesIdx: number, idx: number | null): string => {
    const values = u.data[seriesIdx] ?? [];
    const value = idx == null ? values[values.length - 1] : v;
    return value == null ? "—" : format(value);
  };
}

/** `#2f6fd6` -> `#2f6fd655`: the bar fill, a translucent version of the line colour. */
function translucent(color: string): string {
  return /^#[0-9a-f]{6}$/i.test(color) ? `${color}59` : color;
}

export function ReplyChart({ replies }: { replies: ReplyPoint[] }) {
  const data = useMemo(() => toData(replies), [replies]);
  const host = useUplot(data, HEIGHT, (el) => {
    const { series: gauge, accent: ttft, axis } = chartTheme(el);
    return {
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false }, points: { size: 8 } },
      scales: {
        x: {
          time: false,
          range: (_u, min, max) => [min - 0.5, Math.max(max, min + MIN_SPAN - 1) + 0.5],
        },
        tps: { range: (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1] },
        ttft: { range: (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1] },
      },
      axes: [
        {
          ...axis,
          space: 28,
          incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
          values: (_u, splits) => splits.map((v) => `#${v}`),
        },
        {
          ...axis,
          scale: "tps",
          size: 64,
          values: (_u, splits) => splits.map((v) => `${v.toFixed(0)} t/s`),
        },
        {
          ...axis,
          scale: "ttft",
          side: 1,
          size: 64,
          grid: { show: false },
          values: (_u, splits) => splits.map((v) => formatMs(v)),
        },
      ],
      series: [
        { label: "Reply", value: legendValue((v) => `#${v}`) },
        {
          label: "Tokens per second",
          scale: "tps",
          stroke: gauge,
          fill: translucent(gauge),
          width: 1,
          paths: uPlot.paths.bars!({ size: [0.6, 48] }),
          points: { show: false },
          value: legendValue(formatTokensPerSecond),
        },
        {
          label: "Time to first token",
          scale: "ttft",
          stroke: ttft,
          width: 2,
          dash: [5, 4],
          points: { show: true, size: 7, fill: ttft, stroke: ttft },
          value: legendValue(formatMs),
        },
      ],
    };
  });

  return (
    <div ref={host} aria-hidden="true" className="reply-chart w-full min-w-0 overflow-hidden" />
  );
}
