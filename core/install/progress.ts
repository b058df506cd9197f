/** Progress events of an install: throttled, with a download rate and ETA over ~10 s. */

export type InstallPhase =
  "resolving" | "planning" | "verifying" | "downloading" | "paused" | "finishing" | "done";

export interface InstallProgress {
  phase: InstallPhase;
  /** Bytes done and in all for this phase (downloading: bytes of the ranges to fetch). */
  bytesDone: number;
  bytesTotal: number;
  /** Download rate over the last seconds in bytes/s; null until measured. */
  rate: number | null;
  /** Seconds left at that rate; null when unknown. */
  etaSeconds: number | null;
  /** The file being worked on. */
  file: string | null;
  /** Something to tell the user (a retry, a server quirk, a resume); sent once. */
  note?: string;
}

export class ProgressReporter {
  phase: InstallPhase = "resolving";
  done = 0;
  total = 0;
  file: string | null = null;
  /** Bytes received in this run, net of failed attempts (for the rate). */
  received = 0;
  private samples: { t: number; bytes: number }[] = [];
  private last = 0;

  constructor(private readonly sink?: (p: InstallProgress) => void) {}

  setPhase(phase: InstallPhase, done: number, total: number, file: string | null = null): void {
    this.phase = phase;
    this.done = done;
    this.total = total;
    this.file = file;
    this.emit(true);
  }

  /** Bytes received (negative: taken back after a failed attempt). */
  add(n: number): void {
    this.done += n;
    this.received += n;
    this.emit(false);
  }

  /** Work done that is not received bytes (verifying, finishing). */
  advance(n: number, file: string | null): void {
    this.done += n;
    this.file = file;
    this.emit(false);
  }

  note(note: string): void {
    this.emit(true, note);
  }

  private rate(now: number): number | null {
    this.samples.push({ t: now, bytes: this.received });
    while (this.samples.length > 2 && now - this.samples[0]!.t > 10_000) this.samples.shift();
    const first = this.samples[0]!;
    const dt = (now - first.t) / 1000;
    if (dt < 0.5) return null;
    return Math.max(0, (this.received - first.bytes) / dt);
  }

  emit(force: boolean, note?: string): void {
    if (!this.sink) return;
    const now = Date.now();
    if (!force && now - this.last < 100) return;
    this.last = now;
    const rate = this.phase === "downloading" ? this.rate(now) : null;
    const eta = rate && rate > 0 ? Math.max(0, (this.total - this.done) / rate) : null;
    this.sink({
      phase: this.phase,
      bytesDone: this.done,
      bytesTotal: this.total,
      rate,
      etaSeconds: eta,
      file: this.file,
      ...(note !== undefined ? { note } : {}),
    });
  }
}
