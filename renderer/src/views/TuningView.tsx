/**
 * Tuning: sampling (applies to the next reply) and engine settings (applied by a reload), with
 * what the engine settings cost in memory. Every change is saved at once; engine fields that
 * differ from what the engine was loaded with say "needs reload".
 */
import { useEffect, useRef, useState, type ComponentProps, type ReactNode } from "react";
import {
  effectiveGpuMisses,
  effectiveVramBudget,
  MAX_GPU_EXPERT_COPIES,
  type EngineSettings,
  type MemoryPlan,
  type SamplingSettings,
  type SettingsPatch,
} from "../../../core/app/api.ts";
import { ConfirmDialog } from "../components/ConfirmDialog.tsx";
import { NumberField, numberParser, type Parsed } from "../components/NumberField.tsx";
import { Badge, Button } from "../components/ui.tsx";
import { budgetText, formatBytes, formatPercent, parseBudgetText } from "../lib/format.ts";
import {
  deviceMemoryText,
  gpuExpertCopiesDisabledReason,
  gpuMemoryDisabledReason,
  gpuMissesDisabledReason,
  planVerdict,
} from "../lib/plan.ts";
import { MAX_STOP_STRINGS, parseStopStrings, stopStringsText } from "../lib/stop.ts";
import { useActions, useAppState } from "../state/context.tsx";

const PLAN_DELAY_MS = 250;
/** The model an unset `activeModel` means (the first-run state): the built-in demo. */
const DEMO_NAME = "demo";

/** The choices of "When the conversation is longer than the context", each with what it does. */
const OVERFLOW_CHOICES: Record<EngineSettings["contextOverflow"], { label: string; help: string }> =
  {
    rolling_window: {
      label: "Rolling window",
      help: "Leaves out the oldest messages (never the system prompt) and keeps writing when the context fills.",
    },
    truncate_middle: {
      label: "Truncate middle",
      help: "Keeps the system prompt and the first exchange, and leaves out messages after them.",
    },
    stop: {
      label: "Stop",
      help: "Sends the whole conversation or nothing: a reply stops when the context is full.",
    },
  };

/**
 * Where the GPU's expert misses run (docs/gpu.md, "Hybrid experts"), each with what it does; the
 * select lists them in this order, the default first.
 */
const GPU_MISSES_CHOICES: Record<EngineSettings["gpuMisses"], { label: string; help: string }> = {
  split: {
    label: "Split between GPU and CPU",
    help: 'Per layer and step, the GPU copies and computes as many of its misses as "Experts copied to the GPU" says, while the CPU computes the rest from system RAM at the same time. The default: on an NVIDIA H200 it was 1.1-1.4x faster than computing every miss on the CPU at 2 GB of GPU memory, 0.96-1.12x at 4 GB and 1.0-1.3x at 8 GB.',
  },
  cpu: {
    label: "Compute on CPU (hybrid)",
    help: "The GPU's misses are computed on the CPU from system RAM; only their results go to the GPU (like llama.cpp's --n-cpu-moe). Up to \"Experts copied to the GPU\" of them per layer and step are also copied to the GPU, so it learns the often-used ones.",
  },
  copy: {
    label: "Copy to GPU",
    help: "Each expert the GPU's slots miss is copied from system RAM to the GPU and computed there: exact, but every miss crosses to the GPU.",
  },
};

function parseBudget(text: string): Parsed {
  const v = parseBudgetText(text);
  return v === undefined
    ? { ok: false, error: "Enter a size such as 8 GiB or 512 MiB, or leave empty for no budget." }
    : { ok: true, value: v };
}

/** What the Tuning fields pass through to NumberField as they are. */
type FieldProps = Pick<
  ComponentProps<typeof NumberField>,
  "id" | "label" | "help" | "badge" | "extra" | "disabled"
>;

/**
 * A number from `min` to `max`, the input's bounds and the check alike; a whole number when the
 * step is whole.
 */
function RangeField({
  value,
  range: [min, max, step],
  onSave,
  ...field
}: FieldProps & {
  value: number;
  /** [min, max, step]. */
  range: [number, number, number];
  onSave: (value: number) => void;
}) {
  return (
    <NumberField
      {...field}
      value={value}
      parse={numberParser({ min, max, integer: Number.isInteger(step) })}
      onCommit={(v) => {
        // Never null: the parser takes no empty value.
        if (v !== null) onSave(v);
      }}
      min={min}
      max={max}
      step={step}
    />
  );
}

