/**
 * Chat replies: the conversation is rendered with the model's chat template, tokenized, and
 * generated through the app's one engine (taking its turn in the engine queue, shared with the
 * OpenAI-compatible server) by the generation loop the CLI and the server use too
 * (core/generation: end-of-turn ids, the settings' stop strings); the text goes out as
 * `chat.delta` events, at
 * most ~30 a second, then one `chat.done` with the finished message and the same statistics
 * line the CLI prints. The message is saved when the reply ends, however it ends: the text so
 * far is kept on stop and on an engine crash.
 */
import { randomUUID } from "node:crypto";
import { formatStats, type GenerationStats } from "../chat/stats.ts";
import type { ChatTokenizer } from "../chat/tokenizer.ts";
import type { ChatMessage } from "../chat/template.ts";
import type { StatsEvent } from "../engine/index.ts";
import {
  generate,
  type GenerationFinishReason,
  type GenerationResult,
  type MemoryReading,
} from "../generation/generate.ts";
import { QueueAbortedError } from "../server/queue.ts";
import type {
  AppError,
  AppEvent,
  ContextNote,
  Conversation,
  Message,
  MessageStats,
  Settings,
} from "./api.ts";
import { fitPrompt, promptTextFor, type FitRequest, type PromptText } from "./context-fit.ts";
import { branchAt, type ConversationStore } from "./conversations.ts";
import type { EngineManager, LoadedModel } from "./engine.ts";
import { AppFailure, toAppError } from "./errors.ts";
import type { HitRateBook } from "./memory.ts";
import type { ReplyOutcome, ReplySource } from "./remote-reply.ts";

/** Deltas are sent at most this often (about 30 a second). */
export const DELTA_INTERVAL_MS = 33;
/** Periodic service statistics while generating (the live panel). */
const STATS_INTERVAL_MS = 500;

/** The running (or last) generation, for the live panel. */
export interface GenerationTracker {
  generating: boolean;
  startedAt: number;
  firstTokenAt: number | null;
  tokens: number;
  /** Of the last finished generation. */
  last: { decodeTokensPerSecond: number; ttftMs: number; tokens: number } | null;
  /** The service's latest stats event during the generation. */
  stats: StatsEvent | null;
}

/** A tracker before any generation. */
export function idleTracker(): GenerationTracker {
  return {
    generating: false,
    startedAt: 0,
    firstTokenAt: null,
    tokens: 0,
    last: null,
    stats: null,
  };
}

export interface ChatManagerOptions {
  engine: EngineManager;
  store: ConversationStore;
  settings: () => Settings;
  emit: (event: AppEvent) => void;
  /** The conversation list changed. */
  onConversations: () => void;
  hitRates: HitRateBook;
  now?: () => Date;
  /**
   * The reply source of the chosen model when it is not the local engine (a model on a
   * connection, remote-reply.ts), or null for the local engine.
   */
  replySource?: () => Promise<ReplySource | null>;
}

interface Reply {
  abort: AbortController;
  messageId: string;
  done: Promise<void>;
}

/** Collects text pieces and emits them at most every DELTA_INTERVAL_MS. */
class DeltaCoalescer {
  private buffer = "";
  private timer: NodeJS.Timeout | null = null;
  private last = 0;
  constructor(private readonly send: (text: string) => void) {}
  push(text: string): void {
    this.buffer += text;
    if (this.timer) return;
    const wait = Math.max(0, this.last + DELTA_INTERVAL_MS - Date.now());
    this.timer = setTimeout(() => this.flush(), wait);
  }
  flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.buffer === "") return;
    const text = this.buffer;
    this.buffer = "";
    this.last = Date.now();
    this.send(text);
  }
}

/** The memory figures of a stats reading (null: the engine gave none). */
function memoryReading(stats: StatsEvent | null): MemoryReading | null {
  return stats
    ? { peakMemoryBytes: stats.memory.peak_rss_bytes, cacheHitRate: stats.expert_cache.hit_rate }
    : null;
}

