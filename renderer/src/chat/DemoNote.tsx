/**
 * While the built-in demo model is loaded, Chat says what it is: a tiny model trained for the
 * demo, not an assistant, so its odd replies are not mistaken for a broken app. Once dismissed
 * it stays away (kept in localStorage; web mode's origin, and so its storage, changes with each
 * launch's port, so there it comes back on the next launch).
 */
import { useState } from "react";
import { Button } from "../components/ui.tsx";
import { useActions, useAppState } from "../state/context.tsx";
import type { State } from "../state/store.ts";

const DISMISSED_KEY = "redwing.demoNoteDismissed";

/** The loaded model is the demo: the catalog's demo entry as installed, else the name "demo". */
export function demoLoaded(s: State): boolean {
  const model = s.engine?.model;
  if (s.settings?.remote) return false; // chatting with a model on a connection
  if (!model || s.engine?.state === "stopped" || s.engine?.state === "crashed") return false;
  const demo = s.catalog?.find((c) => c.kind === "demo");
  return model === (demo?.installedAs ?? "demo");
}

function wasDismissed(): boolean {
  try {
    return localStorage.getItem(DISMISSED_KEY) === "1";
  } catch {
    return false;
  }
}

export function DemoNote() {
  const { navigate } = useActions();
  const shown = useAppState(demoLoaded);
  const [dismissed, setDismissed] = useState(wasDismissed);
  if (!shown || dismissed) return null;
  function dismiss(): void {
    setDismissed(true);
    try {
      localStorage.setItem(DISMISSED_KEY, "1");
    } catch {
      // Shown again after a reload then.
    }
  }
  return (
    <aside
      role="note"
      aria-label="About the demo model"
      className="mx-4 mb-2 flex flex-col gap-2 rounded-md border border-warn/40 bg-warn/10 px-3 py-2 text-sm sm:flex-row sm:items-center"
    >
      <p className="min-w-0 flex-1">
        <strong>Demo model:</strong> a tiny model trained for this demo on Bible verses and fortune
        cookies. It is not an assistant; expect odd replies. Real models are in Models.
      </p>
      <span className="flex shrink-0 gap-2">
        <Button small onClick={() => navigate("models")}>
          Open Models
        </Button>
        <Button small variant="ghost" onClick={dismiss}>
          Dismiss
        </Button>
      </span>
    </aside>
  );
}
