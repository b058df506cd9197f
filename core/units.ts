/**
 * Byte sizes as people read them, in one unit family everywhere: binary units (1 MiB = 2^20
 * bytes), the engine's own (native/src/runtime/memory_plan.cpp writes its plan in MiB). The app's
 * views (Tuning, Live, Models), the CLI (`redwing models`, `install`, the statistics line) and the
 * error messages all print sizes through `formatBytes`, so one byte count reads the same wherever
 * it appears. No Node imports: the renderer uses it too.
 */

const KiB = 1024;
const UNITS = ["KiB", "MiB", "GiB", "TiB"] as const;

/** `73.0 MiB`, `1.21 GiB`, `17.0 KiB`, `512 B`: GiB and up with two decimals, else one. */
export function formatBytes(bytes: number): string {
  if (bytes < 0) return `-${formatBytes(-bytes)}`;
  if (bytes < KiB) return `${Math.round(bytes)} B`;
  let value = bytes / KiB;
  let unit = 0;
  while (unit < UNITS.length - 1 && value >= KiB) {
    value /= KiB;
    unit++;
  }
  // Rounding can carry into the next unit (1023.96 MiB would read "1024.0 MiB"): step up.
  const digits = (u: number): number => (u >= 2 ? 2 : 1);
  if (unit < UNITS.length - 1 && Number(value.toFixed(digits(unit))) >= KiB) {
    value /= KiB;
    unit++;
  }
  return `${value.toFixed(digits(unit))} ${UNITS[unit]}`;
}

/** Bytes per second in the unit that fits: `12.3 MiB/s`, `17.0 KiB/s` (never "0.0 MiB/s"). */
export function formatByteRate(bytesPerSecond: number): string {
  return `${formatBytes(bytesPerSecond)}/s`;
}

export const GIB = 1024 ** 3;
export const MIB = 1024 ** 2;

/**
 * A size typed by a person: `8G`, `8 GiB`, `512M`, `1.5 gb`, `1073741824` (K/M/G/T are powers of
 * 1024, as formatBytes writes them); a bare number is multiplied by `bareUnit` (1: bytes).
 * Undefined when the text is not a size or not positive.
 */
export function parseByteSize(text: string, bareUnit = 1): number | undefined {
  const m = /^\s*(\d+(?:\.\d+)?|\.\d+)\s*([kmgt]?)(i?b)?\s*$/i.exec(text);
  if (!m) return undefined;
  const power = ["", "k", "m", "g", "t"].indexOf(m[2]!.toLowerCase());
  // "8" alone is a bare number; "8b" is bytes.
  const unit = m[2] === "" && m[3] === undefined ? bareUnit : 1024 ** power;
  const bytes = Math.floor(Number(m[1]) * unit);
  return bytes > 0 ? bytes : undefined;
}

/** A size for an input field that parseByteSize reads back: `107 MiB`, `8 GiB`, `1.5 GiB`. */
export function byteSizeText(bytes: number): string {
  if (bytes >= GIB) return `${Number((bytes / GIB).toFixed(3))} GiB`;
  return `${Number((bytes / MIB).toFixed(1))} MiB`;
}
