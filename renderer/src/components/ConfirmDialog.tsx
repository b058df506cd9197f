import { useEffect, useId, useRef } from "react";
import { Button } from "./ui.tsx";

/**
 * A modal confirmation (native <dialog>: focus is trapped, Escape cancels, the page behind is
 * inert). Mount it to open it.
 */
export function ConfirmDialog({
  title,
  body,
  confirmLabel,
  cancelLabel = "Keep it",
  onConfirm,
  onClose,
}: {
  title: string;
  body: string;
  confirmLabel: string;
  cancelLabel?: string;
  onConfirm: () => void;
  onClose: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  const titleId = useId();
  const bodyId = useId();
  useEffect(() => {
    const dialog = ref.current;
    // No close() on cleanup: removing the element closes it, and a queued close event would
    // reach the parent after a StrictMode remount.
    if (dialog && !dialog.open) dialog.showModal();
  }, []);
  return (
    <dialog
      ref={ref}
      aria-labelledby={titleId}
      aria-describedby={bodyId}
      onClose={onClose}
      className="m-auto w-[min(28rem,calc(100vw-2rem))] rounded-lg border border-line bg-panel p-5 text-fg shadow-xl backdrop:bg-black/40"
    >
      <h2 id={titleId} className="text-lg font-semibold">
        {title}
      </h2>
      <p id={bodyId} className="mt-2 text-sm text-muted">
        {body}
      </p>
      <div className="mt-5 flex justify-end gap-2">
        <Button autoFocus onClick={() => ref.current?.close()}>
          {cancelLabel}
        </Button>
        <Button
          variant="danger"
          onClick={() => {
            onConfirm();
            ref.current?.close();
          }}
        >
          {confirmLabel}
        </Button>
      </div>
    </dialog>
  );
}
