/**
 * What a model family module (gemma4.ts, gemma3.ts) tells the rest of Redwing, mirroring
 * native/src/models/: how its `config.json` becomes the normalized architecture, which tensors
 * that architecture needs, its fallback chat template and how messages are shaped for its
 * templates, and its tool-call syntax. Generic machinery (config normalization, the importer, the
 * manifest checker, the chat-template loader, `redwing prompt`) asks the registry in index.ts
 * instead of knowing a family; the server's tool code (core/server/tools.ts) still speaks Gemma 4's
 * syntax directly until its routes know the loaded model's family.
 */
import type { Architecture, TensorSpec } from "../format/manifest.ts";
import type { ConfigJson } from "./config-fields.ts";

/** The manifest's `architecture.family` values; index.ts maps each to its module. */
export const FAMILY_IDS = ["gemma4", "gemma3"] as const;
export type FamilyId = (typeof FAMILY_IDS)[number];

/** A checkpoint's configs as normalization reads them. */
export interface ConfigInput {
  /** config.json. */
  top: ConfigJson;
  /** Its `text_config` (multimodal wrappers keep the text model there), or null when flat. */
  text: ConfigJson | null;
  /** generation_config.json, or {} when the checkpoint has none. */
  generation: ConfigJson;
}

/** A message as chat templates read it (ChatMessage with tool-call arguments as objects). */
export type TemplateMessage = {
  role: string;
  content: string;
  tool_calls?: { id?: string; function: { name: string; arguments: unknown } }[];
  tool_call_id?: string;
  name?: string;
  /** Gemma 4: the results of this turn's calls, rendered inside the model turn. */
  tool_responses?: { name: string; response: string }[];
};

/** One call read from a model's output. */
export interface ModelToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

/** Output that starts a tool call but does not parse; the message says where. */
export class MalformedToolCall extends Error {}

export interface ToolParseOptions {
  /**
   * The generation ended on an end-of-turn or hand-over token, which the server does not pass on
   * as text: a call whose arguments are complete at the very end of the text is closed by it.
   */
  endedOnStopToken?: boolean;
}

/** How a family's models declare and call tools in text. */
export interface ToolSyntax {
  /** The token that opens a call; a vocabulary without it has no tool support. */
  readonly callOpen: string;
  /** What the family's templates write where they declare a tool (in the system turn). */
  readonly declarationOpen: string;
  /** Tokens besides the end-of-turn ids that end a tool-calling turn (the hand-over to the tool). */
  readonly handOverTokens: readonly string[];
  /** The start of the model's turn that forces a call, to `name` when given. */
  forcedCallPrefix(name?: string): string;
  /**
   * The calls in a generated text and the text around them, or null when there are none.
   * Throws MalformedToolCall on output that starts a call but does not parse, and on a call to a
   * function not in `allowed` (when given).
   */
  parse(
    text: string,
    allowed?: readonly string[],
    options?: ToolParseOptions,
  ): { content: string; calls: ModelToolCall[] } | null;
}

/** How a family's Hugging Face and MLX checkpoints name the tensors of its language model. */
export interface CheckpointNaming {
  /**
   * What stands before a resident tensor's name (docs/format.md "Names"), tried in order: the
   * first under which `embed_tokens.weight` exists is the checkpoint's.
   */
  readonly prefixes: readonly string[];
  /** Roots of the multimodal towers under the prefix, left out on import. */
  readonly multimodalRoots: readonly string[];
  /** Endings of the resident tensor names stored without the `.weight` suffix. */
  readonly bareSuffixes: readonly string[];
  /** Endings of the matrices quantized with 8 bits rather than 4 (as MLX converters do). */
  readonly eightBitSuffixes: readonly string[];
}

export interface ModelFamily {
  readonly id: FamilyId;
  /** For people: "Gemma 4". */
  readonly title: string;
  /** config.json `model_type` values of the family (multimodal wrapper and text model). */
  readonly modelTypes: readonly string[];
  /** The architecture of a config of this family (checked against the schema by the caller). */
  normalizeConfig(input: ConfigInput): Architecture;
  /** Every resident tensor the architecture needs, in the order the importer writes them. */
  expectedTensors(arch: Architecture): TensorSpec[];
  /** Where those tensors are in the family's checkpoints. */
  readonly checkpoint: CheckpointNaming;
  /** The chat template a model directory of this family gets when it ships none. */
  fallbackChatTemplate(): string;
  /**
   * Reshapes messages for `template` when it is one of the family's own (say, tool results
   * placed where the family's format puts them); null when the template is not the family's.
   */
  templateMessages(template: string, messages: TemplateMessage[]): TemplateMessage[] | null;
  /** How its models call tools, or null when the family has no tool format. */
  readonly tools: ToolSyntax | null;
}
