/**
 * Tool calls for Gemma 4: the model writes
 *   <|tool_call>call:NAME{key:<|"|>text<|"|>,n:42,flag:true,list:[1,2],obj:{a:1}}<tool_call|>
 * (strings between `<|"|>` quotes, everything else bare), which becomes OpenAI's `tool_calls`.
 * What real models emit around that is accepted: a thought channel before the call (removed),
 * text after the calls (kept as content), a repeated `<tool_call|>`, `<turn|>` or the hand-over
 * to the tool in place of `<tool_call|>`, keys that are not ASCII identifiers (`2d`, `año`).
 * Anything that starts a tool call but does not parse fails closed: an error, never a
 * half-understood call or the raw markup passed off as text.
 */
import { randomUUID } from "node:crypto";
import { ApiError } from "./errors.ts";
import type { FunctionTool, ToolChoice } from "./schemas.ts";

export const TOOL_CALL_OPEN = "<|tool_call>";
export const TOOL_CALL_CLOSE = "<tool_call|>";
const QUOTE = '<|"|>';
const TURN_END = "<turn|>";
const TOOL_RESPONSE_OPEN = "<|tool_response>";
const CHANNEL_OPEN = "<|channel>";
const CHANNEL_CLOSE = "<channel|>";
/** An unquoted key: anything up to the `:` that is not structure or markup. */
const BARE_KEY = /^[^\s:,{}[\]<>]+/u;
/** How Gemma 4's template opens a tool declaration in the system turn. */
export const TOOL_DECLARATION_OPEN = "<|tool>";

export interface OpenAiToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface ParsedToolCalls {
  /** Text before the first call (often empty). */
  content: string;
  calls: OpenAiToolCall[];
}

class Malformed extends Error {}

/** A recursive-descent reader of Gemma 4's argument syntax. */
class ArgReader {
  pos = 0;
  constructor(private readonly s: string) {}

  private fail(what: string): never {
    throw new Malformed(`${what} at offset ${this.pos} of ${JSON.stringify(this.s.slice(0, 200))}`);
  }

  private skipSpace(): void {
    while (this.pos < this.s.length && /\s/.test(this.s[this.pos]!)) this.pos++;
  }

  object(): Record<string, unknown> {
    if (this.s[this.pos] !== "{") this.fail("expected {");
    this.pos++;
    const out: Record<string, unknown> = {};
    this.skipSpace();
    if (this.s[this.pos] === "}") {
      this.pos++;
      return out;
    }
    for (;;) {
      const key = this.key();
      if (this.s[this.pos] !== ":") this.fail("expected :");
      this.pos++;
      if (Object.hasOwn(out, key)) this.fail(`duplicate key ${key}`);
      out[key] = this.value();
      this.skipSpace();
      const c = this.s[this.pos];
      this.pos++;
      if (c === "}") return out;
      if (c !== ",") this.fail("expected , or }");
    }
  }

  /** `name` or `<|"|>name<|"|>` (the quoted form Gemma's template uses inside declarations). */
  private key(): string {
    this.skipSpace();
    if (this.s.startsWith(QUOTE, this.pos)) return this.string();
    const key = BARE_KEY.exec(this.s.slice(this.pos));
    if (!key) this.fail("expected a key");
    this.pos += key[0].length;
    return key[0];
  }

  private string(): string {
    const end = this.s.indexOf(QUOTE, this.pos + QUOTE.length);
    if (end === -1) this.fail("unterminated string");
    const text = this.s.slice(this.pos + QUOTE.length, end);
    this.pos = end + QUOTE.length;
    return text;
  }

  private array(): unknown[] {
    this.pos++; // [
    const out: unknown[] = [];
    this.skipSpace();
    if (this.s[this.pos] === "]") {
      this.pos++;
      return out;
    }
    for (;;) {
      out.push(this.value());
      this.skipSpace();
      const c = this.s[this.pos];
      this.pos++;
      if (c === "]") return out;
      if (c !== ",") this.fail("expected , or ]");
    }
  }

  value(): unknown {
    this.skipSpace();
    if (this.s.startsWith(QUOTE, this.pos)) return this.string();
    const c = this.s[this.pos];
    if (c === "{") return this.object();
    if (c === "[") return this.array();
    const m = /^(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)(?=[\s,}\]])/.exec(
      this.s.slice(this.pos),
    );
    if (!m) this.fail("expected a value");
    this.pos += m[0].length;
    return JSON.parse(m[0]) as unknown;
  }

  /** Skips whitespace; true when `token` follows (and steps over it). */
  take(token: string): boolean {
    const start = this.pos;
    this.skipSpace();
    if (this.s.startsWith(token, this.pos)) {
      this.pos += token.length;
      return true;
    }
    this.pos = start;
    return false;
  }

  get atEnd(): boolean {
    this.skipSpace();
    return this.pos === this.s.length;
  }
}

export interface ToolCallParseOptions {
  /**
   * The generation ended on an end-of-turn or hand-over token, which the server does not pass on
   * as text: a call whose arguments are complete at the very end of the text is closed by it.
   */
  endedOnStopToken?: boolean;
}

