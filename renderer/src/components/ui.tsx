import type { ComponentProps, ReactNode } from "react";

type Variant = "primary" | "secondary" | "danger" | "ghost";

const VARIANTS: Record<Variant, string> = {
  primary: "bg-accent text-on-accent hover:bg-accent-strong border-transparent",
  secondary: "bg-panel text-fg border-line hover:bg-panel-2",
  danger: "bg-panel text-danger border-danger/50 hover:bg-danger/10",
  ghost: "bg-transparent text-fg border-transparent hover:bg-panel-2",
};

export function Button({
  variant = "secondary",
  small,
  className = "",
  type = "button",
  ...rest
}: ComponentProps<"button"> & { variant?: Variant; small?: boolean }) {
  return (
    <button
      type={type}
      className={`inline-flex items-center justify-center gap-1 rounded-md border font-medium whitespace-nowrap transition-colors disabled:cursor-not-allowed disabled:opacity-50 ${
        small ? "px-2 py-0.5 text-xs" : "px-3 py-1.5 text-sm"
      } ${VARIANTS[variant]} ${className}`}
      {...rest}
    />
  );
}

export function Badge({
  tone = "neutral",
  children,
  id,
}: {
  tone?: "neutral" | "ok" | "warn" | "danger" | "accent";
  children: ReactNode;
  id?: string;
}) {
  const tones = {
    neutral: "bg-panel-2 text-muted",
    ok: "bg-ok/15 text-ok",
    warn: "bg-warn/15 text-warn",
    danger: "bg-danger/15 text-danger",
    accent: "bg-accent/15 text-accent",
  };
  return (
    <span
      id={id}
      className={`inline-block rounded px-1.5 py-0.5 text-xs font-medium whitespace-nowrap ${tones[tone]}`}
    >
      {children}
    </span>
  );
}

/** A labelled value in a stats grid. */
export function Stat({ label, value, hint }: { label: string; value: ReactNode; hint?: string }) {
  return (
    <div className="min-w-0">
      <dt className="text-xs text-muted">{label}</dt>
      <dd className="truncate text-sm font-medium tabular-nums" title={hint}>
        {value}
      </dd>
    </div>
  );
}

export function Panel({
  children,
  className = "",
  label,
  as: As = "section",
}: {
  children: ReactNode;
  className?: string;
  label?: string;
  as?: "section" | "article" | "div";
}) {
  return (
    <As aria-label={label} className={`rounded-lg border border-line bg-panel p-4 ${className}`}>
      {children}
    </As>
  );
}
