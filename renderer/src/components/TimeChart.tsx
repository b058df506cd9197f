/**
 * A uPlot line chart over time (seconds on the x axis). The canvas is hidden from assistive tech:
 * the figure's caption and the numbers beside it say the same in text. With `markRunEnds`, the
 * last value of each run between gaps gets a dot, so a run of a single sample (a reply shorter
 * than the sampling interval) is visible too.
 */
import { useEffect, useRef } from "react";
import { runEnds } from "../lib/live.ts";
import { chartTheme } from "./chart-theme.ts";
import { useUplot } from "./use-uplot.ts";

const HEIGHT = 180;
/** Two minutes: what the main process keeps. */
const WINDOW_S = 120;

function clock(seconds: number): string {
  return new Date(seconds * 1000).toLocaleTimeString([], {
    hourCycle: "h23",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
  });
}

export function TimeChart({
  data,
  label,
  format,
  markRunEnds = false,
}: {
  data: [number[], (number | null)[]];
  label: string;
  format: (v: number) => string;
  markRunEnds?: boolean;
}) {
  const fmt = useRef(format);
  useEffect(() => {
    fmt.current = format;
  });
  const host = useUplot(
    data,
    HEIGHT,
    (el) => {
      const { series: line, axis } = chartTheme(el);
      return {
        legend: { show: false },
        cursor: { show: true, points: { show: false } },
        scales: {
          // A rolling window: the newest sample at the right edge.
          x: { time: true, range: (_u, _min, max) => [max - WINDOW_S, max] },
          y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.2 : 1] },
        },
        axes: [
          { ...axis, space: 90, values: (_u, splits) => splits.map(clock) },
          { ...axis, size: 72, values: (_u, splits) => splits.map((v) => fmt.current(v)) },
        ],
        series: [
          {},
          {
            label,
            stroke: line,
            width: 2,
            spanGaps: false,
            points: markRunEnds
              ? {
                  show: false,
                  size: 7,
                  fill: line,
                  stroke: line,
                  filter: (self, i) => {
                    const ends = runEnds(self.data[i] ?? []);
                    return ends.length > 0 ? ends : null;
                  },
                }
              : { show: false },
          },
        ],
      };
    },
    [label, markRunEnds],
  );

  return <div ref={host} aria-hidden="true" className="w-full min-w-0 overflow-hidden" />;
}
