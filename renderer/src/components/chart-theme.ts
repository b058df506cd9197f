/**
 * Colours and axis style for the uPlot charts, read from the theme's CSS variables on the chart's
 * element (so light and dark schemes both apply), with fallbacks where a variable is missing.
 */
export interface ChartTheme {
  muted: string;
  /** The main series (the memory gauge's colour). */
  series: string;
  /** A second series (the warning colour). */
  accent: string;
  grid: string;
  axis: {
    stroke: string;
    grid: { stroke: string; width: number };
    ticks: { stroke: string; width: number };
  };
}

export function chartTheme(el: Element): ChartTheme {
  const style = getComputedStyle(el);
  const v = (name: string, fallback: string): string =>
    style.getPropertyValue(name).trim() || fallback;
  const muted = v("--color-muted", "#666");
  const grid = v("--color-line", "#ddd");
  return {
    muted,
    series: v("--color-gauge", "#2f6fd6"),
    accent: v("--color-warn", "#a15c07"),
    grid,
    axis: { stroke: muted, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } },
  };
}