/** A message's finish reason for the generation loop's. */
const APP_FINISH_REASON: Record<GenerationFinishReason, Message["finishReason"]> = {
  stop_token: "eos",
  stop_string: "stop",
  length: "length",
  cancelled: "cancelled",
};

/** MessageStats: the CLI's statistics line and its figures. */
export function messageStats(s: GenerationStats): MessageStats {
  const decoded = Math.max(0, s.generatedTokens - 1);
  return {
    line: formatStats(s),
    decodeTokensPerSecond: s.decodeSeconds > 0 ? decoded / s.decodeSeconds : 0,
    ttftMs: s.ttftSeconds * 1000,
    prefillTokensPerSecond: s.ttftSeconds > 0 ? s.promptTokens / s.ttftSeconds : 0,
    promptTokens: s.promptTokens,
    generatedTokens: s.generatedTokens,
    peakRssBytes: s.peakMemoryBytes ?? null,
    hitRate: s.cacheHitRate ?? null,
  };
}

/**
 * Statistics of a reply written in several passes (continued after the context filled): the first
 * pass's prompt and time to first token; the later passes' prefill counts as writing time.
 */
function addStats(total: GenerationStats | null, pass: GenerationStats): GenerationStats {
  if (!total) return { ...pass };
  return {
    promptTokens: total.promptTokens,
    generatedTokens: total.generatedTokens + pass.generatedTokens,
    ttftSeconds: total.ttftSeconds,
    decodeSeconds: total.decodeSeconds + pass.ttftSeconds + pass.decodeSeconds,
    peakMemoryBytes:
      pass.peakMemoryBytes != null && total.peakMemoryBytes != null
        ? Math.max(pass.peakMemoryBytes, total.peakMemoryBytes)
        : (pass.peakMemoryBytes ?? total.peakMemoryBytes),
    cacheHitRate: pass.cacheHitRate ?? total.cacheHitRate,
  };
}

export class ChatManager {
  private readonly replies = new Map<string, Reply>();
  /** Token counts of message texts per tokenizer (context-fit's estimates). */
  private readonly textCounts = new WeakMap<ChatTokenizer, Map<string, number>>();
  readonly tracker: GenerationTracker = idleTracker();
  private readonly now: () => Date;

  constructor(private readonly opts: ChatManagerOptions) {
    this.now = opts.now ?? (() => new Date());
  }

  /** True while a reply in this conversation is being written. */
  replying(conversationId: string): boolean {
    return this.replies.has(conversationId);
  }

  private refuseWhileReplying(conversationId: string): void {
    if (this.replies.has(conversationId)) {
      throw new AppFailure(
        "busy",
        "A reply is still being written in this conversation. Wait for it, or stop it.",
        null,
      );
    }
  }

  /**
   * With no model loaded and none loading the turn could only fail: refuse it before anything is
   * stored (the app keeps what was typed). A crashed engine's turn is still kept, its reply
   * saying to restart.
   */
  private refuseWithoutModel(): void {
    const engine = this.opts.engine;
    if (engine.status().state === "stopped" && !engine.loadPending) engine.requireLoaded();
  }

  /** A remote model's reply source, or null for the local engine (which must have a model). */
  private async chooseSource(): Promise<ReplySource | null> {
    const remote = (await this.opts.replySource?.()) ?? null;
    if (!remote) this.refuseWithoutModel();
    return remote;
  }

  async send(conversationId: string, content: string): Promise<Conversation> {
    this.refuseWhileReplying(conversationId);
    const source = await this.chooseSource();
    const c = await this.opts.store.get(conversationId);
    c.messages.push({
      id: randomUUID(),
      role: "user",
      content,
      createdAt: this.now().toISOString(),
    });
    return this.begin(c, undefined, source);
  }

