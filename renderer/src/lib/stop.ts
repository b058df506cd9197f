/**
 * The Tuning view's "Stop strings" box: one string per line, `\n` for a newline inside one and
 * `\\` for a backslash. Checked against the settings' limits (core/app/api.ts: at most 8 strings
 * of 1 to 200 characters) before anything is saved.
 */
export const MAX_STOP_STRINGS = 8;
export const MAX_STOP_LENGTH = 200;

export type ParsedStops = { ok: true; value: string[] } | { ok: false; error: string };

function unescape(line: string): string {
  return line.replace(/\\(\\|n|t)/g, (_, c: string) =>
    c === "n" ? "\n" : c === "t" ? "\t" : "\\",
  );
}

function escape(stop: string): string {
  return stop.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/\t/g, "\\t");
}

/** The box's text as stop strings (empty lines skipped, duplicates once). */
export function parseStopStrings(text: string): ParsedStops {
  const value: string[] = [];
  for (const line of text.split("\n")) {
    if (line === "") continue;
    const stop = unescape(line);
    if (stop.length > MAX_STOP_LENGTH) {
      return {
        ok: false,
        error: `A stop string can be at most ${MAX_STOP_LENGTH} characters ("${line.slice(0, 20)}…" has ${stop.length}).`,
      };
    }
    if (!value.includes(stop)) value.push(stop);
  }
  if (value.length > MAX_STOP_STRINGS) {
    return {
      ok: false,
      error: `At most ${MAX_STOP_STRINGS} stop strings (there are ${value.length}).`,
    };
  }
  return { ok: true, value };
}

/** Stop strings as the box shows them (parseStopStrings reads them back). */
export function stopStringsText(stops: readonly string[]): string {
  return stops.map(escape).join("\n");
}
