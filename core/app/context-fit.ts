/**
 * What a chat reply sends when the conversation is longer than the context: the model's setting
 * "When the conversation is longer than the context" (`engine.contextOverflow`), as LM Studio
 * offers it.
 *
 * - `stop`: the whole conversation or nothing; a prompt that does not fit is refused with its
 *   numbers and the fix (a larger context when the model allows one, else a new chat).
 * - `rolling_window`: the oldest exchanges (a user message and the replies to it) are left out,
 *   the system prompt always kept, until the prompt plus room for the reply fits.
 * - `truncate_middle`: the system prompt and the first exchange are kept; exchanges after it are
 *   left out, oldest first; the first exchange goes only when nothing else is left.
 *
 * Whole exchanges are left out, never single messages, so the turns still alternate (Gemma 3's
 * template refuses a conversation whose roles do not). The message being answered always stays.
 *
 * Counting is exact where it decides: every candidate prompt is rendered with the model's template
 * and tokenized as it would be sent (`PromptText.encode`, off the event loop for long texts).
 * Estimates from each message's own token count only pick which candidate to tokenize first, so
 * a long conversation costs one or two tokenizations of a context-sized prompt, not one per
 * exchange. Texts longer than the context can hold in characters (ChatTokenizer.maxCharsFor) are
 * never tokenized at all.
 */
import { ChatTemplate, type ChatMessage } from "../chat/template.ts";
import type { ChatTokenizer } from "../chat/tokenizer.ts";
import type { ContextOverflowPolicy } from "./api.ts";
import { AppFailure } from "./errors.ts";

/** The model's side of the counting: its template and tokenizer. */
export interface PromptText {
  /** The prompt for `messages` (the system message first when there is one), the reply's turn opened. */
  render(messages: readonly ChatMessage[]): string;
  /** Token ids of a text; `addBos` for a whole prompt (as sent). */
  encode(text: string, addBos: boolean): Promise<number[]>;
  /** The most characters a text of `tokens` tokens can have (ChatTokenizer.maxCharsFor). */
  maxCharsFor(tokens: number): number;
  /**
   * Token counts of message texts already seen with this tokenizer, kept across replies by the
   * caller (a message's text rarely changes); filled here.
   */
  textCounts?: Map<string, number>;
}

/** A model's template (Jinja source) and tokenizer as PromptText. */
export function promptTextFor(
  templateSource: string,
  tokenizer: ChatTokenizer,
  textCounts?: Map<string, number>,
): PromptText {
  const template = new ChatTemplate(templateSource);
  return {
    render: (messages) =>
      template.render(messages, { bosToken: tokenizer.bosToken, eosToken: tokenizer.eosToken }),
    // Off the event loop beyond a few thousand characters (ChatTokenizer.encodeAsync).
    encode: (text, addBos) => tokenizer.encodeAsync(text, { addBos }),
    maxCharsFor: (tokens) => tokenizer.maxCharsFor(tokens),
    ...(textCounts ? { textCounts } : {}),
  };
}

export interface FitRequest {
  policy: ContextOverflowPolicy;
  /** The model's name (the fix loads it again with a larger context). */
  model: string;
  systemPrompt: string;
  /** The conversation up to the message being answered (the last one, a user message). */
  history: readonly { role: "user" | "assistant"; content: string }[];
  /** The reply written so far (a continuation after the context filled); "" at first. */
  partial: string;
  /** The loaded context length, in tokens. */
  context: number;
  /** The model's maximum context (its `max_position_embeddings`). */
  maxContext: number;
  /** Tokens the reply should have room for: left out messages make this room, and the fix too. */
  replyRoom: number;
  /** A continuation leaves out at least this many exchanges (one more than the pass before). */
  minDropped?: number;
}

export interface FitResult {
  /** The prompt's ids, as sent. */
  tokens: number[];
  /** Exchanges left out (continuations pass this + 1 as `minDropped`). */
  droppedExchanges: number;
  /** Messages left out. */
  droppedMessages: number;
  /** Tokens of the left-out messages' text; null when one was too long to count. */
  droppedTokens: number | null;
}