  /** Writes reply `messageId` (default: the last message) again, as a new branch. */
  async regenerate(conversationId: string, messageId?: string): Promise<Conversation> {
    this.refuseWhileReplying(conversationId);
    const source = await this.chooseSource();
    const c = await this.opts.store.get(conversationId);
    const i = messageId
      ? c.messages.findIndex((m) => m.id === messageId && m.role === "assistant")
      : c.messages.at(-1)?.role === "assistant"
        ? c.messages.length - 1
        : c.messages.length;
    if (i === -1) {
      throw new AppFailure(
        "message_not_found",
        "That reply is not in this conversation any more.",
        null,
      );
    }
    if (c.messages[i - 1]?.role !== "user") {
      throw new AppFailure("nothing_to_regenerate", "There is no message to reply to.", null);
    }
    return this.begin(c, i, source);
  }

  /** A user message with new text as a new branch (the old one and its replies kept), answered. */
  async edit(conversationId: string, messageId: string, content: string): Promise<Conversation> {
    this.refuseWhileReplying(conversationId);
    const source = await this.chooseSource();
    const c = await this.opts.store.get(conversationId);
    const i = c.messages.findIndex((m) => m.id === messageId);
    if (i === -1 || c.messages[i]!.role !== "user") {
      throw new AppFailure(
        "message_not_found",
        "That message cannot be edited: it is not one of your messages in this conversation.",
        null,
      );
    }
    const edited: Message = {
      id: randomUUID(),
      role: "user",
      content,
      createdAt: this.now().toISOString(),
    };
    c.messages = branchAt(c.messages, i, edited);
    return this.begin(c, undefined, source);
  }

  /** Stops the reply being written in a conversation (no-op when there is none). */
  async stop(conversationId: string): Promise<void> {
    const reply = this.replies.get(conversationId);
    if (!reply) return;
    reply.abort.abort();
    await reply.done;
  }

  async stopAll(): Promise<void> {
    await Promise.all([...this.replies.keys()].map((id) => this.stop(id)));
  }

  /**
   * Appends the empty assistant message (at `at`, a new branch there, when it replaces a reply),
   * saves, and starts the reply in the background.
   */
  private async begin(
    c: Conversation,
    at = c.messages.length,
    source: ReplySource | null = null,
  ): Promise<Conversation> {
    const engine = this.opts.engine;
    const fresh: Message = {
      id: randomUUID(),
      role: "assistant",
      content: "",
      createdAt: this.now().toISOString(),
      model: source?.label ?? engine.loaded?.name ?? engine.status().model ?? "demo",
    };
    c.messages = at < c.messages.length ? branchAt(c.messages, at, fresh) : [...c.messages, fresh];
    const reply = c.messages.at(-1)!;
    const saved = await this.opts.store.save(c);
    this.opts.onConversations();
    const abort = new AbortController();
    const entry: Reply = { abort, messageId: reply.id, done: Promise.resolve() };
    this.replies.set(c.id, entry);
    const running = source
      ? this.runElsewhere(source, c.id, reply.id, abort.signal)
      : this.run(c.id, reply.id, abort.signal);
    entry.done = running.finally(() => {
      if (this.replies.get(c.id) === entry) this.replies.delete(c.id);
    });
    return saved;
  }

  /** The conversation before the reply (the system prompt apart). */
  private history(c: Conversation, replyId: string): FitRequest["history"] {
    const out: { role: "user" | "assistant"; content: string }[] = [];
    for (const m of c.messages) {
      if (m.id === replyId) break;
      out.push({ role: m.role, content: m.content });
    }
    return out;
  }

  /** The model's template and tokenizer as context-fit counts with them. */
  private promptText(model: LoadedModel): PromptText {
    let textCounts = this.textCounts.get(model.tokenizer);
    if (!textCounts) {
      textCounts = new Map();
      this.textCounts.set(model.tokenizer, textCounts);
    }
    return promptTextFor(model.template, model.tokenizer, textCounts);
  }

