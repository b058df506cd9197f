import { describe, expect, it } from "vitest";
import { ApiError } from "./errors.ts";
import { GEMMA4_TOOL_SYNTAX } from "../models/gemma4.ts";
import * as tools from "./tools.ts";

const parseToolCalls = (
  ...a: Parameters<typeof tools.parseToolCalls> extends [unknown, ...infer R] ? R : never
) => tools.parseToolCalls(GEMMA4_TOOL_SYNTAX, ...a);
const renderToolPrompt = (
  ...a: Parameters<typeof tools.renderToolPrompt> extends [unknown, ...infer R] ? R : never
) => tools.renderToolPrompt(GEMMA4_TOOL_SYNTAX, ...a);
const toolOutputPrefix = (choice: Parameters<typeof tools.toolOutputPrefix>[1]) =>
  tools.toolOutputPrefix(GEMMA4_TOOL_SYNTAX, choice);

const Q = '<|"|>';

/** Outputs in the shape Gemma 4 writes them (gemma-arch.md section 6), as the server sees them. */
const RECORDED = {
  single: `<|tool_call>call:get_weather{location:${Q}Paris, FR${Q},days:3}<tool_call|><|tool_response>`,
  nested: `<|tool_call>call:search{query:${Q}a "quoted", {odd} text${Q},filters:{max:-1.5e2,exact:true,tags:[${Q}x${Q},2,null]}}<tool_call|>`,
  two: `Let me check both.\n<|tool_call>call:get_weather{location:${Q}Oslo${Q}}<tool_call|>\n<|tool_call>call:get_time{}<tool_call|>`,
};

