import type { AppError } from "../../../core/app/api.ts";

export type ErrorAction = NonNullable<AppError["action"]>;

/** The button each error action gets (the e2e tests find them by these names). */
export const ACTION_LABELS: Record<ErrorAction, string | null> = {
  restart_engine: "Restart engine",
  load_model: "Load model",
  verify_model: "Verify model",
  reinstall_model: "Reinstall model",
  retry: "Retry",
  raise_context: "Raise context length",
  new_chat: "Start a new chat",
  open_connections: "Open Connections",
  // Labelled by the error's own fix ("Load with 4096").
  apply_fix: null,
  // Nothing the app can do: a hint instead of a button.
  free_space: null,
};

export const ACTION_HINTS: Partial<Record<ErrorAction, string>> = {
  free_space: "Free some disk space (or remove a model you no longer use), then try again.",
  reinstall_model: "Remove the model and download it again from the Models view.",
};