/** A user message and the replies after it. */
type Exchange = { role: "user" | "assistant"; content: string }[];

function exchangesOf(history: FitRequest["history"]): Exchange[] {
  const out: Exchange[] = [];
  for (const m of history) {
    if (m.role === "user" || out.length === 0) out.push([m]);
    else out.at(-1)!.push(m);
  }
  return out;
}

/** The order exchanges are left out in (indices into the exchanges); never the last one. */
function dropOrder(policy: ContextOverflowPolicy, count: number): number[] {
  const droppable = Array.from({ length: Math.max(0, count - 1) }, (_, i) => i);
  if (policy === "stop") return [];
  if (policy === "rolling_window") return droppable;
  // truncate_middle: the first exchange last.
  return droppable.length > 0 ? [...droppable.slice(1), 0] : [];
}

/** Context lengths the Tuning field takes are multiples of 256. */
const CONTEXT_STEP = 256;

function n(value: number): string {
  return value.toLocaleString("en-US");
}

/** Texts whose counts are kept at most (then the map starts again). */
const TEXT_COUNTS_LIMIT = 4096;

async function countText(text: PromptText, content: string, bound: number): Promise<number> {
  if (content.length > bound) return Infinity;
  const textTokens = text.textCounts ?? new Map<string, number>();
  const known = textTokens.get(content);
  if (known !== undefined) return known;
  const count = (await text.encode(content, false)).length;
  if (textTokens.size >= TEXT_COUNTS_LIMIT) textTokens.clear();
  textTokens.set(content, count);
  return count;
}

/**
 * The prompt to send under the request's policy. Throws an AppFailure (`context_overflow`, with
 * the numbers and the fix) when no choice fits; answers null for a continuation that cannot
 * leave out anything more (the reply then ends: the context is full).
 */
export async function fitPrompt(text: PromptText, req: FitRequest): Promise<FitResult | null> {
  const { context, partial } = req;
  const exchanges = exchangesOf(req.history);
  const order = dropOrder(req.policy, exchanges.length);
  const minDropped = req.minDropped ?? 0;
  if (minDropped > order.length) return null;
  // Under `stop` the reply gets whatever room is left; the others make room for it first.
  const reserve = req.policy === "stop" ? 1 : Math.max(1, req.replyRoom);
  const system: ChatMessage[] =
    req.systemPrompt.trim() === "" ? [] : [{ role: "system", content: req.systemPrompt }];

  const keptAfter = (k: number): Exchange[] => {
    const out = new Set(order.slice(0, k));
    return exchanges.filter((_, i) => !out.has(i));
  };
  const promptFor = (k: number): string =>
    text.render([...system, ...keptAfter(k).flat()]) + partial;
  const exact = new Map<number, number[] | null>();
  // null: too many characters to fit the context, not tokenized.
  const tokensFor = async (k: number): Promise<number[] | null> => {
    if (!exact.has(k)) {
      const prompt = promptFor(k);
      exact.set(
        k,
        prompt.length > text.maxCharsFor(context) ? null : await text.encode(prompt, true),
      );
    }
    return exact.get(k)!;
  };
  const fits = (ids: number[] | null, room: number): ids is number[] =>
    ids !== null && ids.length + room <= context;

  // Estimates: each message's own tokens plus the template's tokens around a message.
  let k = minDropped;
  if (order.length > minDropped) {
    const bound = text.maxCharsFor(context);
    const costs = await Promise.all(
      exchanges.map(async (e) => {
        let sum = 0;
        for (const m of e) sum += (await countText(text, m.content, bound)) + PER_MESSAGE_ESTIMATE;
        return sum;
      }),
    );
    const fixed =
      (await countText(text, req.systemPrompt, bound)) +
      (await countText(text, partial, bound)) +
      PER_MESSAGE_ESTIMATE;
    // Kept apart: Infinity - Infinity is no number.
    let finite = 0;
    let uncountable = Number.isFinite(fixed) ? 0 : 1;
    const add = (c: number, sign: 1 | -1): void => {
      if (Number.isFinite(c)) finite += sign * c;
      else uncountable += sign;
    };
    if (Number.isFinite(fixed)) finite += fixed;
    for (const c of costs) add(c, 1);
    for (let i = 0; i < minDropped; i++) add(costs[order[i]!]!, -1);
    while (k < order.length && (uncountable > 0 || finite + reserve > context)) {
      add(costs[order[k]!]!, -1);
      k++;
    }
  }
  // Exact: the fewest exchanges left out whose prompt, as tokenized, leaves the room.
  if (fits(await tokensFor(k), reserve)) {
    while (k > minDropped && fits(await tokensFor(k - 1), reserve)) k--;
  } else {
    while (k < order.length && !fits(await tokensFor(k), reserve)) k++;
  }
  let ids = await tokensFor(k);
  if (!fits(ids, reserve)) {
    // Nothing more to leave out: a prompt with any room at all still goes (the reply may then
    // fill the context and stop, or leave out more and go on).
    if (!fits(ids, 1)) {
      if (partial !== "") return null;
      throw await overflow(text, req, ids, promptFor(k), exchanges.length, system);
    }
  }
  ids = ids as number[];
  const dropped = order.slice(0, k).flatMap((i) => exchanges[i]!);
  let droppedTokens: number | null = 0;
  const bound = text.maxCharsFor(context);
  for (const m of dropped) {
    const c = await countText(text, m.content, bound);
    droppedTokens = Number.isFinite(c) && droppedTokens !== null ? droppedTokens + c : null;
  }
  return { tokens: ids, droppedExchanges: k, droppedMessages: dropped.length, droppedTokens };
}

