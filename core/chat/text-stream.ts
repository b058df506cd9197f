/**
 * The text side of generation: generated token ids in, text pieces out. Ties together
 * incremental detokenization (never splits a character) and stop strings (never emits one),
 * and stops at the model's end-of-turn ids.
 */
import { IncrementalDecoder, type DecodeFn } from "./detokenize.ts";
import { StopMatcher } from "./stop.ts";

export type FinishReason = "stop_token" | "stop_string" | "length";

export class TextStream {
  private readonly decoder: IncrementalDecoder;
  private readonly matcher: StopMatcher;
  private readonly stopIds: Set<number>;
  private finished: FinishReason | null = null;

  constructor(
    decode: DecodeFn,
    options: { stopStrings?: readonly string[]; stopIds?: Iterable<number> },
  ) {
    this.decoder = new IncrementalDecoder(decode);
    this.matcher = new StopMatcher(options.stopStrings ?? []);
    this.stopIds = new Set(options.stopIds ?? []);
  }

  /** Feeds one generated token; returns the text to show now. */
  push(id: number): string {
    if (this.finished) return "";
    if (this.stopIds.has(id)) {
      this.finished = "stop_token";
      return this.matcher.flush();
    }
    const r = this.matcher.push(this.decoder.push(id));
    if (r.stopped) this.finished = "stop_string";
    return r.text;
  }

  /** End of generation: the text still held back (an incomplete character, a partial stop). */
  end(): string {
    if (this.finished) return "";
    this.finished = "length";
    const r = this.matcher.push(this.decoder.flush());
    if (r.stopped) {
      this.finished = "stop_string";
      return r.text;
    }
    return r.text + this.matcher.flush();
  }

  /** Why the stream ended, or null while it goes on. */
  get finishReason(): FinishReason | null {
    return this.finished;
  }

  /** True once a stop token or stop string ended the stream: the engine can stop. */
  get stopped(): boolean {
    return this.finished === "stop_token" || this.finished === "stop_string";
  }
}
