/**
 * Live: what the engine is doing now, from the samples the main process pushes twice a second.
 * Energy and thermal figures appear only on machines that expose them.
 */
import { useMemo } from "react";
import { Meter } from "../components/Meter.tsx";
import { TimeChart } from "../components/TimeChart.tsx";
import { Stat } from "../components/ui.tsx";
import { formatBytes, formatMs, formatPercent, formatTokensPerSecond } from "../lib/format.ts";
import { memoryGauge, tokensPerSecondSeries } from "../lib/live.ts";
import { useAppState } from "../state/context.tsx";

export function LiveView() {
  const samples = useAppState((s) => s.samples);
  const engine = useAppState((s) => s.engine);
  const info = useAppState((s) => s.info);
  const last = samples.at(-1);
  const gauge = memoryGauge(last, engine, info?.totalMemoryBytes ?? null);
  const tps = useMemo(() => tokensPerSecondSeries(samples), [samples]);
  const rssSeries = useMemo<[number[], (number | null)[]]>(
    () => [samples.map((s) => s.t / 1000), samples.map((s) => s.rssBytes)],
    [samples],
  );
  const generating = samples.filter((s) => s.generating && s.decodeTokensPerSecond != null);
  const peakTps = generating.reduce((m, s) => Math.max(m, s.decodeTokensPerSecond ?? 0), 0);
  const cache = last?.expertCache ?? null;
  const energy = info?.features.energy ?? false;
  const thermal = info?.features.thermal ?? false;
  const usedOfFree = last && last.rssBytes != null ? last.rssBytes + last.freeMemoryBytes : null;

  return (
    <div className="mx-auto flex max-w-5xl flex-col gap-6 p-4 md:p-6">
      <h1 className="text-xl font-semibold">Live</h1>

      <section aria-labelledby="live-memory" className="rounded-lg border border-line bg-panel p-4">
        <h2 id="live-memory" className="mb-3 font-semibold">
          Memory
        </h2>
        <div className="flex flex-col gap-4">
          <div>
            <div className="mb-1 flex flex-wrap items-baseline justify-between gap-2 text-sm">
              <span>
                Used by the engine, of its{" "}
                {gauge.maxKind === "budget" ? "budget" : "machine's total"}
              </span>
              <span className="text-muted tabular-nums">{gauge.text}</span>
            </div>
            <Meter
              label={gauge.maxKind === "budget" ? "Resident vs budget" : "Resident vs total memory"}
              value={gauge.rss}
              max={gauge.max}
              valueText={gauge.text}
            />
          </div>
          {usedOfFree != null && last && (
            <div>
              <div className="mb-1 flex flex-wrap items-baseline justify-between gap-2 text-sm">
                <span>Used by the engine, of what it could use (its own plus free)</span>
                <span className="text-muted tabular-nums">
                  {formatBytes(last.rssBytes)} used · {formatBytes(last.freeMemoryBytes)} free
                </span>
              </div>
              <Meter
                label="Resident vs free memory"
                value={last.rssBytes ?? 0}
                max={usedOfFree}
                valueText={`${formatBytes(last.rssBytes)} used, ${formatBytes(last.freeMemoryBytes)} free`}
              />
            </div>
          )}
          <dl className="grid grid-cols-2 gap-3 sm:grid-cols-4">
            <Stat label="Resident now" value={formatBytes(last?.rssBytes)} />
            <Stat label="Peak" value={formatBytes(last?.peakRssBytes)} />
            <Stat label="Weights" value={formatBytes(engine?.memory?.modelBytes)} />
            <Stat label="KV cache" value={formatBytes(engine?.memory?.kvBytes)} />
          </dl>
          <figure>
            <TimeChart data={rssSeries} label="Resident memory" format={formatBytes} />
            <figcaption className="mt-1 text-xs text-muted">
              Resident memory over the last two minutes.
            </figcaption>
          </figure>
        </div>
      </section>

      <section aria-labelledby="live-speed" className="rounded-lg border border-line bg-panel p-4">
        <h2 id="live-speed" className="mb-3 font-semibold">
          Speed
        </h2>
        <dl className="mb-4 grid grid-cols-2 gap-3 sm:grid-cols-4">
          <Stat
            label="Tokens per second"
            value={formatTokensPerSecond(last?.decodeTokensPerSecond)}
          />
          <Stat label="Peak (2 min)" value={peakTps > 0 ? formatTokensPerSecond(peakTps) : "—"} />
          <Stat label="Time to first token" value={formatMs(last?.ttftMs)} />
          <Stat label="Tokens in reply" value={last?.generatedTokens ?? "—"} />
        </dl>
        <figure>
          <TimeChart data={tps} label="Tokens per second" format={(v) => v.toFixed(0)} />
          <figcaption className="mt-1 text-xs text-muted">
            Tokens per second while replying, over the last two minutes (gaps: idle).
          </figcaption>
        </figure>
      </section>

      <section aria-labelledby="live-cache" className="rounded-lg border border-line bg-panel p-4">
        <h2 id="live-cache" className="mb-3 font-semibold">
          Expert cache{energy || thermal ? ", energy and temperature" : ""}
        </h2>
        <dl className="grid grid-cols-2 gap-3 sm:grid-cols-4">
          {cache ? (
            <>
              <Stat label="Slots per layer" value={cache.slots} />
              <Stat label="Hit rate" value={formatPercent(cache.hitRate, 1)} />
              <Stat
                label="I/O per token"
                value={
                  cache.readBytesPerToken == null
                    ? "—"
                    : `${(cache.readBytesPerToken / 1e6).toFixed(2)} MB/token`
                }
              />
            </>
          ) : (
            <p className="col-span-full text-sm text-muted">
              No expert cache: the loaded model is dense or fully in memory.
            </p>
          )}
          {energy && last?.joulesPerToken != null && (
            <Stat label="Energy" value={`${last.joulesPerToken.toFixed(2)} J/token`} />
          )}
          {energy && last?.powerWatts != null && (
            <Stat label="Power" value={`${last.powerWatts.toFixed(1)} W`} />
          )}
          {thermal && last?.thermal && <Stat label="Thermal state" value={last.thermal} />}
        </dl>
      </section>
    </div>
  );
}