/** A memory size typed with its unit ("8 GiB"); empty: no budget. */
function BudgetField({
  onSave,
  ...field
}: FieldProps & { value: number | null; onSave: (bytes: number | null) => void }) {
  return (
    <NumberField
      {...field}
      parse={parseBudget}
      format={budgetText}
      onCommit={onSave}
      text
      placeholder="none"
    />
  );
}

export function TuningView() {
  const settings = useAppState((s) => s.settings);
  const engine = useAppState((s) => s.engine);
  const reloadNeeded = useAppState((s) => s.reloadNeeded);
  const hardwareThreads = useAppState((s) => s.info?.hardwareThreads ?? null);
  const { client, store, run } = useActions();
  const plan = useMemoryPlan(settings?.engine ?? null);
  const [confirmReset, setConfirmReset] = useState(false);

  if (!settings) {
    return (
      <div className="p-6">
        <h1 className="text-xl font-semibold">Tuning</h1>
        <p className="mt-2 text-sm text-muted">Loading settings…</p>
      </div>
    );
  }

  async function save(patch: SettingsPatch): Promise<void> {
    const r = await run(() => client.call("settings.update", patch));
    if (r) {
      store.dispatch({
        type: "event",
        event: { type: "settings", settings: r.settings, reloadNeeded: r.reloadNeeded },
      });
    }
  }
  const sampling = (patch: Partial<SamplingSettings>) => void save({ sampling: patch });
  const engineSet = (patch: Partial<EngineSettings>) => void save({ engine: patch });

  const loaded = engine?.loadedWith ?? null;
  const reloadBadge = (key: keyof EngineSettings): ReactNode =>
    loaded && loaded[key] !== settings.engine[key] ? <Badge tone="warn">needs reload</Badge> : null;
  const e = settings.engine;
  const s = settings.sampling;
  const vramBudget = effectiveVramBudget(e);
  const budgetSet = e.memoryBudgetBytes != null || vramBudget !== undefined;
  const gpuMemoryOff = gpuMemoryDisabledReason(e.backend);
  // The CPU ignores the GPU memory budget: it needs a reload only where a load would send it.
  const vramReloadBadge =
    loaded && effectiveVramBudget(loaded) !== vramBudget ? (
      <Badge tone="warn">needs reload</Badge>
    ) : null;
  // Likewise where the GPU's misses run: only under a GPU memory budget on a GPU backend, and the
  // copies only with "cpu" and "split".
  const gpuMisses = effectiveGpuMisses(e);
  const gpuMissesOff = gpuMissesDisabledReason(e);
  const gpuCopiesOff = gpuExpertCopiesDisabledReason(e);
  const loadedGpuMisses = loaded ? effectiveGpuMisses(loaded) : undefined;
  const gpuMissesReloadBadge =
    loaded && loadedGpuMisses?.gpuMisses !== gpuMisses?.gpuMisses ? (
      <Badge tone="warn">needs reload</Badge>
    ) : null;
  const gpuCopiesReloadBadge =
    loaded && loadedGpuMisses?.gpuExpertCopies !== gpuMisses?.gpuExpertCopies ? (
      <Badge tone="warn">needs reload</Badge>
    ) : null;

  return (
    <div className="mx-auto flex max-w-5xl flex-col gap-6 p-4 md:p-6">
      <div className="flex flex-wrap items-center justify-between gap-3">
        <h1 className="text-xl font-semibold">Tuning</h1>
        <Button variant="ghost" onClick={() => setConfirmReset(true)}>
          Reset to defaults
        </Button>
      </div>
      <ModelNote name={settings.activeModel ?? DEMO_NAME} />
      {confirmReset && (
        <ConfirmDialog
          title="Reset every setting to its default?"
          body="Sampling, context, memory, threads, the default system prompt and the server port go back to their defaults. Your conversations and models are not touched."
          confirmLabel="Reset settings"
          cancelLabel="Cancel"
          onConfirm={() =>
            void run(() => client.call("settings.reset", {})).then((settings) => {
              if (settings) {
                store.dispatch({
                  type: "event",
                  event: {
                    type: "settings",
                    settings,
                    reloadNeeded: store.getState().reloadNeeded,
                  },
                });
              }
            })
          }
          onClose={() => setConfirmReset(false)}
        />
      )}

      <section
        aria-labelledby="sampling-title"
        className="rounded-lg border border-line bg-panel p-4"
      >
        <h2 id="sampling-title" className="font-semibold">
          Sampling
        </h2>
        <p className="mb-4 text-xs text-muted">Applies to the next reply.</p>
        <div className="grid gap-4 sm:grid-cols-2 lg:grid-cols-3">
          <RangeField
            id="field-temperature"
            label="Temperature"
            value={s.temperature}
            range={[0, 2, 0.05]}
            onSave={(temperature) => sampling({ temperature })}
            help="0 always picks the most likely token."
          />
          <RangeField
            id="field-top-k"
            label="Top-k"
            value={s.topK}
            range={[0, 1000, 1]}
            onSave={(topK) => sampling({ topK })}
            help="0 turns it off."
          />
          <RangeField
            id="field-top-p"
            label="Top-p"
            value={s.topP}
            range={[0, 1, 0.01]}
            onSave={(topP) => sampling({ topP })}
          />
          <RangeField
            id="field-repetition-penalty"
            label="Repetition penalty"
            value={s.repetitionPenalty}
            range={[1, 2, 0.01]}
            onSave={(repetitionPenalty) => sampling({ repetitionPenalty })}
            help="1 turns it off."
          />
          <NumberField
            id="field-seed"
            label="Seed"
            value={s.seed}
            parse={numberParser({ min: 0, max: 2 ** 31 - 1, integer: true, empty: null })}
            onCommit={(v) => sampling({ seed: v })}
            min={0}
            step={1}
            placeholder="random"
            help="Empty: a random seed for each reply."
          />
          <RangeField
            id="field-max-new-tokens"
            label="Max new tokens"
            value={s.maxNewTokens}
            range={[1, 32768, 1]}
            onSave={(maxNewTokens) => sampling({ maxNewTokens })}
          />
        </div>
        <StopStrings
          key={stopStringsText(s.stop)}
          value={s.stop}
          onSave={(stop) => sampling({ stop })}
        />
        <DefaultSystemPrompt
          key={settings.systemPrompt}
          value={settings.systemPrompt}
          onSave={(systemPrompt) => void save({ systemPrompt })}
        />
      </section>

      <section
        aria-labelledby="engine-title"
        className="rounded-lg border border-line bg-panel p-4"
      >
        <div className="flex flex-wrap items-start justify-between gap-3">
          <div>
            <h2 id="engine-title" className="font-semibold">
              Engine
            </h2>
            <p className="mb-4 text-xs text-muted">Applied when the model is reloaded.</p>
          </div>
          <div className="flex items-center gap-2">
            {reloadNeeded && <span className="text-xs text-warn">Changes wait for a reload.</span>}
            <Button
              variant="primary"
              disabled={!reloadNeeded}
              onClick={() => void run(() => client.call("engine.reload", {}))}
            >
              Apply and reload
            </Button>
          </div>
        </div>
        <div className="grid gap-4 sm:grid-cols-2 lg:grid-cols-3">
          <RangeField
            id="field-context"
            label="Context length"
            value={e.context}
            range={[256, 131072, 256]}
            onSave={(context) => engineSet({ context })}
            badge={reloadBadge("context")}
            help="Tokens of prompt and reply the model can see."
            extra={<Cost label="KV cache" bytes={plan?.kvBytes} />}
          />
          <SelectField
            id="field-context-overflow"
            label="When the conversation is longer than the context"
            value={e.contextOverflow}
            options={Object.entries(OVERFLOW_CHOICES).map(([v, c]) => [v, c.label])}
            onChange={(v) => engineSet({ contextOverflow: v as EngineSettings["contextOverflow"] })}
            help={`${OVERFLOW_CHOICES[e.contextOverflow].help} Applies to the next reply.`}
          />
          <RangeField
            id="field-expert-cache-slots"
            label="Expert cache slots"
            value={e.expertCacheSlots}
            range={[4, 128, 1]}
            onSave={(expertCacheSlots) => engineSet({ expertCacheSlots })}
            badge={reloadBadge("expertCacheSlots")}
            help={
              budgetSet
                ? "Ignored while a memory or GPU memory budget is set: the budget picks the slots."
                : "Experts kept in memory per MoE layer (MoE models only)."
            }
            extra={
              <>
                <Cost label="Expert cache" bytes={plan?.expertCacheBytes} />
                {plan?.expertCacheSlots != null && <HitRate plan={plan} />}
              </>
            }
          />
          <BudgetField
            id="field-memory-budget"
            label="Memory budget"
            value={e.memoryBudgetBytes}
            onSave={(memoryBudgetBytes) => engineSet({ memoryBudgetBytes })}
            badge={reloadBadge("memoryBudgetBytes")}
            help="Such as 8 GiB or 512 MiB (a bare number is GiB). Empty: no budget. With one, the engine picks the expert slots that fit."
          />
          <BudgetField
            id="field-vram-budget"
            label="GPU memory"
            value={e.vramBudgetBytes}
            onSave={(vramBudgetBytes) => engineSet({ vramBudgetBytes })}
            disabled={gpuMemoryOff !== null}
            badge={vramReloadBadge}
            help={
              gpuMemoryOff ??
              "GPU memory for the model, such as 6 GiB. Empty: no budget. Every expert stays on the GPU when they fit, else the engine streams them through the slots that fit."
            }
          />
          <SelectField
            id="field-gpu-misses"
            label="Experts the GPU misses"
            value={e.gpuMisses}
            options={Object.entries(GPU_MISSES_CHOICES).map(([v, c]) => [v, c.label])}
            onChange={(v) => engineSet({ gpuMisses: v as EngineSettings["gpuMisses"] })}
            disabled={gpuMissesOff !== null}
            badge={gpuMissesReloadBadge}
            help={
              gpuMissesOff ??
              `${GPU_MISSES_CHOICES[e.gpuMisses].help} No effect when every expert fits in GPU memory.`
            }
          />
          <RangeField
            id="field-gpu-expert-copies"
            label="Experts copied to the GPU"
            value={e.gpuExpertCopies}
            range={[0, MAX_GPU_EXPERT_COPIES, 1]}
            onSave={(gpuExpertCopies) => engineSet({ gpuExpertCopies })}
            disabled={gpuCopiesOff !== null}
            badge={gpuCopiesReloadBadge}
            help={
              gpuCopiesOff ??
              (e.gpuMisses === "split"
                ? "Split: per MoE layer and step, how many of the GPU's misses it copies from system RAM and computes itself (the rest go to the CPU). 0: the CPU computes every miss. With Compute on CPU, the misses also copied to the GPU's slots instead."
                : "Compute on CPU: per MoE layer and step, at most this many of the experts the CPU computed are also copied to the GPU's slots, so it keeps the often-used ones. 0: none. With Split, the misses the GPU computes itself instead.")
            }
          />
          <RangeField
            id="field-threads"
            label="Threads"
            value={e.threads}
            range={[0, 256, 1]}
            onSave={(threads) => engineSet({ threads })}
            badge={reloadBadge("threads")}
            help={`0: one per core${hardwareThreads ? ` (${hardwareThreads} here)` : ""}.`}
          />
          <SelectField
            id="field-backend"
            label="Backend"
            value={e.backend}
            options={[
              ["cpu", "CPU"],
              ["metal", "GPU (Metal, Mac)"],
              ["vulkan", "GPU (Vulkan)"],
              ["auto", "Auto (a GPU when there is one)"],
            ]}
            onChange={(v) => engineSet({ backend: v as EngineSettings["backend"] })}
            badge={reloadBadge("backend")}
          />
          <SelectField
            id="field-kv-dtype"
            label="KV cache precision"
            value={e.kvDtype}
            options={[
              ["f16", "16-bit (half the memory)"],
              ["f32", "32-bit"],
            ]}
            onChange={(v) => engineSet({ kvDtype: v as EngineSettings["kvDtype"] })}
            badge={reloadBadge("kvDtype")}
          />
          <SelectField
            id="field-activations"
            label="Product precision"
            value={e.activations}
            options={[
              ["exact", "Exact (32-bit inputs everywhere)"],
              ["head", "8-bit inputs on the output head"],
              ["int8", "8-bit inputs everywhere"],
            ]}
            onChange={(v) => engineSet({ activations: v as EngineSettings["activations"] })}
            badge={reloadBadge("activations")}
            help="8-bit inputs make the CPU's weight products faster and the output slightly less exact; GPUs stay exact."
          />
        </div>
      </section>

      <PlanPanel plan={plan} />
    </div>
  );
}

