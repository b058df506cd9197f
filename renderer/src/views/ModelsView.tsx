/**
 * Models: the catalog (what can be downloaded, what it costs on this machine), a search of the
 * hub for more (what Redwing can run, and why not the rest), downloads in progress, and the
 * installed models.
 */
import { useEffect, useMemo, useRef, useState, type FormEvent } from "react";
import {
  AppCallError,
  type AppError,
  type CatalogItem,
  type DiscoveredModel,
  type Download,
  type InstalledModel,
  type ModelSearch,
} from "../../../core/app/api.ts";
import { ConfirmDialog } from "../components/ConfirmDialog.tsx";
import { ErrorAlert } from "../components/ErrorAlert.tsx";
import { Badge, Button } from "../components/ui.tsx";
import {
  downloadPercent,
  formatBytes,
  formatEta,
  formatRate,
  verifyStateText,
} from "../lib/format.ts";
import { useActions, useAppState } from "../state/context.tsx";

export function ModelsView() {
  return (
    <div className="mx-auto flex max-w-5xl flex-col gap-8 p-4 md:p-6">
      <h1 className="text-xl font-semibold">Models</h1>
      <InstalledSection />
      <DownloadsSection />
      <CatalogSection />
      <SearchSection />
    </div>
  );
}

function SectionTitle({ id, children }: { id: string; children: string }) {
  return (
    <h2 id={id} className="mb-3 text-base font-semibold">
      {children}
    </h2>
  );
}

// ---- catalog ------------------------------------------------------------------------------------

function CatalogSection() {
  const catalog = useAppState((s) => s.catalog);
  const downloads = useAppState((s) => s.downloads);
  const { client, store, run } = useActions();
  const [repo, setRepo] = useState("");

  async function install(ref: string): Promise<boolean> {
    const download = await run(() => client.call("models.install", { ref }));
    if (download) store.dispatch({ type: "event", event: { type: "download", download } });
    return !!download;
  }

  async function onRepoSubmit(e: FormEvent): Promise<void> {
    e.preventDefault();
    const ref = repo.trim();
    if (ref && (await install(ref))) setRepo("");
  }

  const active = (ref: string) =>
    downloads.some((d) => d.ref === ref && (d.state === "running" || d.state === "paused"));

  return (
    <section aria-label="Catalog">
      <SectionTitle id="catalog-title">Catalog</SectionTitle>
      {!catalog && <p className="text-sm text-muted">Loading the catalog…</p>}
      <div className="grid gap-3 sm:grid-cols-2">
        {catalog?.map((item) => (
          <CatalogCard
            key={item.id}
            item={item}
            downloading={active(item.id)}
            onDownload={() => void install(item.id)}
          />
        ))}
      </div>
      <form
        onSubmit={(e) => void onRepoSubmit(e)}
        className="mt-4 flex flex-col gap-2 rounded-lg border border-line bg-panel p-4"
      >
        <label htmlFor="hf-repo" className="text-sm font-medium">
          Hugging Face repository
        </label>
        <p id="hf-repo-hint" className="text-xs text-muted">
          An MLX 4-bit repository such as <code>mlx-community/gemma-3-1b-it-4bit</code>; add{" "}
          <code>@revision</code> to pin one.
        </p>
        <div className="flex flex-wrap gap-2">
          <input
            id="hf-repo"
            value={repo}
            onChange={(e) => setRepo(e.target.value)}
            placeholder="owner/repository"
            aria-describedby="hf-repo-hint"
            spellCheck={false}
            autoComplete="off"
            className="min-w-0 flex-1 basis-56 rounded-md border border-line bg-bg px-3 py-1.5 text-sm"
          />
          <Button type="submit" variant="primary" disabled={!repo.trim()}>
            Download repository
          </Button>
        </div>
      </form>
    </section>
  );
}

