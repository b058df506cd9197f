/**
 * One generation, text side and engine side together: prompt ids go to the backend, generated
 * ids come back and are turned into text pieces (incremental detokenization, stop strings),
 * which go to `onText` as they are ready. A stop string cancels the rest of the generation.
 */
import type { Backend, GenerateRequest } from "./backend.ts";
import type { GenerationStats } from "./stats.ts";
import { TextStream, type FinishReason } from "./text-stream.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

export interface GenerationResult {
  text: string;
  tokens: number[];
  finishReason: FinishReason | "cancelled";
  stats: GenerationStats | null;
}

export async function runGeneration(
  backend: Backend,
  tokenizer: ChatTokenizer,
  request: Omit<GenerateRequest, "signal">,
  options: { stopStrings: readonly string[]; onText: (text: string) => void; signal?: AbortSignal },
): Promise<GenerationResult> {
  const stream = new TextStream((ids) => tokenizer.decode(ids), {
    stopStrings: options.stopStrings,
    stopIds: request.stopTokenIds,
  });
  const abort = new AbortController();
  const onOuterAbort = (): void => abort.abort();
  options.signal?.addEventListener("abort", onOuterAbort, { once: true });
  const tokens: number[] = [];
  let text = "";
  let stats: GenerationStats | null = null;
  let cancelled = false;
  const emit = (piece: string): void => {
    if (piece) {
      text += piece;
      options.onText(piece);
    }
  };
  try {
    for await (const event of backend.generate({ ...request, signal: abort.signal })) {
      if (event.type === "tokens") {
        for (const id of event.tokens) {
          if (stream.stopped) break;
          tokens.push(id);
          emit(stream.push(id));
        }
        // A stop string or stop id ends the generation; the engine need not go on.
        if (stream.stopped && !abort.signal.aborted) abort.abort();
      } else {
        stats = event.stats;
        cancelled = event.reason === "cancelled" && !stream.stopped;
      }
    }
  } catch (error) {
    if (!(abort.signal.aborted && (stream.stopped || options.signal?.aborted))) throw error;
    cancelled = !stream.stopped;
  } finally {
    options.signal?.removeEventListener("abort", onOuterAbort);
  }
  emit(stream.end());
  return {
    text,
    tokens,
    finishReason: cancelled ? "cancelled" : (stream.finishReason ?? "length"),
    stats,
  };
}