/** The model whose settings these are: settings are kept per model (settings.models). */
function ModelNote({ name }: { name: string }) {
  return (
    <p className="-mt-3 text-sm text-muted" data-testid="tuning-model">
      Settings for <strong className="font-semibold break-all text-fg">{name}</strong>, saved for
      this model: each model keeps its own, and a new one starts from its catalog entry, its
      generation_config.json, then Redwing&apos;s defaults.
    </p>
  );
}

/** Stop strings, one per line; saved when the box is left with a valid list. */
function StopStrings({ value, onSave }: { value: string[]; onSave: (stop: string[]) => void }) {
  const [text, setText] = useState(() => stopStringsText(value));
  const parsed = parseStopStrings(text);
  const save = (): void => {
    if (parsed.ok && stopStringsText(parsed.value) !== stopStringsText(value)) onSave(parsed.value);
  };
  return (
    <div className="mt-4">
      <label htmlFor="field-stop-strings" className="text-sm font-medium">
        Stop strings
      </label>
      <textarea
        id="field-stop-strings"
        value={text}
        placeholder="none"
        onChange={(e) => setText(e.target.value)}
        onBlur={save}
        rows={2}
        spellCheck={false}
        aria-invalid={parsed.ok ? undefined : true}
        aria-describedby={`field-stop-strings-help${parsed.ok ? "" : " field-stop-strings-error"}`}
        className={`field-sizing-content mt-1 max-h-40 min-h-12 w-full rounded-md border bg-bg px-3 py-2 font-mono text-sm ${
          parsed.ok ? "border-line" : "border-danger"
        }`}
      />
      <p id="field-stop-strings-help" className="mt-1 text-xs text-muted">
        The reply ends before any of these (at most {MAX_STOP_STRINGS}, one per line; \n for a line
        break).
      </p>
      {!parsed.ok && (
        <p id="field-stop-strings-error" className="mt-1 text-xs text-danger">
          {parsed.error}
        </p>
      )}
    </div>
  );
}

