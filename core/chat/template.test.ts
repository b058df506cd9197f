import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  builtinGemma3Template,
  builtinGemma4Template,
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
  const t = builtinGemma4Template();

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

describe("Gemma 3 chat template (the published one)", () => {
  const t = builtinGemma3Template();

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
    expect(await loadChatTemplate(dir, null, "gemma4")).toBe(builtinGemma4Template());
    expect(await loadChatTemplate(dir, null, "gemma3")).toBe(builtinGemma3Template());
    await writeFile(join(dir, "chat_template.jinja"), "{{ bos_token }}FILE");
    const fromFile = await loadChatTemplate(dir, "FROM CONFIG", "gemma4");
    expect(renderChat(fromFile, [], { bosToken: "<b>" })).toBe("<b>FILE");
  });

  it("validates a messages file and names the bad entry", () => {
    expect(parseMessages([{ role: "user", content: "x" }], "m.json")).toEqual([
      { role: "user", content: "x" },
    ]);
    expect(() => parseMessages({}, "m.json")).toThrow(/m\.json: expected a JSON array/);
    expect(() => parseMessages([{ role: "tool", content: "x" }], "m.json")).toThrow(
      /message 0 has role "tool"/,
    );
    expect(() => parseMessages([{ role: "user" }], "m.json")).toThrow(/message 0 has no string/);
  });

  it("reports template syntax errors as user errors", () => {
    expect(() => renderChat("{% if %}", [])).toThrow(/chat template does not parse/);
  });
});
