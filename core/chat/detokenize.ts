/**
 * Incremental detokenization: turns a stream of token ids into a stream of text pieces whose
 * concatenation always equals decoding all ids at once.
 *
 * Two things make per-token decoding wrong: a character split over several `<0xXX>` byte-fallback
 * tokens decodes to U+FFFD until its last byte arrives, and a decoder may treat the first token
 * of a sequence differently from the same token in the middle (SentencePiece strips a leading
 * space). So each step decodes a short window that starts a little before the new tokens
 * (`prefix`), and emits only what the window's text gained beyond its already emitted part
 * (`read`), holding everything back while the text ends in an incomplete character.
 */

/** Decodes a list of token ids to text (e.g. `ChatTokenizer.decode`). */
export type DecodeFn = (ids: readonly number[]) => string;

const REPLACEMENT = "\uFFFD";

export class IncrementalDecoder {
  private readonly ids: number[] = [];
  /** Start of the decoding window: tokens before it are fully emitted and never decoded again. */
  private prefixOffset = 0;
  /** Tokens in [prefixOffset, readOffset) have been emitted as text. */
  private readOffset = 0;

  constructor(private readonly decode: DecodeFn) {}

  /** Adds one token and returns the text it completes ("" while a character is incomplete). */
  push(id: number): string {
    this.ids.push(id);
    const prefixText = this.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const fullText = this.decode(this.ids.slice(this.prefixOffset));
    if (fullText.length > prefixText.length && !fullText.endsWith(REPLACEMENT)) {
      // The window's text extends what was emitted: emit the rest and slide the window.
      const delta = fullText.startsWith(prefixText)
        ? fullText.slice(prefixText.length)
        : fullText.slice(commonPrefixLength(prefixText, fullText));
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
      return delta;
    }
    return "";
  }

  /** Text still held back at the end of the stream (an incomplete character decodes to U+FFFD). */
  flush(): string {
    const prefixText = this.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const fullText = this.decode(this.ids.slice(this.prefixOffset));
    this.prefixOffset = this.readOffset = this.ids.length;
    return fullText.length > prefixText.length ? fullText.slice(prefixText.length) : "";
  }

  /** All ids pushed so far. */
  get tokens(): readonly number[] {
    return this.ids;
  }
}

function commonPrefixLength(a: string, b: string): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}