/** The system prompt new conversations start with; saved when the field is left or the page closes. */
function DefaultSystemPrompt({ value, onSave }: { value: string; onSave: (text: string) => void }) {
  const [text, setText] = useState(value);
  const latest = useRef({ text, value, onSave });
  useEffect(() => {
    latest.current = { text, value, onSave };
  });
  useEffect(() => {
    const save = (): void => {
      const l = latest.current;
      if (l.text !== l.value) l.onSave(l.text);
    };
    window.addEventListener("pagehide", save);
    return () => {
      window.removeEventListener("pagehide", save);
      save();
    };
  }, []);
  return (
    <div className="mt-4">
      <label htmlFor="field-default-system-prompt" className="text-sm font-medium">
        Default system prompt
      </label>
      <textarea
        id="field-default-system-prompt"
        value={text}
        placeholder="Instructions new conversations start with (optional)"
        onChange={(e) => setText(e.target.value)}
        onBlur={() => {
          if (text !== value) onSave(text);
        }}
        rows={2}
        className="field-sizing-content mt-1 max-h-40 min-h-12 w-full rounded-md border border-line bg-bg px-3 py-2 text-sm"
      />
      <p className="mt-1 text-xs text-muted">
        Each conversation keeps its own copy (Chat, System prompt).
      </p>
    </div>
  );
}

