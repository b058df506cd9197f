/**
 * Live: what the engine is doing now, from the samples the main process pushes twice a second.
 * Energy and thermal figures appear only on machines that expose them.
 */
import { useMemo } from "react";
import { Meter } from "../components/Meter.tsx";
import { ReplyChart } from "../components/ReplyChart.tsx";
import { TimeChart } from "../components/TimeChart.tsx";
import { Stat } from "../components/ui.tsx";
import { formatBytes, formatMs, formatPercent, formatTokensPerSecond } from "../lib/format.ts";
import {
  deviceMemoryGauge,
  expertTierStats,
  formatIoWait,
  memoryGauge,
  replyPoints,
  tokensPerSecondSeries,
  type ReplyPoint,
} from "../lib/live.ts";
import { useAppState } from "../state/context.tsx";

export function LiveView() {
  const samples = useAppState((s) => s.samples);
  const engine = useAppState((s) => s.engine);
  const info = useAppState((s) => s.info);
  const last = samples.at(-1);
  const gauge = memoryGauge(last, engine, info?.totalMemoryBytes ?? null);
  const deviceText = deviceMemoryGauge(engine);
  const tps = useMemo(() => tokensPerSecondSeries(samples), [samples]);
  const current = useAppState((s) => s.current);
  const replies = useMemo(() => replyPoints(current), [current]);
  const rssSeries = useMemo<[number[], (number | null)[]]>(
    () => [samples.map((s) => s.t / 1000), samples.map((s) => s.rssBytes)],
    [samples],
  );
  const generating = samples.filter(
    (s) => (s.generating || s.finished) && s.decodeTokensPerSecond != null,
  );
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
                {
                  { budget: "budget", plan: "planned memory", total: "machine's total" }[
                    gauge.maxKind
                  ]
                }
              </span>
              <span className="text-muted tabular-nums">{gauge.text}</span>
            </div>
            <Meter
              label={
                {
                  budget: "Resident vs budget",
                  plan: "Resident vs planned memory",
                  total: "Resident vs total memory",
                }[gauge.maxKind]
              }
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
          <dl className="grid grid-cols-2 gap-3 sm:grid-cols-5">
            <Stat label="Resident now" value={formatBytes(last?.rssBytes)} />
            <Stat label="Peak" value={formatBytes(last?.peakRssBytes)} />
            {/* The plan's figures for the loaded settings, as the Tuning view shows them. */}
            <Stat label="Weights" value={formatBytes(engine?.memory?.weightsBytes)} />
            <Stat label="KV cache" value={formatBytes(engine?.memory?.kvBytes)} />
            <Stat label="Planned total" value={formatBytes(engine?.memory?.estimateBytes)} />
            {/* GPU backends: the device memory planned for the loaded settings, apart from RSS. */}
            {deviceText !== null && <Stat label="GPU memory" value={deviceText} />}
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
        <h3 className="mb-2 text-sm font-medium">Per reply in this conversation</h3>
        <RepliesFigure replies={replies} title={current?.title ?? null} />
        <h3 className="mt-6 mb-2 text-sm font-medium">Over time</h3>
        <figure>
          <TimeChart
            data={tps}
            label="Tokens per second"
            format={(v) => v.toFixed(0)}
            markRunEnds
          />
          <figcaption className="mt-1 text-xs text-muted">
            Tokens per second while replying, over the last two minutes (gaps: idle; a dot: where a
            reply finished).
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
                    : `${formatBytes(cache.readBytesPerToken)}/token`
                }
              />
              {cache.ioWaitMsPerToken != null && (
                <Stat
                  label="I/O wait per token"
                  value={formatIoWait(cache.ioWaitMsPerToken)}
                  hint="Time the engine waited for expert weights to be read, per token"
                />
              )}
              {/* A GPU backend's tiers and hybrid experts; nothing on the CPU. */}
              {expertTierStats(cache, engine?.gpuMisses).map((s) => (
                <Stat key={s.label} label={s.label} value={s.value} hint={s.hint} />
              ))}
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

/** How many replies the table lists (the newest). */
const TABLE_ROWS = 8;

/** The current conversation's replies: tokens/s and TTFT per reply, and the latest in a table. */
function RepliesFigure({ replies, title }: { replies: ReplyPoint[]; title: string | null }) {
  if (replies.length === 0) {
    return (
      <p className="rounded-md bg-panel-2 px-3 py-4 text-sm text-muted">
        No replies in this conversation yet: send a message in Chat and each reply&apos;s speed
        shows up here.
      </p>
    );
  }
  const rows = replies.slice(-TABLE_ROWS).reverse();
  return (
    <div className="flex flex-col gap-4">
      <figure className="min-w-0">
        <ReplyChart replies={replies} />
        <figcaption className="mt-1 text-xs text-muted">
          Tokens per second per reply (bars) and time to first token (dashed) in{" "}
          {title ? <q>{title}</q> : "this conversation"}.
        </figcaption>
      </figure>
      <div className="min-w-0 overflow-x-auto">
        <table className="w-full text-sm tabular-nums">
          <caption className="mb-1 text-left text-xs text-muted">
            {replies.length > TABLE_ROWS
              ? `Last ${TABLE_ROWS} of ${replies.length} replies, newest first`
              : `${replies.length === 1 ? "The reply" : `All ${replies.length} replies`}, newest first`}
          </caption>
          <thead>
            <tr className="border-b border-line text-xs text-muted">
              <th scope="col" className="py-1 pr-3 text-left font-normal">
                #
              </th>
              <th scope="col" className="py-1 pr-3 text-right font-normal">
                t/s
              </th>
              <th scope="col" className="py-1 pr-3 text-right font-normal">
                TTFT
              </th>
              <th scope="col" className="py-1 pr-3 text-right font-normal">
                Tokens
              </th>
              <th scope="col" className="py-1 text-right font-normal">
                Hit rate
              </th>
            </tr>
          </thead>
          <tbody>
            {rows.map((r) => (
              <tr key={r.messageId} className="border-b border-line/60 last:border-0">
                <th scope="row" className="py-1 pr-3 text-left font-medium">
                  {r.n}
                </th>
                <td className="py-1 pr-3 text-right">{r.tokensPerSecond.toFixed(1)}</td>
                <td className="py-1 pr-3 text-right">{formatMs(r.ttftMs)}</td>
                <td className="py-1 pr-3 text-right">{r.tokens}</td>
                <td className="py-1 text-right">{formatPercent(r.hitRate, 1)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </div>
  );
}
