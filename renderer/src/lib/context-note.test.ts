import { describe, expect, it } from "vitest";
import type { Message } from "../../../core/app/api.ts";
import { droppedNote, finishNote } from "./context-note.ts";

const reply = (over: Partial<Message>): Message => ({
  id: "m",
  role: "assistant",
  content: "text",
  createdAt: "2026-01-01T00:00:00Z",
  ...over,
});

describe("context notes", () => {
  it("say what was left out, in words and figures", () => {
    const note = {
      policy: "rolling_window" as const,
      droppedMessages: 2,
      droppedTokens: 1204,
      context: 4096,
      continued: 0,
    };
    expect(droppedNote(note)).toBe(
      "2 earlier messages (1,204 tokens) were left out to fit the 4,096-token context.",
    );
    expect(droppedNote({ ...note, policy: "truncate_middle", droppedMessages: 1 })).toBe(
      "1 message from the middle (1,204 tokens) was left out to fit the 4,096-token context.",
    );
    expect(droppedNote({ ...note, droppedTokens: null, continued: 2 })).toBe(
      "2 earlier messages were left out to fit the 4,096-token context. The context filled during the reply, and it went on after leaving out more (2 times).",
    );
    expect(droppedNote({ ...note, droppedMessages: 0 })).toBeNull();
  });

  it("tell a full context from the Max new tokens limit", () => {
    expect(finishNote(reply({ finishReason: "length" }))).toBe(
      "Stopped at the “Max new tokens” limit (Tuning).",
    );
    expect(
      finishNote(
        reply({
          finishReason: "context_full",
          contextNote: {
            policy: "stop",
            droppedMessages: 0,
            droppedTokens: 0,
            context: 4096,
            continued: 0,
          },
        }),
      ),
    ).toBe("Stopped: the context of 4,096 tokens is full.");
    expect(finishNote(reply({ finishReason: "eos" }))).toBeNull();
  });
});
