/**
 * Replies written by a model on a connection (an OpenAI-compatible endpoint) instead of the
 * local engine: ChatManager (chat.ts) asks its reply source, and this is the remote one. The
 * conversation goes as OpenAI messages; the text streams back into the same `chat.delta` /
 * `chat.done` events; the statistics are measured on this side (core/connections/client.ts)
 * in the local replies' line format; failures become AppErrors with their next step (a cut
 * reply keeps its text and offers Retry).
 */
import type { ChatMessage } from "../chat/template.ts";
import {
  remoteChatRequest,
  streamChat,
  type RemoteFinishReason,
  type RemoteTimeouts,
} from "../connections/client.ts";
import type { Endpoint } from "../connections/store.ts";
import type { AppError, Message, MessageStats, SamplingSettings } from "./api.ts";
import { toAppError } from "./errors.ts";

/** How a reply ended, ready to be saved on its message. */
export interface ReplyOutcome {
  text: string;
  finishReason: Message["finishReason"];
  stats?: MessageStats;
  error?: AppError;
}

/** Where a chat reply comes from when it is not the local engine. */
export interface ReplySource {
  /** The model as the message records it ("demo (GPU box)"). */
  readonly label: string;
  reply(
    messages: ChatMessage[],
    signal: AbortSignal,
    onText: (text: string) => void,
  ): Promise<ReplyOutcome>;
}

const FINISH: Record<RemoteFinishReason, Message["finishReason"]> = {
  stop: "eos",
  length: "length",
  cancelled: "cancelled",
  error: "error",
};

export function remoteReplySource(
  endpoint: Endpoint,
  connectionName: string,
  model: string,
  sampling: SamplingSettings,
  timeouts: RemoteTimeouts = {},
): ReplySource {
  return {
    label: `${model} (${connectionName})`,
    async reply(messages, signal, onText) {
      try {
        const r = await streamChat(
          endpoint,
          remoteChatRequest(model, messages, {
            temperature: sampling.temperature,
            topP: sampling.topP,
            maxTokens: sampling.maxNewTokens,
            stop: sampling.stop,
            seed: sampling.seed,
          }),
          { onText },
          { ...timeouts, signal },
        );
        const s = r.stats;
        const stats: MessageStats | undefined =
          s && r.line
            ? {
                line: r.line,
                decodeTokensPerSecond:
                  s.decodeSeconds > 0 ? Math.max(0, s.generatedTokens - 1) / s.decodeSeconds : 0,
                ttftMs: s.ttftSeconds * 1000,
                prefillTokensPerSecond:
                  r.promptTokensKnown && s.ttftSeconds > 0 ? s.promptTokens / s.ttftSeconds : 0,
                promptTokens: s.promptTokens,
                generatedTokens: s.generatedTokens,
                peakRssBytes: null,
                hitRate: null,
              }
            : undefined;
        return {
          text: r.text,
          finishReason: FINISH[r.finishReason],
          ...(stats ? { stats } : {}),
          ...(r.error ? { error: toAppError(r.error) } : {}),
        };
      } catch (error) {
        return signal.aborted
          ? { text: "", finishReason: "cancelled" }
          : { text: "", finishReason: "error", error: toAppError(error) };
      }
    },
  };
}