/** Reads `call:NAME{...}` and what closes it at `reader.pos`; throws Malformed. */
function readCall(
  reader: ArgReader,
  text: string,
  index: number,
  endedOnStop: boolean,
): OpenAiToolCall {
  const m = /^\s*call:([A-Za-z0-9_-]{1,64})/.exec(text.slice(reader.pos));
  if (!m) throw new Malformed(`tool call ${index} does not start with call:NAME`);
  reader.pos += m[0].length;
  const args = reader.object();
  if (reader.take(TOOL_CALL_CLOSE)) {
    while (reader.take(TOOL_CALL_CLOSE)); // a repeated close is harmless
    // `<turn|>` or `<|tool_response>` in place of the close ends the output (left for the caller).
  } else if (reader.atEnd ? !endedOnStop : !endsOutput(text, reader.pos)) {
    throw new Malformed(
      reader.atEnd
        ? `tool call ${index} is not closed`
        : `tool call ${index} has text after its arguments`,
    );
  }
  return {
    id: `call_${randomUUID().replaceAll("-", "").slice(0, 24)}`,
    type: "function",
    function: { name: m[1]!, arguments: JSON.stringify(args) },
  };
}

/** True when the model's output ends at `pos`: the end of its turn or the hand-over to the tool. */
function endsOutput(text: string, pos: number): boolean {
  return text.startsWith(TURN_END, pos) || text.startsWith(TOOL_RESPONSE_OPEN, pos);
}

/** The text without its closed thought channels (`<|channel>...<channel|>`). */
function withoutThoughts(text: string): string {
  let out = "";
  let pos = 0;
  for (;;) {
    const open = text.indexOf(CHANNEL_OPEN, pos);
    const close = open === -1 ? -1 : text.indexOf(CHANNEL_CLOSE, open);
    if (close === -1) return out + text.slice(pos);
    out += text.slice(pos, open);
    pos = close + CHANNEL_CLOSE.length;
  }
}

/**
 * The tool calls in a generated text, or null when it has none (plain text). Text with
 * malformed calls throws an ApiError (fail closed). `allowed` names the functions the request
 * declared: a call to any other is malformed too. Thought channels are removed; text before,
 * between and after the calls is the content; the output ends at `<turn|>` or at the hand-over
 * to the tool (`<|tool_response>`).
 */
export function parseToolCalls(
  text: string,
  allowed?: readonly string[],
  options: ToolCallParseOptions = {},
): ParsedToolCalls | null {
  const visible = withoutThoughts(text);
  if (!visible.includes(TOOL_CALL_OPEN)) {
    if (visible.includes(TOOL_CALL_CLOSE)) throw malformed("a tool call end without its start");
    return null;
  }
  const calls: OpenAiToolCall[] = [];
  let content = "";
  const reader = new ArgReader(visible);
  try {
    for (;;) {
      const next = visible.indexOf(TOOL_CALL_OPEN, reader.pos);
      const segment = visible.slice(reader.pos, next === -1 ? undefined : next);
      const handOver = [TOOL_RESPONSE_OPEN, TURN_END]
        .map((token) => segment.indexOf(token))
        .filter((at) => at !== -1);
      const end = handOver.length > 0 ? Math.min(...handOver) : -1;
      const said = end === -1 ? segment : segment.slice(0, end);
      if (said.includes(TOOL_CALL_CLOSE)) throw new Malformed("a tool call end without its start");
      if (said.includes(CHANNEL_OPEN) || said.includes(CHANNEL_CLOSE)) {
        throw new Malformed("an unclosed thought channel");
      }
      content += said;
      if (next === -1 || end !== -1) break;
      reader.pos = next + TOOL_CALL_OPEN.length;
      const call = readCall(reader, visible, calls.length, options.endedOnStopToken ?? false);
      if (allowed && !allowed.includes(call.function.name)) {
        throw new Malformed(`the model called an undeclared function "${call.function.name}"`);
      }
      calls.push(call);
    }
  } catch (error) {
    if (error instanceof Malformed) throw malformed(error.message);
    throw error;
  }
  return { content: content.trim(), calls };
}

function malformed(detail: string): ApiError {
  return new ApiError(
    500,
    `the model produced a malformed tool call (${detail})`,
    "server_error",
    "tool_call_parse_error",
  );
}

/**
 * The generation prompt for a tool request. The template has already declared the tools (Gemma
 * 4's template does); `required` and a named choice are enforced by starting the model's turn
 * with the call opener (and the name), which `toolOutputPrefix` gives back for parsing.
 */
export function renderToolPrompt(
  prompt: string,
  tools: readonly FunctionTool[],
  choice: ToolChoice | undefined,
): string {
  // A template without tool support renders the chat without them: the model would never
  // know of the tools, so refuse instead of answering as if they had been offered.
  const missing = tools.filter((t) => !prompt.includes(t.function.name));
  if (!prompt.includes(TOOL_DECLARATION_OPEN) || missing.length > 0) {
    throw new ApiError(
      400,
      "the model's chat template does not declare tools (it has no tool support); use a model whose template does",
      "invalid_request_error",
      "tools_unsupported",
      "tools",
    );
  }
  return prompt + toolOutputPrefix(choice);
}

/** What the prompt ends with for `choice`, which the model's output continues. */
export function toolOutputPrefix(choice: ToolChoice | undefined): string {
  if (choice === "required") return `${TOOL_CALL_OPEN}call:`;
  if (choice && typeof choice === "object") return `${TOOL_CALL_OPEN}call:${choice.function.name}`;
  return "";
}
