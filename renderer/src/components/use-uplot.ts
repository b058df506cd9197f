/**
 * The lifecycle both uPlot charts share: build the plot once the host element exists (its
 * options from `build`, which reads the theme from that element), feed it new data as it comes,
 * follow the host's width, and destroy it on unmount or when `deps` change.
 */
import { useEffect, useRef, type DependencyList, type RefObject } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

const MIN_WIDTH = 200;

export function useUplot(
  data: uPlot.AlignedData,
  height: number,
  build: (el: HTMLDivElement) => Omit<uPlot.Options, "width" | "height">,
  deps: DependencyList = [],
): RefObject<HTMLDivElement | null> {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const latest = useRef(data);
  const make = useRef(build);

  useEffect(() => {
    latest.current = data;
    make.current = build;
    plot.current?.setData(data);
  });

  useEffect(() => {
    const el = host.current;
    if (!el) return;
    const width = (): number => Math.max(MIN_WIDTH, el.clientWidth);
    const u = new uPlot({ ...make.current(el), width: width(), height }, latest.current, el);
    plot.current = u;
    const ro = new ResizeObserver(() => u.setSize({ width: width(), height }));
    ro.observe(el);
    return () => {
      ro.disconnect();
      u.destroy();
      plot.current = null;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps -- rebuilt only when the caller says
  }, [height, ...deps]);

  return host;
}