describe("parseToolCalls", () => {
  it("turns a Gemma 4 call into an OpenAI tool call with JSON arguments", () => {
    const r = parseToolCalls(RECORDED.single, ["get_weather"])!;
    expect(r.content).toBe("");
    expect(r.calls).toHaveLength(1);
    expect(r.calls[0]!.type).toBe("function");
    expect(r.calls[0]!.id).toMatch(/^call_[0-9a-f]{24}$/);
    expect(r.calls[0]!.function.name).toBe("get_weather");
    expect(JSON.parse(r.calls[0]!.function.arguments)).toEqual({ location: "Paris, FR", days: 3 });
  });

  it("keeps strings verbatim and reads nested objects, arrays, numbers, booleans and null", () => {
    const r = parseToolCalls(RECORDED.nested)!;
    expect(JSON.parse(r.calls[0]!.function.arguments)).toEqual({
      query: 'a "quoted", {odd} text',
      filters: { max: -150, exact: true, tags: ["x", 2, null] },
    });
  });

  it("reads several calls and the text before them", () => {
    const r = parseToolCalls(RECORDED.two, ["get_weather", "get_time"])!;
    expect(r.content).toBe("Let me check both.");
    expect(r.calls.map((c) => c.function.name)).toEqual(["get_weather", "get_time"]);
    expect(JSON.parse(r.calls[1]!.function.arguments)).toEqual({});
    expect(r.calls[0]!.id).not.toBe(r.calls[1]!.id);
  });

  it("returns null for plain text", () => {
    expect(parseToolCalls("The weather is fine.")).toBeNull();
  });

  it("parses the continuation of a forced call (tool_choice required or named)", () => {
    const named = toolOutputPrefix({ type: "function", function: { name: "get_time" } });
    expect(named).toBe("<|tool_call>call:get_time");
    const r = parseToolCalls(`${named}{zone:${Q}UTC${Q}}<tool_call|>`, ["get_time"])!;
    expect(JSON.parse(r.calls[0]!.function.arguments)).toEqual({ zone: "UTC" });
    const req = parseToolCalls(`${toolOutputPrefix("required")}get_time{}<tool_call|>`)!;
    expect(req.calls[0]!.function.name).toBe("get_time");
    expect(toolOutputPrefix("auto")).toBe("");
  });

  it.each([
    ["an unclosed call (cut by max_tokens)", `<|tool_call>call:get_weather{location:${Q}Par`],
    ["an unterminated string", `<|tool_call>call:f{a:${Q}x}<tool_call|>`],
    ["a bare word value", "<|tool_call>call:f{a:paris}<tool_call|>"],
    ["a missing call: prefix", "<|tool_call>f{}<tool_call|>"],
    ["a duplicate key", "<|tool_call>call:f{a:1,a:2}<tool_call|>"],
    ["text after the arguments", "<|tool_call>call:f{a:1} extra<tool_call|>"],
    ["a call without its end", "<|tool_call>call:f{a:1}"],
    ["a key that is not a key", "<|tool_call>call:f{:1}<tool_call|>"],
    ["a key without a value", "<|tool_call>call:f{año}<tool_call|>"],
    [
      "an unclosed thought channel before a call",
      "<|channel>thought\nhm<|tool_call>call:f{}<tool_call|>",
    ],
    ["a stray call end after a call's text", "<|tool_call>call:f{}<tool_call|>ok<tool_call|>"],
    ["a stray call end", "done<tool_call|>"],
  ])("fails closed on %s", (_what, text) => {
    let caught: unknown;
    try {
      parseToolCalls(text);
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(ApiError);
    expect((caught as ApiError).code).toBe("tool_call_parse_error");
  });

  it("keeps text after the calls as content", () => {
    const r = parseToolCalls(
      `Checking.<|tool_call>call:get_time{}<tool_call|>I will tell you the time once I have it.`,
      ["get_time"],
    )!;
    expect(r.calls.map((c) => c.function.name)).toEqual(["get_time"]);
    expect(r.content).toBe("Checking.I will tell you the time once I have it.");
  });

  it("accepts a repeated call end", () => {
    const r = parseToolCalls(
      `<|tool_call>call:get_time{zone:${Q}UTC${Q}}<tool_call|><tool_call|>\n<tool_call|>`,
    )!;
    expect(JSON.parse(r.calls[0]!.function.arguments)).toEqual({ zone: "UTC" });
    expect(r.content).toBe("");
  });

  it("accepts <turn|> or the hand-over to the tool where <tool_call|> should be", () => {
    for (const end of ["<turn|>", "<|tool_response>"]) {
      const r = parseToolCalls(`<|tool_call>call:get_time{zone:${Q}UTC${Q}}${end}ignored`)!;
      expect(r.calls).toHaveLength(1);
      expect(JSON.parse(r.calls[0]!.function.arguments)).toEqual({ zone: "UTC" });
      expect(r.content).toBe("");
    }
  });

  it("accepts a call left open by an end-of-turn stop token only when generation stopped on one", () => {
    const text = `<|tool_call>call:get_time{zone:${Q}UTC${Q}}`;
    expect(parseToolCalls(text, ["get_time"], { endedOnStopToken: true })!.calls).toHaveLength(1);
    expect(() => parseToolCalls(text, ["get_time"])).toThrow(/not closed/);
  });

  it("reads argument keys that are not ASCII identifiers, bare or quoted", () => {
    const r = parseToolCalls(
      `<|tool_call>call:plot{2d:true,año:2026,user-name:${Q}x${Q},${Q}quoted key${Q}:{ñ:[1]}}<tool_call|>`,
    )!;
    expect(JSON.parse(r.calls[0]!.function.arguments)).toEqual({
      "2d": true,
      año: 2026,
      "user-name": "x",
      "quoted key": { ñ: [1] },
    });
  });

  it("removes a thought channel before the call instead of returning it as content", () => {
    const r = parseToolCalls(
      `<|channel>thought\nThe user wants the time; call get_time.<channel|>` +
        `<|tool_call>call:get_time{}<tool_call|>`,
      ["get_time"],
    )!;
    expect(r.content).toBe("");
    expect(r.calls.map((c) => c.function.name)).toEqual(["get_time"]);
    // A call written inside the thought channel is thinking, not a call.
    expect(
      parseToolCalls("<|channel>thought\n<|tool_call>call:f{}<tool_call|><channel|>Hi"),
    ).toBeNull();
  });

  it("fails closed on a call to a function the request did not declare", () => {
    expect(() => parseToolCalls(RECORDED.single, ["get_time"])).toThrow(/undeclared/);
  });
});

describe("renderToolPrompt", () => {
  const tool = { type: "function" as const, function: { name: "get_time" } };
  it("appends the forced-call opener to a prompt whose template declared the tools", () => {
    const prompt = "<|turn>system\n<|tool>declaration:get_time{}<tool|><turn|>\n<|turn>model\n";
    expect(renderToolPrompt(prompt, [tool], "required")).toBe(`${prompt}<|tool_call>call:`);
    expect(renderToolPrompt(prompt, [tool], "auto")).toBe(prompt);
  });
  it("refuses when the template left the tools out", () => {
    expect(() => renderToolPrompt("<|turn>user\nhi<turn|>\n", [tool], "auto")).toThrow(
      /does not declare tools/,
    );
  });
});
