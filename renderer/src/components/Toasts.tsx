import type { AppError } from "../../../core/app/api.ts";
import { ErrorAlert } from "./ErrorAlert.tsx";

export interface Toast {
  id: number;
  error: AppError;
  retry?: () => void;
}

/**
 * Failed calls, newest last, each dismissible. Bottom right of the main view, above the chat's
 * message box (not over its Send and Stop buttons) and beside the Live aside.
 */
export function Toasts({ toasts, dismiss }: { toasts: Toast[]; dismiss: (id: number) => void }) {
  if (!toasts.length) return null;
  return (
    <div className="pointer-events-none fixed right-3 bottom-28 z-50 lg:right-[19rem] flex w-[min(26rem,calc(100vw-1.5rem))] flex-col gap-2">
      {toasts.map((t) => (
        <ErrorAlert
          key={t.id}
          error={t.error}
          onRetry={
            t.retry &&
            (() => {
              dismiss(t.id);
              t.retry?.();
            })
          }
          onDismiss={() => dismiss(t.id)}
          floating
          className="pointer-events-auto"
        />
      ))}
    </div>
  );
}
