/**
 * The compact live panel beside every view on wide windows (hidden below 1024 px, where the Live
 * view has the same figures).
 */
import { useMemo } from "react";
import { formatBytes, formatMs, formatPercent, formatTokensPerSecond } from "../lib/format.ts";
import { formatIoWait, memoryGauge, replyPoints } from "../lib/live.ts";
import { useAppState } from "../state/context.tsx";
import { Meter } from "./Meter.tsx";
import { ReplyBars } from "./ReplyBars.tsx";
import { Stat } from "./ui.tsx";

export function LiveAside() {
  const samples = useAppState((s) => s.samples);
  const engine = useAppState((s) => s.engine);
  const info = useAppState((s) => s.info);
  const last = samples.at(-1);
  const gauge = memoryGauge(last, engine, info?.totalMemoryBytes ?? null);
  const current = useAppState((s) => s.current);
  const replies = useMemo(() => replyPoints(current), [current]);
  const cache = last?.expertCache ?? null;
  return (
    <aside
      aria-label="Live"
      className="hidden w-72 shrink-0 flex-col gap-4 overflow-y-auto border-l border-line bg-panel p-4 lg:flex"
    >
      <h2 className="text-sm font-semibold tracking-wide text-muted uppercase">Live</h2>
      <div>
        <p className="text-sm font-medium">Engine memory</p>
        <p className="mb-1.5 text-xs text-muted tabular-nums">{gauge.text}</p>
        <Meter label="Engine memory" value={gauge.rss} max={gauge.max} valueText={gauge.text} />
        {gauge.free != null && (
          <p className="mt-1 text-xs text-muted tabular-nums">
            {formatBytes(gauge.free)} free on this machine
          </p>
        )}
      </div>
      <div>
        <dl className="grid grid-cols-2 gap-3">
          <Stat label="Speed" value={formatTokensPerSecond(last?.decodeTokensPerSecond)} />
          <Stat label="TTFT" value={formatMs(last?.ttftMs)} />
          {cache && <Stat label="Expert cache hits" value={formatPercent(cache.hitRate, 1)} />}
          {cache && (
            <Stat
              label="I/O per token"
              value={cache.readBytesPerToken == null ? "—" : formatBytes(cache.readBytesPerToken)}
            />
          )}
          {cache?.ioWaitMsPerToken != null && (
            <Stat label="I/O wait per token" value={formatIoWait(cache.ioWaitMsPerToken)} />
          )}
          {info?.features.energy && last?.joulesPerToken != null && (
            <Stat label="Energy" value={`${last.joulesPerToken.toFixed(2)} J/token`} />
          )}
          {info?.features.energy && last?.powerWatts != null && (
            <Stat label="Power" value={`${last.powerWatts.toFixed(1)} W`} />
          )}
          {info?.features.thermal && last?.thermal && <Stat label="Thermal" value={last.thermal} />}
        </dl>
      </div>
      <ReplyBars replies={replies} />
      {engine?.memory && (
        <dl className="grid grid-cols-2 gap-3 border-t border-line pt-3">
          <Stat label="Weights" value={formatBytes(engine.memory.weightsBytes)} />
          <Stat label="KV cache" value={formatBytes(engine.memory.kvBytes)} />
        </dl>
      )}
    </aside>
  );
}
