/**
 * A labelled number input that saves on change. The text being typed is kept locally (so "0." or
 * an empty field mid-edit is not overwritten); only values that parse and are in range are saved.
 * Values arriving from elsewhere replace the text unless the field has focus.
 */
import { useState, type ReactNode } from "react";

export type Parsed = { ok: true; value: number | null } | { ok: false; error: string };

export function numberParser(opts: {
  min: number;
  max: number;
  integer?: boolean;
  /** Empty input is this value (null: "none"); undefined: empty is invalid. */
  empty?: null;
}): (text: string) => Parsed {
  return (text) => {
    const t = text.trim();
    if (t === "") {
      return opts.empty === null
        ? { ok: true, value: null }
        : { ok: false, error: "Enter a number." };
    }
    const n = Number(t);
    if (!Number.isFinite(n)) return { ok: false, error: "Enter a number." };
    if (opts.integer && !Number.isInteger(n)) return { ok: false, error: "Enter a whole number." };
    if (n < opts.min || n > opts.max) {
      return { ok: false, error: `Enter a value from ${opts.min} to ${opts.max}.` };
    }
    return { ok: true, value: n };
  };
}

export function NumberField({
  id,
  label,
  value,
  parse,
  format = (v) => (v == null ? "" : String(v)),
  onCommit,
  min,
  max,
  step,
  help,
  badge,
  extra,
  placeholder,
  text: textInput = false,
  disabled = false,
}: {
  id: string;
  label: string;
  value: number | null;
  parse: (text: string) => Parsed;
  format?: (v: number | null) => string;
  onCommit: (v: number | null) => void;
  min?: number;
  max?: number;
  step?: number | "any";
  help?: string;
  /** Shown under the field, outside the label (so the label stays the field's exact name). */
  badge?: ReactNode;
  /** Below the field: what this value costs, for instance. */
  extra?: ReactNode;
  placeholder?: string;
  /** A text box instead of a number input: for values typed with a unit ("8 GiB"). */
  text?: boolean;
  /** Read-only, greyed (the help says why). */
  disabled?: boolean;
}) {
  const [text, setText] = useState(() => format(value));
  const [seen, setSeen] = useState(value);
  const [focused, setFocused] = useState(false);
  const [error, setError] = useState<string | null>(null);
  if (!Object.is(value, seen)) {
    // Adjusting state while rendering (React's documented pattern) instead of in an effect.
    setSeen(value);
    if (!focused) {
      setText(format(value));
      setError(null);
    }
  }

  function onChange(next: string): void {
    setText(next);
    const parsed = parse(next);
    if (!parsed.ok) {
      setError(parsed.error);
      return;
    }
    setError(null);
    if (!Object.is(parsed.value, value)) onCommit(parsed.value);
  }

  const describedBy = [help && `${id}-help`, error && `${id}-error`, badge && `${id}-badge`]
    .filter(Boolean)
    .join(" ");
  return (
    <div className="flex flex-col gap-1">
      <label htmlFor={id} className="truncate text-sm font-medium">
        {label}
      </label>
      <input
        id={id}
        type={textInput ? "text" : "number"}
        inputMode={textInput ? "text" : "decimal"}
        spellCheck={textInput ? false : undefined}
        autoComplete={textInput ? "off" : undefined}
        value={text}
        min={min}
        max={max}
        step={step}
        placeholder={placeholder}
        disabled={disabled}
        aria-invalid={error ? true : undefined}
        aria-describedby={describedBy || undefined}
        onChange={(e) => onChange(e.target.value)}
        onFocus={() => setFocused(true)}
        onBlur={() => {
          setFocused(false);
          // Normalize what was typed ("0.50" -> "0.5"); wrong input stays, with its error.
          const parsed = parse(text);
          if (parsed.ok) setText(format(parsed.value));
        }}
        className={`w-full rounded-md border bg-bg px-3 py-1.5 text-sm tabular-nums disabled:opacity-60 ${
          error ? "border-danger" : "border-line"
        }`}
      />
      {badge && <span id={`${id}-badge`}>{badge}</span>}
      {help && (
        <p id={`${id}-help`} className="text-xs text-muted">
          {help}
        </p>
      )}
      {error && (
        <p id={`${id}-error`} className="text-xs text-danger">
          {error}
        </p>
      )}
      {extra}
    </div>
  );
}
