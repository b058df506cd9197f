/**
 * Plain-text formatting for the UI. Sizes use binary units (1 GiB = 2^30 bytes) through
 * core/units.ts, the formatter the CLI, the error messages and the engine's own plan use, so one
 * byte count reads the same in every view and in `redwing models`.
 */
import type { Download, EngineStatus, VerifyState } from "../../../core/app/api.ts";
import {
  byteSizeText,
  formatBytes as formatSize,
  GIB,
  parseByteSize,
} from "../../../core/units.ts";

/** `1234567` -> `1.2 MiB`; unknown values as an em dash. */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes == null || !Number.isFinite(bytes)) return "—";
  return formatSize(bytes);
}

/**
 * Bytes per second in the unit that fits, as formatBytes writes sizes: `12.3 MiB/s`, `17.0 KiB/s`
 * (not "0.0 MiB/s"); null (not measured yet) as an em dash.
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

/**
 * Parses the "Memory budget" field: `8 GiB`, `512 MiB`, `1.5G` (a bare number is GiB); empty is
 * no budget (null); undefined: invalid.
 */
export function parseBudgetText(text: string): number | null | undefined {
  if (text.trim() === "") return null;
  return parseByteSize(text, GIB);
}

/** A budget as the field shows it (read back by parseBudgetText): `107 MiB`, `8 GiB`. */
export function budgetText(bytes: number | null): string {
  return bytes == null ? "" : byteSizeText(bytes);
}
