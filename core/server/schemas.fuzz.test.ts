/**
 * Property-based fuzzing of the OpenAI request schemas as the server applies them (parseBody):
 * any JSON body gives the parsed request or an ApiError 400 naming the problem, never another
 * exception; a valid request parses to itself. Runs: testkit/fuzz.ts (FUZZ_RUNS for a long run).
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { corpus, fuzz } from "../../testkit/fuzz.ts";
import { ApiError } from "./errors.ts";
import { ChatRequestSchema, CompletionRequestSchema } from "./schemas.ts";
import { parseBody } from "./server.ts";

const text = fc.string({ maxLength: 40 });
const content = fc.oneof(
  text,
  fc.array(fc.record({ type: fc.constant("text" as const), text }), { maxLength: 3 }),
);
const message = fc.oneof(
  fc.record({ role: fc.constantFrom("system", "developer", "user"), content }),
  fc.record(
    { role: fc.constant("assistant"), content: fc.option(content, { nil: null }) },
    { requiredKeys: ["role"] },
  ),
  fc.record({ role: fc.constant("tool"), content, tool_call_id: text }),
);
const sampling = {
  model: fc.string({ minLength: 1, maxLength: 20 }),
  temperature: fc.option(fc.double({ min: 0, max: 2, noNaN: true }), { nil: null }),
  top_p: fc.option(fc.double({ min: 0, max: 1, noNaN: true }), { nil: null }),
  top_k: fc.option(fc.nat(), { nil: null }),
  repetition_penalty: fc.double({ min: Number.MIN_VALUE, max: 10, noNaN: true }),
  seed: fc.nat(),
  stop: fc.oneof(text, fc.array(text, { maxLength: 4 })),
  max_tokens: fc.integer({ min: 1, max: 1 << 30 }),
  stream: fc.boolean(),
  stream_options: fc.record({ include_usage: fc.boolean() }),
  ignore_eos: fc.boolean(),
  user: text,
};
const validChat = fc.record(
  {
    ...sampling,
    messages: fc.array(message, { minLength: 1, maxLength: 4 }),
    max_completion_tokens: fc.integer({ min: 1, max: 1 << 30 }),
    tool_choice: fc.constantFrom("auto", "none", "required"),
  },
  { requiredKeys: ["model", "messages"] },
);
const validCompletion = fc.record(
  { ...sampling, prompt: fc.oneof(text, fc.tuple(text)) },
  { requiredKeys: ["model", "prompt"] },
);

/** A valid request with one field (maybe a new one) replaced by any JSON value. */
function mutated<T extends object>(valid: fc.Arbitrary<T>): fc.Arbitrary<unknown> {
  return fc
    .tuple(
      valid,
      fc.oneof(fc.constantFrom(...Object.keys(sampling), "messages", "prompt"), fc.string()),
      fc.jsonValue(),
    )
    .map(([body, key, value]) => ({ ...body, [key]: value }));
}

/** parseBody's contract: the data, or an ApiError 400 with a message. */
function checkParse(schema: typeof ChatRequestSchema | typeof CompletionRequestSchema) {
  return (body: unknown): void => {
    try {
      parseBody(schema as never, body);
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 400) throw error;
      expect(error.type).toBe("invalid_request_error");
      expect(error.message).toMatch(/^(invalid request: |the request body must be)/);
    }
  };
}

const anyBody = (valid: fc.Arbitrary<object>) =>
  fc.oneof(fc.jsonValue(), mutated(valid), fc.object(), valid);

describe("OpenAI request schemas (fuzz)", () => {
  it("any chat body: parsed, or a 400 naming the problem", async () => {
    await fuzz("openai chat body", anyBody(validChat), checkParse(ChatRequestSchema), {
      runs: 3000,
      examples: corpus("openai-request"),
    });
  });

  it("any completion body: parsed, or a 400 naming the problem", async () => {
    await fuzz(
      "openai completion body",
      anyBody(validCompletion),
      checkParse(CompletionRequestSchema),
      { runs: 3000, examples: corpus("openai-request") },
    );
  });

  it("valid requests parse to themselves", async () => {
    await fuzz(
      "openai valid round-trip",
      fc.oneof(
        validChat.map((b) => ({ schema: ChatRequestSchema as never, body: b as object })),
        validCompletion.map((b) => ({ schema: CompletionRequestSchema as never, body: b })),
      ),
      ({ schema, body }) => {
        expect(parseBody(schema, JSON.parse(JSON.stringify(body)))).toEqual(body);
      },
      { runs: 1000 },
    );
  });
});