function CatalogCard({
  item,
  downloading,
  onDownload,
}: {
  item: CatalogItem;
  downloading: boolean;
  onDownload: () => void;
}) {
  return (
    <article
      aria-label={item.title}
      className="flex flex-col gap-2 rounded-lg border border-line bg-panel p-4"
    >
      <div className="flex items-start justify-between gap-2">
        <h3 className="font-semibold">{item.title}</h3>
        {item.kind === "demo" && <Badge>demo</Badge>}
      </div>
      <p className="text-sm text-muted">{item.description}</p>
      <dl className="grid grid-cols-[auto_1fr] gap-x-3 gap-y-0.5 text-sm">
        <dt className="text-muted">Download</dt>
        <dd className="tabular-nums">
          {item.downloadBytes == null ? "built in" : formatBytes(item.downloadBytes)}
        </dd>
        <dt className="text-muted">On disk</dt>
        <dd className="tabular-nums">{formatBytes(item.installBytes)}</dd>
        <dt className="text-muted">Memory</dt>
        <dd className="tabular-nums">
          {formatBytes(item.memoryBytes)}{" "}
          {item.fits ? (
            <Badge tone="ok">fits this machine</Badge>
          ) : (
            <Badge tone="danger">more than this machine has</Badge>
          )}
        </dd>
      </dl>
      {item.memoryNote && <p className="text-xs text-muted">{item.memoryNote}</p>}
      <p className="text-xs text-muted">
        Licence:{" "}
        <a href={item.licence.url} target="_blank" rel="noreferrer noopener">
          {item.licence.name}
        </a>
        {item.licence.gated && (
          <span className="ml-1">
            <Badge tone="warn">gated</Badge>
          </span>
        )}
        {item.licence.note && <span className="block">{item.licence.note}</span>}
      </p>
      <div className="mt-auto flex items-center gap-2 pt-1">
        {item.installedAs ? (
          <span className="text-sm font-medium text-ok">Installed</span>
        ) : (
          <Button variant="primary" onClick={onDownload} disabled={downloading}>
            Download
          </Button>
        )}
        {downloading && <span className="text-xs text-muted">Downloading…</span>}
      </div>
    </article>
  );
}

// ---- hub search ---------------------------------------------------------------------------------

/** Typing pauses this long before a search goes out. */
const SEARCH_DEBOUNCE_MS = 400;

