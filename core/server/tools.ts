/**
 * Tool calls for Gemma 4: the model writes
 *   <|tool_call>call:NAME{key:<|"|>text<|"|>,n:42,flag:true,list:[1,2],obj:{a:1}}<tool_call|>
 * (strings between `<|"|>` quotes, everything else bare), which becomes OpenAI's `tool_calls`.
 * Anything that starts a tool call but does not parse fails closed: an error, never a
 * half-understood call or the raw markup passed off as text.
 */
import { randomUUID } from "node:crypto";
import { ApiError } from "./errors.ts";
import type { FunctionTool, ToolChoice } from "./schemas.ts";

export const TOOL_CALL_OPEN = "<|tool_call>";
export const TOOL_CALL_CLOSE = "<tool_call|>";
const QUOTE = '<|"|>';
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
      this.skipSpace();
      const key = /^[A-Za-z_][A-Za-z0-9_.-]*/.exec(this.s.slice(this.pos));
      if (!key) this.fail("expected a key");
      this.pos += key[0].length;
      if (this.s[this.pos] !== ":") this.fail("expected :");
      this.pos++;
      if (Object.hasOwn(out, key[0])) this.fail(`duplicate key ${key[0]}`);
      out[key[0]] = this.value();
      this.skipSpace();
      const c = this.s[this.pos];
      this.pos++;
      if (c === "}") return out;
      if (c !== ",") this.fail("expected , or }");
    }
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
    if (this.s.startsWith(QUOTE, this.pos)) {
      const end = this.s.indexOf(QUOTE, this.pos + QUOTE.length);
      if (end === -1) this.fail("unterminated string");
      const text = this.s.slice(this.pos + QUOTE.length, end);
      this.pos = end + QUOTE.length;
      return text;
    }
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

  get atEnd(): boolean {
    this.skipSpace();
    return this.pos === this.s.length;
  }
}

/** Parses one call body `call:NAME{...}`; throws Malformed. */
function parseCall(body: string, index: number): OpenAiToolCall {
  const m = /^\s*call:([A-Za-z0-9_-]{1,64})/.exec(body);
  if (!m) throw new Malformed(`tool call ${index} does not start with call:NAME`);
  const reader = new ArgReader(body.slice(m[0].length));
  const args = reader.object();
  if (!reader.atEnd) throw new Malformed(`tool call ${index} has text after its arguments`);
  return {
    id: `call_${randomUUID().replaceAll("-", "").slice(0, 24)}`,
    type: "function",
    function: { name: m[1]!, arguments: JSON.stringify(args) },
  };
}

/**
 * The tool calls in a generated text, or null when it has none (plain text). Text with
 * malformed calls throws an ApiError (fail closed). `allowed` names the functions the request
 * declared: a call to any other is malformed too.
 */
export function parseToolCalls(text: string, allowed?: readonly string[]): ParsedToolCalls | null {
  const first = text.indexOf(TOOL_CALL_OPEN);
  if (first === -1) {
    if (text.includes(TOOL_CALL_CLOSE)) throw malformed("a tool call end without its start");
    return null;
  }
  const calls: OpenAiToolCall[] = [];
  let rest = text.slice(first);
  try {
    while (rest.startsWith(TOOL_CALL_OPEN)) {
      const end = rest.indexOf(TOOL_CALL_CLOSE);
      if (end === -1) throw new Malformed(`tool call ${calls.length} is not closed`);
      const call = parseCall(rest.slice(TOOL_CALL_OPEN.length, end), calls.length);
      if (allowed && !allowed.includes(call.function.name)) {
        throw new Malformed(`the model called an undeclared function "${call.function.name}"`);
      }
      calls.push(call);
      rest = rest.slice(end + TOOL_CALL_CLOSE.length).replace(/^\s+/, "");
    }
    // After the calls the model hands over to the tool (`<|tool_response>`, a stop token);
    // anything else is not something we can represent.
    if (rest.trim() !== "" && !rest.startsWith("<|tool_response>")) {
      throw new Malformed("text after the tool calls");
    }
  } catch (error) {
    if (error instanceof Malformed) throw malformed(error.message);
    throw error;
  }
  return { content: text.slice(0, first).trim(), calls };
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
