import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { gemma3FallbackTemplate } from "../models/gemma3.ts";
import { gemma4FallbackTemplate } from "../models/gemma4.ts";
import {
  ChatTemplate,
  loadChatTemplate,
  parseMessages,
  renderChat,
  type ChatMessage,
} from "./template.ts";

const CHAT: ChatMessage[] = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Hi" },
  { role: "assistant", content: "Hello!" },
  { role: "user", content: " Again \n" },
];

describe("Gemma 4 chat template (gemma-arch.md section 6)", () => {
  const t = gemma4FallbackTemplate();

  it("renders system, user and model turns and the generation prompt with an empty thought channel", () => {
    expect(renderChat(t, CHAT, { bosToken: "<bos>" })).toBe(
      "<bos><|turn>system\nYou are terse.<turn|>\n<|turn>user\nHi<turn|>\n" +
        "<|turn>model\nHello!<turn|>\n<|turn>user\nAgain<turn|>\n" +
        "<|turn>model\n<|channel>thought\n<channel|>",
    );
  });

  it("puts <|think|> in the system turn when thinking is on, with a bare generation prompt", () => {
    expect(renderChat(t, CHAT.slice(1, 2), { bosToken: "<bos>", enableThinking: true })).toBe(
      "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n",
    );
    expect(renderChat(t, CHAT.slice(0, 2), { bosToken: "<bos>", enableThinking: true })).toBe(
      "<bos><|turn>system\n<|think|>\nYou are terse.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n",
    );
  });

  it("strips thinking from past model turns and omits the prompt when asked", () => {
    const chat: ChatMessage[] = [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "<|channel>thought\nadd them<channel|>4" },
    ];
    expect(renderChat(t, chat, { bosToken: "<bos>", addGenerationPrompt: false })).toBe(
      "<bos><|turn>user\n2+2?<turn|>\n<|turn>model\n4<turn|>\n",
    );
  });
});

/** testdata/gemma4-vectors.json: chats and what Google's template renders for them (README there). */
const TESTDATA = join(dirname(fileURLToPath(import.meta.url)), "testdata");
const VECTORS = JSON.parse(readFileSync(join(TESTDATA, "gemma4-vectors.json"), "utf8")) as {
  template: string;
  bos_token: string;
  vectors: {
    name: string;
    messages: ChatMessage[];
    tools?: unknown[];
    enable_thinking: boolean;
    add_generation_prompt: boolean;
    expected: string;
  }[];
};
const OFFICIAL = readFileSync(join(TESTDATA, VECTORS.template), "utf8");

describe("Gemma 4 test vectors (Google's 2026-07-09 template for 26B-A4B and 31B)", () => {
  const templates = [
    ["Redwing's fallback template", gemma4FallbackTemplate()],
    ["Google's template text", OFFICIAL],
  ] as const;
  const cases = VECTORS.vectors.flatMap((v) =>
    templates.map(([which, text]) => [which, v.name, text, v] as const),
  );

  it.each(cases)("%s renders %s byte for byte", (_which, _name, text, v) => {
    const rendered = new ChatTemplate(text).render(v.messages, {
      bosToken: VECTORS.bos_token,
      enableThinking: v.enable_thinking,
      addGenerationPrompt: v.add_generation_prompt,
      tools: v.tools,
    });
    expect(rendered).toBe(v.expected);
  });

  it("uses Google's file byte for byte (sha256 of the HF chat_template.jinja)", () => {
    expect(createHash("sha256").update(OFFICIAL).digest("hex")).toBe(
      "ae53464bf3be25802b3a5b37def7fd89667067d7577049b3b2d74c4d8de4c6d4",
    );
  });

  it("covers every point of the format (the vectors are not trivially alike)", () => {
    const all = VECTORS.vectors.map((v) => v.expected).join("\n");
    for (const piece of [
      "<|turn>model\nLet me add.  The answer is 4.<turn|>", // thought channel removed mid-text
      "<|turn>model\nHello.How can I help?<turn|>", // two assistant messages, one turn
      "<|turn>system\nAnswer in French from now on.<turn|>", // a later system message
      "<tool_response|>It is 18 °C", // result inside the model turn, then the follow-up
      "type:<|\"|>['INTEGER', 'NULL']<|\"|>", // a union type, as Jinja2 upper-cases it
      '<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>', // no prompt after
    ]) {
      expect(all).toContain(piece);
    }
    expect(VECTORS.vectors[4]!.expected.endsWith("<tool_response|>")).toBe(true);
  });

  it("takes tool-call arguments as OpenAI's JSON string the same as an object", () => {
    const v = VECTORS.vectors[3]!;
    const wire = v.messages.map((m) =>
      m.tool_calls
        ? {
            ...m,
            tool_calls: m.tool_calls.map((c) => ({
              ...c,
              function: { ...c.function, arguments: JSON.stringify(c.function.arguments) },
            })),
          }
        : m,
    );
    for (const [, text] of templates) {
      expect(renderChat(text, wire, { bosToken: "<bos>", tools: v.tools })).toBe(v.expected);
    }
  });

  it("refuses a tool result that answers no call instead of dropping it", () => {
    const stray: ChatMessage[] = [
      { role: "user", content: "hi" },
      { role: "tool", content: "42", tool_call_id: "x" },
    ];
    for (const [, text] of templates) {
      expect(() => renderChat(text, stray)).toThrow(
        /does not follow an assistant message with tool_calls/,
      );
    }
  });

  it("puts tool results inside the model turn even for a template that renders a tool turn", () => {
    // The shape of Gemma 4 templates before the tool-response change (synthetic, minimal): tool
    // messages became `<|turn>tool` turns, results on the assistant message were rendered inline.
    const older = [
      "{%- for m in messages -%}",
      "{%- if m['role'] == 'tool' -%}{{ '<|turn>tool\\n' + m['content'] + '<turn|>\\n' }}",
      "{%- else -%}{{ '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}",
      "{%- for c in m['tool_calls'] or [] -%}{{ '<|tool_call>call:' + c['function']['name'] + '{}<tool_call|>' }}{%- endfor -%}",
      "{%- for r in m['tool_responses'] or [] -%}",
      "{{ '<|tool_response>response:' + r['name'] + '{value:<|\"|>' + r['response'] + '<|\"|>}<tool_response|>' }}",
      "{%- endfor -%}{{ m['content'] + '<turn|>\\n' }}{%- endif -%}{%- endfor -%}",
    ].join("");
    const chat: ChatMessage[] = [
      { role: "user", content: "t?" },
      {
        role: "assistant",
        content: "",
        tool_calls: [{ id: "c1", function: { name: "now", arguments: {} } }],
      },
      { role: "tool", content: "noon", tool_call_id: "c1" },
    ];
    const rendered = renderChat(older, chat, { addGenerationPrompt: false });
    expect(rendered).not.toContain("<|turn>tool");
    expect(rendered).toBe(
      "<|turn>user\nt?<turn|>\n<|turn>model\n<|tool_call>call:now{}<tool_call|>" +
        '<|tool_response>response:now{value:<|"|>noon<|"|>}<tool_response|><turn|>\n',
    );
  });
});

