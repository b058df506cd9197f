/**
 * Stop strings matched on the decoded text stream. Text before a stop string is emitted, the
 * stop string and everything after it are not. A stop string may arrive split over several
 * pieces, so the matcher holds back only the longest tail of the text that could still be the
 * start of a stop string, and releases it as soon as it cannot.
 */
export interface StopResult {
  /** Text that is now safe to emit. */
  text: string;
  /** True once a stop string has been seen; later input is ignored. */
  stopped: boolean;
  /** The stop string that matched, when stopped. */
  stop?: string;
}

export class StopMatcher {
  private readonly stops: string[];
  private held = "";
  private done = false;

  constructor(stops: readonly string[]) {
    this.stops = [...new Set(stops.filter((s) => s.length > 0))];
  }

  push(piece: string): StopResult {
    if (this.done) return { text: "", stopped: true };
    const text = this.held + piece;
    // The earliest occurrence of any stop string ends the stream (ties: the longer one).
    let at = -1;
    let which = "";
    for (const s of this.stops) {
      const i = text.indexOf(s);
      if (i !== -1 && (at === -1 || i < at || (i === at && s.length > which.length))) {
        at = i;
        which = s;
      }
    }
    if (at !== -1) {
      this.done = true;
      this.held = "";
      return { text: text.slice(0, at), stopped: true, stop: which };
    }
    const keep = this.partialSuffixLength(text);
    this.held = text.slice(text.length - keep);
    return { text: text.slice(0, text.length - keep), stopped: false };
  }

  /** End of stream: whatever was held back is ordinary text after all. */
  flush(): string {
    if (this.done) return "";
    const rest = this.held;
    this.held = "";
    return rest;
  }

  get stopped(): boolean {
    return this.done;
  }

  /** Length of the longest suffix of `text` that is a proper prefix of some stop string. */
  private partialSuffixLength(text: string): number {
    let best = 0;
    for (const s of this.stops) {
      for (let n = Math.min(s.length - 1, text.length); n > best; n--) {
        if (text.endsWith(s.slice(0, n))) {
          best = n;
          break;
        }
      }
    }
    return best;
  }
}
