/**
 * Plain-text formatting for the UI. Sizes use decimal units (1 GB = 10^9 bytes) like the installer
 * and the catalog, so a download's "4.20 GB" matches what the CLI prints.
 */
import type { Download, EngineStatus, VerifyState } from "../../../core/app/api.ts";

const UNITS = ["B", "kB", "MB", "GB", "TB"] as const;

/** `1234567` -> `1.23 MB`; three significant digits, never exponent notation. */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes == null || !Number.isFinite(bytes)) return "—";
  if (bytes < 0) return `-${formatBytes(-bytes)}`;
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < UNITS.length - 1) {
    value /= 1000;
    unit++;
  }
  if (unit === 0) return `${Math.round(value)} B`;
  // Rounding can carry into the next unit (999.96 kB -> "1000 kB"): step up instead.
  if (Number(value.toPrecision(3)) >= 1000 && unit < UNITS.length - 1) {
    value /= 1000;
    unit++;
  }
  const digits = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${UNITS[unit]}`;
}

/**
 * Bytes per second in the unit that fits, as formatBytes writes sizes: `12.3 MB/s`, `17.0 kB/s`
 * (not "0.0 MB/s"); null (not measured yet) as an em dash.
 */
export function formatRate(bytesPerSecond: number | null | undefined): string {
  if (bytesPerSecond == null || !Number.isFinite(bytesPerSecond) || bytesPerSecond < 0) return "—";
  return `${formatBytes(bytesPerSecond)}/s`;
}

/** Seconds left as `45 s`, `3 min 5 s`, `2 h 10 min`; null or infinite: unknown. */
export function formatEta(seconds: number | null | undefined): string {
  if (seconds == null || !Number.isFinite(seconds) || seconds < 0) return "time left unknown";
  const s = Math.round(seconds);
  if (s < 1) return "less than a second left";
  if (s < 60) return `${s} s left`;
  const minutes = Math.floor(s / 60);
  if (minutes < 60) {
    const rest = s % 60;
    return rest === 0 ? `${minutes} min left` : `${minutes} min ${rest} s left`;
  }
  const hours = Math.floor(minutes / 60);
  const restMin = minutes % 60;
  return restMin === 0 ? `${hours} h left` : `${hours} h ${restMin} min left`;
}

/** Milliseconds as `660 ms` or `1.25 s`. */
export function formatMs(ms: number | null | undefined): string {
  if (ms == null || !Number.isFinite(ms)) return "—";
  if (ms < 1000) return `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(2)} s`;
}

/** A 0..1 fraction as `42%`; null as an em dash. */
export function formatPercent(fraction: number | null | undefined, digits = 0): string {
  if (fraction == null || !Number.isFinite(fraction)) return "—";
  return `${(fraction * 100).toFixed(digits)}%`;
}

export function formatTokensPerSecond(tps: number | null | undefined): string {
  if (tps == null || !Number.isFinite(tps)) return "—";
  return `${tps.toFixed(1)} t/s`;
}

/** Download progress 0..100 for a progressbar (integer; 0 while the total is unknown). */
export function downloadPercent(d: Pick<Download, "bytesDone" | "bytesTotal" | "state">): number {
  if (d.state === "done") return 100;
  if (!(d.bytesTotal > 0)) return 0;
  return Math.max(0, Math.min(100, Math.floor((d.bytesDone / d.bytesTotal) * 100)));
}

/** The verify-state text the Models view shows (and the e2e tests read). */
export function verifyStateText(v: VerifyState): string {
  switch (v.state) {
    case "ok":
      return "verified";
    case "unchecked":
      return "not checked";
    case "checking":
      return v.fraction == null ? "checking" : `checking ${Math.floor(v.fraction * 100)}%`;
    case "corrupt":
      return `corrupt: ${v.message ?? "a file does not match its hash"}`;
  }
}

/** `ready · demo`, `loading 40% · demo`, `generating · demo`, `crashed`, `no model loaded`. */
export function engineStateText(s: EngineStatus | null): string {
  if (!s) return "connecting";
  switch (s.state) {
    case "crashed":
      return "crashed";
    case "stopped":
      return s.model ? `stopped · ${s.model}` : "no model loaded";
    case "loading": {
      const pct = s.loadFraction == null ? "" : ` ${Math.floor(s.loadFraction * 100)}%`;
      return `loading${pct}${s.model ? ` · ${s.model}` : ""}`;
    }
    default:
      return s.model ? `${s.state} · ${s.model}` : s.state;
  }
}

/** Parses the "Memory budget (GB)" field: empty is no budget (null); undefined: invalid. */
export function parseGigabytes(text: string): number | null | undefined {
  const t = text.trim();
  if (t === "") return null;
  const n = Number(t);
  if (!Number.isFinite(n) || n <= 0) return undefined;
  return Math.round(n * 1e9);
}

/** Bytes as a GB number for an input field (no trailing zeros). */
export function bytesToGigabytesText(bytes: number | null): string {
  if (bytes == null) return "";
  return String(Number((bytes / 1e9).toFixed(2)));
}
