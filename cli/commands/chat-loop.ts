/**
 * The interactive chat loop `redwing chat` runs on a terminal, for a local model and for a remote
 * endpoint alike: one line per user turn, Ctrl-C stops the reply being written (and quits at the
 * prompt), Ctrl-D or /exit quits, /reset clears the conversation but keeps the system prompt.
 */
import { createInterface } from "node:readline/promises";
import type { ChatMessage } from "../../core/chat/template.ts";
import { UserError } from "../../core/errors.ts";

/** What one turn wrote: the text shown, and the failure that ended it early (if any). */
export interface TurnReply {
  text: string;
  error?: Error | null;
}

/** Writes the reply to `history` (its last message is the user's), printing as it goes. */
export type ReplyWriter = (history: ChatMessage[], signal: AbortSignal) => Promise<TurnReply>;

export async function chatLoop(
  history: ChatMessage[],
  reply: ReplyWriter,
  opts: { quiet?: boolean },
): Promise<void> {
  const rl = createInterface({ input: process.stdin, output: process.stderr, terminal: true });
  let current: AbortController | null = null;
  rl.on("SIGINT", () => {
    if (current) current.abort();
    else rl.close();
  });
  process.stderr.write("Type a message; /reset clears the conversation, /exit or Ctrl-D quits.\n");
  try {
    for (;;) {
      let line: string;
      try {
        line = await rl.question("> ");
      } catch {
        break; // closed (Ctrl-D or Ctrl-C at the prompt)
      }
      const text = line.trim();
      if (text === "/exit" || text === "/quit") break;
      if (text === "/reset") {
        history.splice(history[0]?.role === "system" ? 1 : 0);
        continue;
      }
      if (text === "") continue;
      history.push({ role: "user", content: text });
      current = new AbortController();
      try {
        const r = await reply(history, current.signal);
        if (opts.quiet && r.text !== "" && !r.text.endsWith("\n")) process.stdout.write("\n");
        // What was shown stays in the conversation, even when cut short.
        if (r.text !== "") history.push({ role: "assistant", content: r.text });
        else history.pop();
        if (r.error) process.stderr.write(`redwing: ${r.error.message}\n`);
      } catch (error) {
        history.pop();
        if (!(error instanceof UserError)) throw error;
        process.stderr.write(`redwing: ${error.message}\n`);
      } finally {
        current = null;
      }
    }
  } finally {
    rl.close();
  }
}
