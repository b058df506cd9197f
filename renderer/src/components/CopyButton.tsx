import { useEffect, useState } from "react";
import { copyText } from "../lib/clipboard.ts";
import { Button } from "./ui.tsx";

/** A button that copies `getText()` and says "Copied" for a moment (announced politely). */
export function CopyButton({
  label,
  getText,
  small = true,
  variant = "ghost",
  className,
}: {
  label: string;
  getText: () => string;
  small?: boolean;
  variant?: "ghost" | "secondary";
  className?: string;
}) {
  const [state, setState] = useState<"idle" | "copied" | "failed">("idle");
  useEffect(() => {
    if (state === "idle") return;
    const t = setTimeout(() => setState("idle"), 1500);
    return () => clearTimeout(t);
  }, [state]);
  return (
    <>
      <Button
        small={small}
        variant={variant}
        className={className}
        onClick={() => {
          void copyText(getText()).then((ok) => setState(ok ? "copied" : "failed"));
        }}
      >
        {label}
      </Button>
      <span role="status" className="text-xs text-muted empty:hidden">
        {state === "copied" ? "Copied" : state === "failed" ? "Could not copy" : ""}
      </span>
    </>
  );
}
