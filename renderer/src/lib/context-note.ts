/**
 * The notes under a reply about the context (core/app/context-fit.ts): what was left out of the
 * conversation to fit it, and a reply that stopped because it was full.
 */
import type { ContextNote, Message } from "../../../core/app/api.ts";

function count(n: number): string {
  return n.toLocaleString("en-US");
}

/** "2 earlier messages (1,204 tokens) were left out to fit the 4,096-token context." */
export function droppedNote(note: ContextNote): string | null {
  if (note.droppedMessages === 0) return null;
  const many = note.droppedMessages !== 1;
  const messages = `${count(note.droppedMessages)} ${many ? "messages" : "message"}`;
  const which =
    note.policy === "truncate_middle"
      ? `${messages} from the middle`
      : `${count(note.droppedMessages)} earlier ${many ? "messages" : "message"}`;
  const tokens = note.droppedTokens === null ? "" : ` (${count(note.droppedTokens)} tokens)`;
  let text = `${which}${tokens} ${many ? "were" : "was"} left out to fit the ${count(note.context)}-token context.`;
  if (note.continued > 0) {
    const times = note.continued === 1 ? "" : ` (${count(note.continued)} times)`;
    text += ` The context filled during the reply, and it went on after leaving out more${times}.`;
  }
  return text;
}

/** The note under a reply for how it ended, or null when there is nothing to say. */
export function finishNote(message: Message): string | null {
  switch (message.finishReason) {
    case "cancelled":
      return "Stopped.";
    case "length":
      return "Stopped at the “Max new tokens” limit (Tuning).";
    case "context_full":
      return message.contextNote
        ? `Stopped: the context of ${count(message.contextNote.context)} tokens is full.`
        : "Stopped: the context is full.";
    default:
      return null;
  }
}