function useMemoryPlan(engine: EngineSettings | null): MemoryPlan | null {
  const { client } = useActions();
  const [plan, setPlan] = useState<MemoryPlan | null>(null);
  useEffect(() => {
    if (!engine) return;
    let cancelled = false;
    const t = setTimeout(() => {
      client.call("settings.memoryPlan", { engine }).then(
        (p) => {
          if (!cancelled) setPlan(p);
        },
        () => {
          // No active model or a transient failure: keep showing the previous plan.
        },
      );
    }, PLAN_DELAY_MS);
    return () => {
      cancelled = true;
      clearTimeout(t);
    };
  }, [client, engine]);
  return plan;
}

function Cost({ label, bytes }: { label: string; bytes: number | undefined }) {
  if (bytes == null) return null;
  return (
    <p className="text-xs text-muted tabular-nums">
      {label}: <span className="font-medium text-fg">{formatBytes(bytes)}</span>
    </p>
  );
}

function HitRate({ plan }: { plan: MemoryPlan }) {
  return (
    <p className="text-xs text-muted tabular-nums">
      {plan.expertCacheSlots} slots · expected hit rate{" "}
      <span className="font-medium text-fg">{formatPercent(plan.expectedHitRate)}</span>
      {plan.hitRateSource && <> ({plan.hitRateSource === "measured" ? "measured" : "estimate"})</>}
    </p>
  );
}

