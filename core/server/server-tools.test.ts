/**
 * Tool requests end to end, on a variant of the demo model whose tokenizer has Gemma 4's
 * tool-call tokens at Gemma 4's ids (46-50, which are unused ids in Gemma 3's vocabulary; the
 * demo's stop ids [1, 106, 50] then include `<|tool_response>` as in Gemma 4) and whose chat
 * template is Google's current Gemma 4 template. Its
 * random weights never write a well-formed call, so a forced call must fail closed.
 */
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { gemma3TokenizerFiles } from "../models/gemma3.ts";
import { nativeBuildDir } from "../native.ts";
import { writeRandomModel } from "../../testkit/random-model.ts";
import { startServer, type RedwingServer } from "./server.ts";

const haveService = existsSync(join(nativeBuildDir(), "redwing-service"));

/** `<|tool>` 46, `<tool|>` 47, `<|tool_call>` 48, `<tool_call|>` 49, `<|tool_response>` 50. */
const GEMMA4_TOOL_TOKEN_FIRST_ID = 46;
const TOOL_TOKENS = ["<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>"];
/** Google's current Gemma 4 chat template (core/chat/testdata/README.md). */
const TEMPLATE = join(
  dirname(fileURLToPath(import.meta.url)),
  "..",
  "chat",
  "testdata",
  "gemma-4-31B-it.2026-07-09.jinja",
);

let home: string;
let server: RedwingServer;
let client: OpenAI;

const tools: OpenAI.ChatCompletionTool[] = [
  { type: "function", function: { name: "get_time", parameters: { type: "object" } } },
];
const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: "What time?" }];

describe.skipIf(!haveService)("tool requests", () => {
  beforeAll(async () => {
    home = await mkdtemp(join(tmpdir(), "redwing-server-tools-"));
    const files = gemma3TokenizerFiles();
    const tok = JSON.parse(await readFile(files.tokenizer, "utf8")) as {
      added_tokens: { id: number; content: string; special: boolean }[];
      model: { vocab: Record<string, number> };
    };
    TOOL_TOKENS.forEach((content, i) => {
      const entry = tok.added_tokens.find((t) => t.id === GEMMA4_TOOL_TOKEN_FIRST_ID + i)!;
      delete tok.model.vocab[entry.content];
      tok.model.vocab[content] = entry.id;
      entry.content = content;
      entry.special = true;
    });
    await writeFile(join(home, "tokenizer.json"), JSON.stringify(tok));
    const dir = join(home, "tools-demo");
    await writeRandomModel(dir, {
      seed: 7,
      postNormScale: 4,
      tokenizer: join(home, "tokenizer.json"),
      chatTemplate: TEMPLATE,
    });
    server = await startServer({ model: dir, port: 0, context: 256 });
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
  }, 120_000);

  afterAll(async () => {
    await server?.close();
    await rm(home, { recursive: true, force: true });
  });

  it("fails closed when a forced call is malformed", async () => {
    for (const choice of [
      "required",
      { type: "function", function: { name: "get_time" } },
    ] as const) {
      const error = await client.chat.completions
        .create({ model: "tools-demo", messages, tools, tool_choice: choice, max_tokens: 8 })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OpenAI.InternalServerError);
      expect((error as InstanceType<typeof OpenAI.APIError>).code).toBe("tool_call_parse_error");
    }
  });

  it("declares the tools in the prompt, and leaves them out for tool_choice none", async () => {
    const base = { model: "tools-demo", messages, max_tokens: 2, temperature: 0 };
    const none = await client.chat.completions.create({ ...base, tools, tool_choice: "none" });
    const auto = await client.chat.completions.create({ ...base, tools });
    const plain = await client.chat.completions.create(base);
    expect(none.usage!.prompt_tokens).toBe(plain.usage!.prompt_tokens);
    expect(auto.usage!.prompt_tokens).toBeGreaterThan(plain.usage!.prompt_tokens);
    expect(none.choices[0]!.finish_reason).not.toBe("tool_calls");
  });

  it("renders a tool-calling history (assistant tool_calls, tool results)", async () => {
    const r = await client.chat.completions.create({
      model: "tools-demo",
      max_tokens: 2,
      tools,
      tool_choice: "none",
      messages: [
        ...messages,
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: "call_1", type: "function", function: { name: "get_time", arguments: "{}" } },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: "12:00" },
      ],
    });
    expect(r.usage!.prompt_tokens).toBeGreaterThan(10);
  });

  it("renders union-typed parameters and tool results with the model's own template", async () => {
    const r = await client.chat.completions.create({
      model: "tools-demo",
      max_tokens: 2,
      tools: [
        {
          type: "function",
          function: {
            name: "get_time",
            parameters: {
              type: "object",
              properties: { zone: { type: ["string", "null"], description: "IANA zone" } },
            },
          },
        },
      ],

      messages: [
        ...messages,
        {
          role: "assistant",
          content: null,
          tool_calls: [
            {
              id: "c1",
              type: "function",
              function: { name: "get_time", arguments: '{"zone":null}' },
            },
          ],
        },
        { role: "tool", tool_call_id: "c1", content: "12:00" },
        { role: "assistant", content: "It is noon." },
        { role: "user", content: "And in Oslo?" },
      ],
    });
    // Declared (tool_choice auto): the template upper-cased the union type instead of failing.
    expect(r.choices).toHaveLength(1);
    expect(r.usage!.prompt_tokens).toBeGreaterThan(40);
  });

  it("refuses a tool result that answers no call", async () => {
    const error = await client.chat.completions
      .create({
        model: "tools-demo",
        messages: [...messages, { role: "tool", tool_call_id: "nope", content: "12:00" }],
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OpenAI.BadRequestError);
    expect((error as InstanceType<typeof OpenAI.APIError>).code).toBe("template_error");
  });

  it("refuses a named tool_choice that is not among the tools", async () => {
    const error = await client.chat.completions
      .create({
        model: "tools-demo",
        messages,
        tools,
        tool_choice: { type: "function", function: { name: "launch" } },
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OpenAI.BadRequestError);
  });
});