/** Template tokens around one message (Gemma's turn markers and role: about 4); a guess only. */
const PER_MESSAGE_ESTIMATE = 4;

/** The refusal, with its numbers and the fix. */
async function overflow(
  text: PromptText,
  req: FitRequest,
  ids: number[] | null,
  prompt: string,
  exchangeCount: number,
  system: ChatMessage[],
): Promise<AppFailure> {
  const { context, maxContext, model } = req;
  const whole = req.policy === "stop" && exchangeCount > 1;
  const what = whole ? "This conversation" : "Your message";
  const maxNote =
    maxContext > context
      ? ` (this model supports up to ${n(maxContext)})`
      : " (this model's maximum)";
  if (ids === null && prompt.length > text.maxCharsFor(maxContext)) {
    // Not tokenized: no context this model supports could hold it.
    const chars = whole ? prompt.length : (req.history.at(-1)?.content.length ?? prompt.length);
    return new AppFailure(
      "context_overflow",
      `${what} (${n(chars)} characters) is far longer than the ${n(context)}-token context can hold${maxNote}. ${whole ? "Start a new chat." : "Shorten it."}`,
      whole ? "new_chat" : null,
    );
  }
  const tokens = ids ?? (await text.encode(prompt, true));
  const needed = Math.min(
    maxContext,
    Math.ceil((tokens.length + Math.max(1, req.replyRoom)) / CONTEXT_STEP) * CONTEXT_STEP,
  );
  const raise = tokens.length < maxContext && needed > context ? needed : null;
  // Which part is too long: the conversation, the system prompt, or the message itself.
  let subject = `${what} is ${n(tokens.length)} tokens`;
  let shorten = whole ? "start a new chat" : "shorten it";
  if (!whole && system.length > 0) {
    const alone = (await text.encode(text.render(system), true)).length;
    if (alone >= context) {
      subject = `The system prompt alone is ${n(alone)} tokens`;
      shorten = "shorten it (Chat, System prompt)";
    } else subject = `Your message with the system prompt is ${n(tokens.length)} tokens`;
  }
  const head = `${subject}, more than the ${n(context)}-token context holds${maxNote}.`;
  if (raise !== null) {
    return new AppFailure(
      "context_overflow",
      `${head} Raise the context to ${n(raise)}, or ${shorten}.`,
      "apply_fix",
      undefined,
      { label: `Raise context to ${n(raise)}`, model, engine: { context: raise } },
    );
  }
  return new AppFailure(
    "context_overflow",
    `${head} ${shorten[0]!.toUpperCase()}${shorten.slice(1)}.`,
    whole ? "new_chat" : null,
  );
}