function SelectField({
  id,
  label,
  value,
  options,
  onChange,
  badge,
  help,
  disabled = false,
}: {
  id: string;
  label: string;
  value: string;
  options: [string, string][];
  onChange: (v: string) => void;
  badge?: ReactNode;
  help?: string;
  /** Read-only, greyed (the help says why). */
  disabled?: boolean;
}) {
  return (
    <div className="flex flex-col gap-1">
      <label htmlFor={id} className="text-sm font-medium">
        {label}
      </label>
      <select
        id={id}
        value={value}
        onChange={(e) => onChange(e.target.value)}
        disabled={disabled}
        aria-describedby={
          [badge ? `${id}-badge` : "", help ? `${id}-help` : ""].filter(Boolean).join(" ") ||
          undefined
        }
        className="w-full rounded-md border border-line bg-bg px-3 py-1.5 text-sm disabled:opacity-60"
      >
        {options.map(([v, text]) => (
          <option key={v} value={v}>
            {text}
          </option>
        ))}
      </select>
      {help && (
        <p id={`${id}-help`} className="text-xs text-muted">
          {help}
        </p>
      )}
      {badge && <span id={`${id}-badge`}>{badge}</span>}
    </div>
  );
}

function PlanPanel({ plan }: { plan: MemoryPlan | null }) {
  if (!plan) return null;
  const free = plan.freeMemoryBytes;
  const fraction = free > 0 ? plan.totalBytes / free : 1;
  const verdict = planVerdict(plan);
  const device = deviceMemoryText(plan);
  return (
    <section aria-labelledby="plan-title" className="rounded-lg border border-line bg-panel p-4">
      <div className="flex flex-wrap items-center justify-between gap-2">
        <h2 id="plan-title" className="font-semibold">
          Memory plan{plan.model ? ` for ${plan.model}` : ""}
        </h2>
        <Badge tone={verdict.tone}>{verdict.label}</Badge>
      </div>
      {verdict.detail && (
        <p className="mt-1 text-xs text-danger" data-testid="plan-verdict">
          {verdict.detail}
        </p>
      )}
      <dl className="mt-3 grid grid-cols-2 gap-3 text-sm sm:grid-cols-5">
        <PlanStat label="Weights" value={formatBytes(plan.weightsBytes)} />
        <PlanStat label="KV cache" value={formatBytes(plan.kvBytes)} />
        <PlanStat
          label="Expert cache"
          value={plan.expertCacheSlots == null ? "dense model" : formatBytes(plan.expertCacheBytes)}
        />
        <PlanStat label="Working memory" value={formatBytes(plan.workBytes)} />
        <PlanStat
          label="Total"
          value={`${formatBytes(plan.totalBytes)} of ${formatBytes(free)} free`}
        />
        {device !== null && <PlanStat label="GPU memory" value={device} />}
      </dl>
      <div
        role="meter"
        aria-label="Planned memory"
        aria-valuemin={0}
        aria-valuemax={free}
        aria-valuenow={plan.totalBytes}
        aria-valuetext={`${formatBytes(plan.totalBytes)} of ${formatBytes(free)} free memory`}
        className="mt-3 h-2 w-full overflow-hidden rounded-full bg-panel-2"
      >
        <div
          className={`h-full rounded-full ${verdict.tone === "ok" ? "bg-gauge" : "bg-danger"}`}
          style={{ width: `${Math.min(100, fraction * 100).toFixed(1)}%` }}
        />
      </div>
      {plan.expertCacheSlots != null && (
        <p className="mt-2 text-xs text-muted">
          Expected expert-cache hit rate: {formatPercent(plan.expectedHitRate)}
          {plan.hitRateSource === "measured"
            ? " (measured on this machine)"
            : plan.hitRateSource === "estimate"
              ? " (estimate)"
              : ""}
          .
        </p>
      )}
    </section>
  );
}

function PlanStat({ label, value }: { label: string; value: string }) {
  return (
    <div className="min-w-0">
      <dt className="text-xs text-muted">{label}</dt>
      <dd className="font-medium tabular-nums">{value}</dd>
    </div>
  );
}