function SearchSection() {
  const downloads = useAppState((s) => s.downloads);
  const models = useAppState((s) => s.models);
  const { client, store, run } = useActions();
  const [query, setQuery] = useState("");
  const [runnableOnly, setRunnableOnly] = useState(false);
  const [result, setResult] = useState<ModelSearch | null>(null);
  const [error, setError] = useState<AppError | null>(null);
  const [busy, setBusy] = useState(false);
  const pending = useRef<AbortController | null>(null);
  const [attempt, setAttempt] = useState(0);

  // Debounced and cancellable: each new query aborts the previous one (the app ends that search
  // too), and an aborted search's answer is dropped.
  useEffect(() => {
    const text = query.trim();
    pending.current?.abort();
    if (text.length < 2) return;
    const controller = new AbortController();
    pending.current = controller;
    const timer = setTimeout(() => {
      setBusy(true);
      client.call("models.search", { query: text }).then(
        (found) => {
          if (controller.signal.aborted) return;
          setResult(found);
          setError(null);
          setBusy(false);
        },
        (e: unknown) => {
          if (controller.signal.aborted) return;
          const appError =
            e instanceof AppCallError
              ? e.error
              : { code: "internal", message: String(e), action: null };
          if (appError.code === "search_superseded") return;
          setResult(null);
          setError({ ...appError, action: "retry" });
          setBusy(false);
        },
      );
    }, SEARCH_DEBOUNCE_MS);
    controller.signal.addEventListener("abort", () => clearTimeout(timer));
    return () => controller.abort();
  }, [query, attempt, client]);

  async function install(repo: string): Promise<void> {
    const download = await run(() => client.call("models.install", { ref: repo }));
    if (download) store.dispatch({ type: "event", event: { type: "download", download } });
  }

  const active = (repo: string) =>
    downloads.some((d) => d.ref === repo && (d.state === "running" || d.state === "paused"));
  const installedNow = (m: DiscoveredModel) =>
    m.installedAs !== null && (models?.some((x) => x.name === m.installedAs) ?? true);
  const installedByDownload = (repo: string) =>
    downloads.some((d) => d.ref === repo && d.state === "done");
  const shown = result?.models.filter((m) => !runnableOnly || m.status === "runnable") ?? [];

  return (
    <section aria-label="Search the hub">
      <SectionTitle id="search-title">Search the hub</SectionTitle>
      <form
        role="search"
        onSubmit={(e) => {
          e.preventDefault();
          setAttempt((n) => n + 1);
        }}
        className="flex flex-col gap-2 rounded-lg border border-line bg-panel p-4"
      >
        <label htmlFor="hub-search" className="text-sm font-medium">
          Find models on {result ? result.endpoint.replace(/^https?:\/\//, "") : "the hub"}
        </label>
        <div className="flex flex-wrap items-center gap-3">
          <input
            id="hub-search"
            type="search"
            value={query}
            onChange={(e) => setQuery(e.target.value)}
            placeholder="gemma, mlx-community/gemma-3…"
            spellCheck={false}
            autoComplete="off"
            className="min-w-0 flex-1 basis-56 rounded-md border border-line bg-bg px-3 py-1.5 text-sm"
          />
          <label className="flex items-center gap-1.5 text-sm">
            <input
              type="checkbox"
              checked={runnableOnly}
              onChange={(e) => setRunnableOnly(e.target.checked)}
            />
            Only what Redwing runs
          </label>
        </div>
        <p className="text-xs text-muted" aria-live="polite">
          {busy && query.trim().length >= 2
            ? "Searching…"
            : result
              ? `${result.models.length} result${result.models.length === 1 ? "" : "s"} for “${result.query}”, most downloaded first; memory at your engine settings.${result.tokenSet ? "" : " No HF_TOKEN set: gated models need one."}`
              : "Type at least two characters."}
        </p>
      </form>
      {error && (
        <ErrorAlert
          className="mt-3"
          error={error}
          onRetry={() => setAttempt((n) => n + 1)}
          onDismiss={() => setError(null)}
        />
      )}
      {shown.length > 0 && (
        <div className="mt-3 grid gap-3 sm:grid-cols-2" aria-label="Search results" role="list">
          {shown.map((m) => (
            <SearchResultCard
              key={m.repo}
              model={m}
              installed={installedNow(m) || installedByDownload(m.repo)}
              downloading={active(m.repo)}
              onInstall={() => void install(m.repo)}
            />
          ))}
        </div>
      )}
    </section>
  );
}

function SearchResultCard({
  model: m,
  installed,
  downloading,
  onInstall,
}: {
  model: DiscoveredModel;
  installed: boolean;
  downloading: boolean;
  onInstall: () => void;
}) {
  const unsupported = m.status === "unsupported";
  return (
    <article
      role="listitem"
      aria-label={m.repo}
      aria-disabled={unsupported || undefined}
      className={`flex flex-col gap-2 rounded-lg border border-line bg-panel p-4 ${unsupported ? "opacity-60" : ""}`}
    >
      <div className="flex items-start justify-between gap-2">
        <h3 className="font-semibold break-all">
          <a href={m.url} target="_blank" rel="noreferrer noopener">
            {m.repo}
          </a>
        </h3>
        <span className="flex shrink-0 gap-1">
          {m.architecture && <Badge>{m.architecture}</Badge>}
          {m.gated && <Badge tone="warn">gated</Badge>}
        </span>
      </div>
      {m.reason && (
        <p className={`text-sm ${unsupported ? "text-muted" : "text-warn"}`}>
          {unsupported ? "Redwing can't run this: " : ""}
          {m.reason}
        </p>
      )}
      <dl className="grid grid-cols-[auto_1fr] gap-x-3 gap-y-0.5 text-sm">
        {m.format && (
          <>
            <dt className="text-muted">Format</dt>
            <dd>{m.format}</dd>
          </>
        )}
        {m.downloadBytes !== null && (
          <>
            <dt className="text-muted">Download</dt>
            <dd className="tabular-nums">{formatBytes(m.downloadBytes)}</dd>
          </>
        )}
        {m.installBytes !== null && (
          <>
            <dt className="text-muted">On disk</dt>
            <dd className="tabular-nums">{formatBytes(m.installBytes)}</dd>
          </>
        )}
        {m.memoryBytes !== null && (
          <>
            <dt className="text-muted">Memory</dt>
            <dd className="tabular-nums">
              {formatBytes(m.memoryBytes)}{" "}
              {m.fits ? (
                <Badge tone="ok">fits this machine</Badge>
              ) : (
                <Badge tone="danger">more than this machine has</Badge>
              )}
            </dd>
          </>
        )}
        <dt className="text-muted">Licence</dt>
        <dd>
          {m.licence.url ? (
            <a href={m.licence.url} target="_blank" rel="noreferrer noopener">
              {m.licence.name ?? m.licence.id ?? "see the model page"}
            </a>
          ) : (
            (m.licence.name ?? m.licence.id ?? "not stated")
          )}
          {m.gated && (
            <span className="ml-1 text-xs text-muted">
              {m.access === "granted"
                ? "(your token has access)"
                : m.access === "denied"
                  ? "(accept the licence on the model page)"
                  : "(needs HF_TOKEN and the licence accepted)"}
            </span>
          )}
        </dd>
        <dt className="text-muted">Downloads</dt>
        <dd className="tabular-nums">{m.downloads.toLocaleString()}</dd>
      </dl>
      <div className="mt-auto flex items-center gap-2 pt-1">
        {installed ? (
          <span className="text-sm font-medium text-ok">Installed</span>
        ) : m.status === "runnable" ? (
          <Button variant="primary" onClick={onInstall} disabled={downloading}>
            Install
          </Button>
        ) : null}
        {downloading && <span className="text-xs text-muted">Downloading…</span>}
      </div>
    </article>
  );
}

// ---- downloads ----------------------------------------------------------------------------------

function DownloadsSection() {
  const all = useAppState((s) => s.downloads);
  const models = useAppState((s) => s.models);
  // A finished download whose model was removed since is not "Installed" any more: drop its card.
  const downloads = useMemo(
    () => all.filter((d) => d.state !== "done" || !models || models.some((m) => m.name === d.name)),
    [all, models],
  );
  return (
    <section aria-label="Downloads" className={downloads.length ? "" : "hidden"}>
      <SectionTitle id="downloads-title">Downloads</SectionTitle>
      <div className="flex flex-col gap-3">
        {downloads.map((d) => (
          <DownloadRow key={d.taskId} download={d} />
        ))}
      </div>
    </section>
  );
}

const PHASES: Record<Download["phase"], string> = {
  resolving: "Looking up the repository",
  planning: "Planning",
  verifying: "Checking files already here",
  downloading: "Downloading",
  paused: "Paused",
  finishing: "Finishing",
  done: "Installed",
};

function DownloadRow({ download: d }: { download: Download }) {
  const { client, store, run } = useActions();
  const pct = downloadPercent(d);
  const labelId = `download-${d.taskId}`;
  // Before the installer knows the size (looking up the repository, planning) there is no
  // percentage to show: an indeterminate bar and the phase say what is happening.
  const sized = d.bytesTotal > 0 || d.state === "done";

  async function act(method: "models.pause" | "models.resume" | "models.cancel"): Promise<void> {
    const download = await run(() => client.call(method, { taskId: d.taskId }));
    if (download) store.dispatch({ type: "event", event: { type: "download", download } });
  }

  async function dismiss(): Promise<void> {
    const ok = await run(() => client.call("models.dismiss", { taskId: d.taskId }));
    if (ok) store.dispatch({ type: "downloadDismissed", taskId: d.taskId });
  }

  const status =
    d.state === "cancelled"
      ? "Cancelled"
      : d.state === "failed"
        ? "Failed"
        : d.state === "paused"
          ? "Paused"
          : PHASES[d.phase];
  const finished = d.state === "done" || d.state === "failed" || d.state === "cancelled";

  return (
    <article
      aria-label={d.name}
      className="flex flex-col gap-2 rounded-lg border border-line bg-panel p-4"
    >
      <div className="flex flex-wrap items-baseline justify-between gap-2">
        <h3 id={labelId} className="font-semibold break-all">
          {d.name}
        </h3>
        <span className="text-xs text-muted">{d.ref}</span>
      </div>
      <div
        role="progressbar"
        aria-labelledby={labelId}
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={sized ? pct : undefined}
        aria-valuetext={
          sized
            ? `${pct}% (${formatBytes(d.bytesDone)} of ${formatBytes(d.bytesTotal)})`
            : `${status}: size not known yet`
        }
        aria-busy={!sized && d.state === "running" ? true : undefined}
        className="h-2 w-full overflow-hidden rounded-full bg-panel-2"
      >
        {sized ? (
          <div
            className={`h-full rounded-full transition-[width] ${
              d.state === "failed" ? "bg-danger" : d.state === "done" ? "bg-ok" : "bg-gauge"
            }`}
            style={{ width: `${pct}%` }}
          />
        ) : (
          d.state === "running" && (
            <div className="indeterminate h-full w-1/4 rounded-full bg-gauge" />
          )
        )}
      </div>
      <p className="flex flex-wrap gap-x-3 text-sm text-muted tabular-nums">
        <span data-testid="download-status" className="font-medium text-fg">
          {status}
          {!sized && d.state === "running" ? "…" : ""}
        </span>
        {sized && (
          <span data-testid="download-bytes">
            {pct}% · {formatBytes(d.bytesDone)} of {formatBytes(d.bytesTotal)}
          </span>
        )}
        {d.state === "running" && d.phase === "downloading" && (
          <span data-testid="download-rate">{formatRate(d.rate)}</span>
        )}
        {d.state === "running" && d.phase === "downloading" && (
          <span>{formatEta(d.etaSeconds)}</span>
        )}
      </p>
      {d.file && d.state === "running" && (
        <p className="truncate text-xs text-muted" title={d.file}>
          {d.file}
        </p>
      )}
      {d.note && <p className="text-xs text-muted">{d.note}</p>}
      {d.error && (
        <ErrorAlert error={d.error} onRetry={() => void act("models.resume")} model={d.name} />
      )}
      <div className="flex flex-wrap gap-2">
        {d.state === "running" && <Button onClick={() => void act("models.pause")}>Pause</Button>}
        {d.state === "paused" && (
          <Button variant="primary" onClick={() => void act("models.resume")}>
            Resume
          </Button>
        )}
        {(d.state === "running" || d.state === "paused") && (
          <Button variant="danger" onClick={() => void act("models.cancel")}>
            Cancel
          </Button>
        )}
        {finished && <Button onClick={() => void dismiss()}>Dismiss</Button>}
      </div>
    </article>
  );
}

// ---- installed ----------------------------------------------------------------------------------

function InstalledSection() {
  const models = useAppState((s) => s.models);
  return (
    <section aria-label="Installed models" id="installed-models" tabIndex={-1}>
      <SectionTitle id="installed-title">Installed models</SectionTitle>
      {!models && <p className="text-sm text-muted">Loading…</p>}
      {models?.length === 0 && (
        <p className="text-sm text-muted">
          No models installed yet: download one from the catalog.
        </p>
      )}
      <div className="flex flex-col gap-3">
        {models?.map((m) => (
          <InstalledRow key={m.name} model={m} />
        ))}
      </div>
    </section>
  );
}

function InstalledRow({ model: m }: { model: InstalledModel }) {
  const { client, run } = useActions();
  const engine = useAppState((s) => s.engine);
  const [confirming, setConfirming] = useState(false);
  const [revealed, setRevealed] = useState<string | null>(null);
  const busy =
    m.loaded || engine?.model === m.name
      ? engine?.state === "loading" || engine?.state === "starting"
      : false;
  const tone =
    m.verify.state === "ok"
      ? "ok"
      : m.verify.state === "corrupt"
        ? "danger"
        : m.verify.state === "checking"
          ? "accent"
          : "neutral";

  async function doReveal(): Promise<void> {
    const r = await run(() => client.call("models.reveal", { name: m.name }));
    if (r) setRevealed(r.shown ? null : r.path);
  }

  return (
    <article
      aria-label={m.name}
      className="flex flex-col gap-2 rounded-lg border border-line bg-panel p-4"
    >
      <div className="flex flex-wrap items-center gap-2">
        <h3 className="font-semibold break-all">{m.name}</h3>
        {m.isDemo && <Badge>demo</Badge>}
        {m.loaded && <Badge tone="ok">loaded</Badge>}
        <span className="text-xs text-muted">
          {m.family}
          {m.moe ? " · mixture of experts" : ""}
        </span>
      </div>
      <p className="flex flex-wrap gap-x-4 text-sm text-muted tabular-nums">
        <span>{formatBytes(m.sizeBytes)} on disk</span>
        <span>about {formatBytes(m.memoryEstimateBytes)} of memory at its settings</span>
      </p>
      <p className="flex items-center gap-2 text-sm">
        <span className="text-muted">Integrity:</span>
        <Badge tone={tone}>
          <span data-testid="verify-state">{verifyStateText(m.verify)}</span>
        </Badge>
      </p>
      <div className="flex flex-wrap gap-2">
        {m.loaded ? (
          <Button onClick={() => void run(() => client.call("engine.unload", {}))}>Unload</Button>
        ) : (
          <Button
            variant="primary"
            disabled={busy}
            onClick={() => void run(() => client.call("engine.load", { model: m.name }))}
          >
            Load
          </Button>
        )}
        <Button
          disabled={m.verify.state === "checking"}
          onClick={() => void run(() => client.call("models.verify", { name: m.name }))}
        >
          Verify
        </Button>
        {/* Electron opens the file manager; web mode answers the path, shown below. */}
        <Button onClick={() => void doReveal()}>Reveal in folder</Button>
        <Button variant="danger" onClick={() => setConfirming(true)}>
          Remove
        </Button>
      </div>
      {revealed && (
        <p className="text-xs text-muted">
          Folder: <code className="break-all select-all">{revealed}</code>
        </p>
      )}
      {confirming && (
        <ConfirmDialog
          title={`Remove ${m.name}?`}
          body={`Its files (${formatBytes(m.sizeBytes)}) will be deleted from this machine. You can download it again later.`}
          confirmLabel="Remove model"
          onConfirm={() => void run(() => client.call("models.remove", { name: m.name }))}
          onClose={() => setConfirming(false)}
        />
      )}
    </article>
  );
}
