/**
 * An error in plain words with its next step as a button (`AppError.action`). Shown where the
 * problem happened: the engine banner, a download row, a failed reply, a toast.
 */
import type { AppError } from "../../../core/app/api.ts";
import { ACTION_HINTS, ACTION_LABELS } from "../lib/actions.ts";
import { useActions, useAppState } from "../state/context.tsx";
import { Button } from "./ui.tsx";

export function ErrorAlert({
  error,
  onRetry,
  model,
  onDismiss,
  engineBanner = false,
  floating = false,
  className = "",
}: {
  error: AppError;
  /** What "Retry" repeats; without it the Retry button is not offered. */
  onRetry?: () => void;
  /** The model a verify/load action is about (default: the engine's). */
  model?: string | null;
  onDismiss?: () => void;
  /** The engine banner: other alerts leave engine actions to it. */
  engineBanner?: boolean;
  /** A toast: opaque background and a shadow. */
  floating?: boolean;
  className?: string;
}) {
  const { client, navigate, run, newChat } = useActions();
  const engineModel = useAppState((s) => s.engine?.model ?? s.settings?.activeModel ?? null);
  const engineAction = useAppState((s) => s.engine?.error?.action ?? null);
  const engineState = useAppState((s) => s.engine?.state ?? null);
  const action = error.action;
  let label =
    action === "apply_fix" ? (error.fix?.label ?? null) : action ? ACTION_LABELS[action] : null;
  if (action === "retry" && !onRetry) label = null;
  // Engine actions belong to the engine banner: a failed reply or a toast does not repeat its
  // button (one button per next step on screen), nor offer one once the engine is back.
  if (
    !engineBanner &&
    (action === "restart_engine" || action === "load_model") &&
    (engineAction !== null ||
      (engineState !== "stopped" && engineState !== "crashed" && engineState !== null))
  ) {
    label = null;
  }
  const target = model ?? engineModel;
  const hint = action ? ACTION_HINTS[action] : undefined;

  function perform(): void {
    switch (action) {
      case "restart_engine":
        void run(() => client.call("engine.reload", {}));
        break;
      case "load_model":
        void run(() => client.call("engine.load", target ? { model: target } : {}));
        break;
      case "verify_model":
        if (target) void run(() => client.call("models.verify", { name: target }));
        navigate("models");
        break;
      case "reinstall_model":
        navigate("models", "installed-models");
        break;
      case "raise_context":
        navigate("tuning", "field-context");
        break;
      case "new_chat":
        navigate("chat");
        void newChat();
        break;
      case "open_connections":
        navigate("connections");
        break;
      case "apply_fix": {
        const fix = error.fix;
        if (!fix) break;
        onDismiss?.();
        void run(() => client.call("engine.load", { model: fix.model, engine: fix.engine })).then(
          (status) => {
            // A reply refused for its context is written once the larger context is loaded.
            if (status && error.code === "context_overflow") onRetry?.();
          },
        );
        break;
      }
      case "retry":
        onRetry?.();
        break;
      default:
        break;
    }
  }

  return (
    <div
      role="alert"
      className={`flex flex-wrap items-start gap-x-3 gap-y-2 rounded-md border border-danger/40 px-3 py-2 text-sm ${
        floating ? "bg-panel shadow-lg" : "bg-danger/10"
      } ${className}`}
    >
      <div className="min-w-0 flex-1 basis-48">
        <p className="font-medium break-words text-fg">{error.message}</p>
        {hint && <p className="mt-0.5 text-xs text-muted">{hint}</p>}
        {error.detail && (
          <details className="mt-1 text-xs text-muted">
            <summary className="cursor-pointer">Technical details</summary>
            <pre className="mt-1 break-all whitespace-pre-wrap">{error.detail}</pre>
          </details>
        )}
      </div>
      <div className="flex shrink-0 items-center gap-2">
        {label && (
          <Button small variant="primary" onClick={perform}>
            {label}
          </Button>
        )}
        {onDismiss && (
          <Button small variant="ghost" aria-label="Close notification" onClick={onDismiss}>
            ✕
          </Button>
        )}
      </div>
    </div>
  );
}