  /**
   * Writes the reply. The prompt is what the model's "When the conversation is longer than the
   * context" setting leaves of the conversation (context-fit.ts); when the context fills during
   * the reply, the rolling and truncating policies leave out more and go on: the conversation is
   * rendered again with the reply so far opened as the model's turn, prefilled through the same
   * generation loop, and the new text streams into the same message, up to "Max new tokens".
   */
  private async run(conversationId: string, messageId: string, signal: AbortSignal): Promise<void> {
    const { engine, emit } = this.opts;
    const deltas = new DeltaCoalescer((text) =>
      emit({ type: "chat.delta", conversationId, messageId, text }),
    );
    let text = "";
    let finishReason: Message["finishReason"];
    let stats: MessageStats | undefined;
    let error: AppError | undefined;
    let contextNote: ContextNote | undefined;
    const tracker = this.tracker;
    // The engine's turn is held until the reply is saved and announced, so a request queued
    // behind this chat (the OpenAI server's) never answers before the chat's `chat.done`.
    let release: (() => void) | undefined;
    try {
      await engine.settled();
      release = await engine.queue.acquire(signal, { kind: "generate", unbounded: true });
      try {
        const { client, model } = engine.requireLoaded();
        const c = await this.opts.store.get(conversationId);
        const settings = this.opts.settings();
        const s = settings.sampling;
        const policy = settings.engine.contextOverflow;
        const context = model.settings.context;
        const history = this.history(c, messageId);
        const promptText = this.promptText(model);
        let generated = 0;
        let droppedExchanges = 0;
        let continued = 0;
        let total: GenerationStats | null = null;
        let generating = false;
        for (let pass = 0; ; pass++) {
          const remaining = s.maxNewTokens - generated;
          const fit = await fitPrompt(promptText, {
            policy,
            model: model.name,
            systemPrompt: c.systemPrompt,
            history,
            partial: text,
            context,
            maxContext: model.manifest.architecture.max_position_embeddings,
            // Room for an eighth of the context at most: more would leave out turns the reply
            // may never need, and a longer reply leaves out more when it gets there.
            replyRoom: Math.min(remaining, Math.max(1, Math.floor(context / 8))),
            minDropped: pass === 0 ? 0 : droppedExchanges + 1,
          });
          if (!fit) {
            finishReason = "context_full";
            break;
          }
          if (pass > 0) continued++;
          droppedExchanges = fit.droppedExchanges;
          if (fit.droppedMessages > 0) {
            contextNote = {
              policy,
              droppedMessages: fit.droppedMessages,
              droppedTokens: fit.droppedTokens,
              context,
              continued,
            };
          }
          const maxNewTokens = Math.min(remaining, context - fit.tokens.length);
          if (!generating) {
            generating = true;
            Object.assign(tracker, {
              generating: true,
              startedAt: Date.now(),
              firstTokenAt: null,
              tokens: 0,
              stats: null,
            });
          }
          const events = generate(
            client,
            model.tokenizer,
            {
              tokens: fit.tokens,
              maxNewTokens,
              sampling: s,
              stopIds: model.stopIds,
              stopStrings: s.stop,
              statsIntervalMs: STATS_INTERVAL_MS,
            },
            { signal, readMemory: async () => memoryReading(await engine.stats()) },
          );
          let result: GenerationResult | null = null;
          for await (const event of events) {
            if (event.type === "tokens") {
              tracker.firstTokenAt ??= Date.now();
              tracker.tokens += event.count;
            } else if (event.type === "text") {
              text += event.text;
              deltas.push(event.text);
            } else if (event.type === "stats") {
              tracker.stats = event.stats;
            } else result = event.result;
          }
          if (!result) throw new Error("the generation loop ended without a result");
          generated += result.tokens.length;
          if (result.stats && result.tokens.length > 0) total = addStats(total, result.stats);
          // "length" with less room than Max new tokens left: the context filled, not the limit.
          const contextFilled =
            result.finishReason === "length" &&
            maxNewTokens < remaining &&
            result.tokens.length >= maxNewTokens;
          if (contextFilled && policy !== "stop" && !signal.aborted) continue;
          finishReason = contextFilled ? "context_full" : APP_FINISH_REASON[result.finishReason];
          break;
        }
        if (contextNote) contextNote = { ...contextNote, continued };
        // The note under the reply names the context it filled.
        if (finishReason === "context_full") {
          contextNote ??= {
            policy,
            droppedMessages: 0,
            droppedTokens: 0,
            context,
            continued,
          };
        }
        // Stopped before the first token: no statistics ("0.0 t/s, 0 tokens" says nothing).
        if (total) {
          stats = messageStats(total);
          const slots = model.ready.expert_cache_slots;
          if (stats.hitRate !== null && slots > 0) {
            this.opts.hitRates.record(model.name, slots, stats.hitRate);
          }
          tracker.last = {
            decodeTokensPerSecond: stats.decodeTokensPerSecond,
            ttftMs: stats.ttftMs,
            tokens: stats.generatedTokens,
          };
        }
      } finally {
        tracker.generating = false;
      }
    } catch (e) {
      if (e instanceof QueueAbortedError || (signal.aborted && !(e instanceof AppFailure))) {
        finishReason = "cancelled";
      } else {
        finishReason = "error";
        error = toAppError(e);
      }
    }
    deltas.flush();
    try {
      await this.finish(conversationId, messageId, {
        text,
        finishReason,
        stats,
        error,
        contextNote,
      });
    } finally {
      release?.();
    }
  }