describe("Gemma 3 chat template (the published one)", () => {
  const t = gemma3FallbackTemplate();

  it("merges the system text into the first user turn", () => {
    expect(renderChat(t, CHAT.slice(0, 2), { bosToken: "<bos>" })).toBe(
      "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n",
    );
    expect(renderChat(t, CHAT, { bosToken: "<bos>" })).toBe(
      "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n" +
        "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nAgain<end_of_turn>\n" +
        "<start_of_turn>model\n",
    );
  });

  it("rejects roles that do not alternate, with a clear message", () => {
    expect(() =>
      renderChat(t, [
        { role: "user", content: "a" },
        { role: "user", content: "b" },
      ]),
    ).toThrow(/roles must alternate/);
  });
});

describe("loading templates and messages", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  it("prefers chat_template.jinja, then tokenizer_config.json, then the family's built-in", async () => {
    const dir = await mkdtemp(join(tmpdir(), "redwing-tpl-"));
    dirs.push(dir);
    expect(await loadChatTemplate(dir, "FROM CONFIG", "gemma4")).toBe("FROM CONFIG");
    expect(await loadChatTemplate(dir, null, "gemma4")).toBe(gemma4FallbackTemplate());
    expect(await loadChatTemplate(dir, null, "gemma3")).toBe(gemma3FallbackTemplate());
    await writeFile(join(dir, "chat_template.jinja"), "{{ bos_token }}FILE");
    const fromFile = await loadChatTemplate(dir, "FROM CONFIG", "gemma4");
    expect(renderChat(fromFile, [], { bosToken: "<b>" })).toBe("<b>FILE");
  });

  it("validates a messages file and names the bad entry", () => {
    expect(parseMessages([{ role: "user", content: "x" }], "m.json")).toEqual([
      { role: "user", content: "x" },
    ]);
    expect(() => parseMessages({}, "m.json")).toThrow(/m\.json: expected a JSON array/);
    expect(() => parseMessages([{ role: "robot", content: "x" }], "m.json")).toThrow(
      /message 0 has role "robot"/,
    );
    expect(
      parseMessages(
        [
          {
            role: "assistant",
            tool_calls: [{ id: "c", function: { name: "f", arguments: "{}" } }],
          },
          { role: "tool", tool_call_id: "c", content: "1" },
        ],
        "m.json",
      ),
    ).toEqual([
      {
        role: "assistant",
        content: "",
        tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{}" } }],
      },
      { role: "tool", content: "1", tool_call_id: "c" },
    ]);
    expect(() => parseMessages([{ role: "user" }], "m.json")).toThrow(/message 0 has no string/);
  });

  it("reports template syntax errors as user errors", () => {
    expect(() => renderChat("{% if %}", [])).toThrow(/chat template does not parse/);
  });
});
