import { describe, expect, it } from "vitest";
import { normalizeConfig } from "../import/config.ts";
import { ChatTemplate, type ChatMessage } from "../chat/template.ts";
import {
  FAMILY_IDS,
  MODEL_FAMILIES,
  MalformedToolCall,
  expectedTensors,
  familyOfModelType,
  messagesForTemplate,
  modelFamily,
} from "./index.ts";
import { GEMMA4_26B_A4B_TEXT_CONFIG, GEMMA4_TOOL_SYNTAX } from "./gemma4.ts";

describe("the model family registry", () => {
  it("has one module per family id, found by each of its model types", () => {
    expect(MODEL_FAMILIES.map((f) => f.id)).toEqual([...FAMILY_IDS]);
    for (const id of FAMILY_IDS) {
      const family = modelFamily(id);
      expect(family.id).toBe(id);
      for (const type of family.modelTypes) expect(familyOfModelType(type)).toBe(family);
    }
    expect(familyOfModelType("gemma4_text")?.id).toBe("gemma4");
    expect(familyOfModelType("gemma3")?.id).toBe("gemma3");
    expect(familyOfModelType("llama")).toBeNull();
    expect(familyOfModelType(undefined)).toBeNull();
  });

  it("asks the family for the tensors: Gemma 4 adds a layer scalar to each layer, Gemma 3 not", () => {
    const g4 = normalizeConfig(GEMMA4_26B_A4B_TEXT_CONFIG).architecture;
    // transformers' Gemma3TextConfig defaults fill a config that names only its type.
    const g3 = normalizeConfig({ model_type: "gemma3_text" }).architecture;
    const scalars = (names: string[]) => names.filter((n) => n.endsWith(".layer_scalar"));
    expect(scalars(expectedTensors(g4).map((t) => t.name))).toHaveLength(g4.num_layers);
    expect(scalars(expectedTensors(g3).map((t) => t.name))).toEqual([]);
    // Without the scalars the two families share the Gemma decoder's list.
    const g4Rest = expectedTensors(g4).filter((t) => !t.name.endsWith(".layer_scalar"));
    expect(g4Rest[0]).toEqual({
      name: "embed_tokens",
      kind: "quantized",
      shape: [g4.vocab_size, g4.hidden_size],
    });
    expect(g4Rest.at(-1)?.name).toBe("norm");
  });

  it("only Gemma 4 has a tool-call syntax", () => {
    expect(modelFamily("gemma4").tools).toBe(GEMMA4_TOOL_SYNTAX);
    expect(modelFamily("gemma3").tools).toBeNull();
  });
});

describe("messages shaped for a template", () => {
  const chat = [
    { role: "user", content: "Weather?" },
    {
      role: "assistant",
      content: "",
      tool_calls: [{ id: "c1", function: { name: "weather", arguments: { city: "Oslo" } } }],
    },
    { role: "tool", content: "rain", tool_call_id: "c1" },
  ];

  it("folds tool results into the calling turn for a template that reads tool_responses", () => {
    const shaped = messagesForTemplate("{{ m.tool_responses }}", structuredClone(chat));
    expect(shaped).toHaveLength(2);
    expect(shaped[1]!.tool_responses).toEqual([{ name: "weather", response: "rain" }]);
  });

  it("leaves them as they are for any other template (Gemma 3's included)", () => {
    const template = modelFamily("gemma3").fallbackChatTemplate();
    expect(messagesForTemplate(template, structuredClone(chat))).toEqual(chat);
  });
});

describe("Gemma 4's template and tool syntax agree", () => {
  const tools = [
    {
      type: "function",
      function: {
        name: "weather",
        description: "Weather in a city",
        parameters: {
          type: "object",
          properties: { city: { type: "string" }, days: { type: "integer" } },
          required: ["city"],
        },
      },
    },
  ];

  it("declares tools with the syntax's declaration token", () => {
    const text = new ChatTemplate(modelFamily("gemma4").fallbackChatTemplate()).render(
      [{ role: "user", content: "Weather?" }],
      { tools },
    );
    expect(text).toContain(GEMMA4_TOOL_SYNTAX.declarationOpen);
    expect(text).not.toContain(GEMMA4_TOOL_SYNTAX.callOpen);
  });

  it("parses back the call its template renders into a past model turn", () => {
    const args = { city: 'Oslo, "Norway"', days: 3, nested: { list: [1, true, null] } };
    const messages: ChatMessage[] = [
      { role: "user", content: "Weather?" },
      {
        role: "assistant",
        content: "",
        tool_calls: [{ id: "c1", function: { name: "weather", arguments: args } }],
      },
      { role: "tool", content: "rain", tool_call_id: "c1" },
    ];
    const text = new ChatTemplate(modelFamily("gemma4").fallbackChatTemplate()).render(messages, {
      tools,
    });
    const start = text.indexOf(GEMMA4_TOOL_SYNTAX.callOpen);
    expect(start).toBeGreaterThan(-1);
    const parsed = GEMMA4_TOOL_SYNTAX.parse(text.slice(start), ["weather"], {
      endedOnStopToken: true,
    });
    expect(parsed?.calls).toEqual([{ name: "weather", arguments: args }]);
  });

  it("fails closed with MalformedToolCall, which the server turns into its own error", () => {
    expect(() => GEMMA4_TOOL_SYNTAX.parse("<|tool_call>call:weather{city:Oslo}")).toThrow(
      MalformedToolCall,
    );
    expect(GEMMA4_TOOL_SYNTAX.forcedCallPrefix()).toBe("<|tool_call>call:");
    expect(GEMMA4_TOOL_SYNTAX.forcedCallPrefix("weather")).toBe("<|tool_call>call:weather");
  });
});