  /** A reply from another source than the local engine (a remote model): same events, same save. */
  private async runElsewhere(
    source: ReplySource,
    conversationId: string,
    messageId: string,
    signal: AbortSignal,
  ): Promise<void> {
    const deltas = new DeltaCoalescer((text) =>
      this.opts.emit({ type: "chat.delta", conversationId, messageId, text }),
    );
    let outcome: ReplyOutcome;
    try {
      const c = await this.opts.store.get(conversationId);
      // The whole conversation: the remote server applies its own context limit.
      const messages: ChatMessage[] = [
        ...(c.systemPrompt.trim() !== ""
          ? [{ role: "system" as const, content: c.systemPrompt }]
          : []),
        ...this.history(c, messageId),
      ];
      outcome = await source.reply(messages, signal, (text) => deltas.push(text));
    } catch (e) {
      outcome = signal.aborted
        ? { text: "", finishReason: "cancelled" }
        : { text: "", finishReason: "error", error: toAppError(e) };
    }
    deltas.flush();
    await this.finish(conversationId, messageId, outcome);
  }

  /** Saves the finished reply and announces it. */
  private async finish(
    conversationId: string,
    messageId: string,
    r: {
      text: string;
      finishReason: Message["finishReason"];
      stats?: MessageStats;
      error?: AppError;
      contextNote?: ContextNote;
    },
  ): Promise<void> {
    let c: Conversation;
    try {
      c = await this.opts.store.get(conversationId);
    } catch {
      return; // deleted meanwhile
    }
    const i = c.messages.findIndex((m) => m.id === messageId);
    if (i === -1) return;
    const message: Message = {
      ...c.messages[i]!,
      content: r.text,
      finishReason: r.finishReason,
      ...(r.stats ? { stats: r.stats } : {}),
      ...(r.error ? { error: r.error } : {}),
      ...(r.contextNote ? { contextNote: r.contextNote } : {}),
    };
    c.messages[i] = message;
    try {
      await this.opts.store.save(c);
    } catch (e) {
      // The reply is still shown; say why it was not kept.
      message.error ??= toAppError(e);
    }
    this.opts.emit({ type: "chat.done", conversationId, message });
    this.opts.onConversations();
  }
}
