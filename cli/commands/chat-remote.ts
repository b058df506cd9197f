/**
 * `redwing chat --endpoint URL [--model NAME] [--api-key-env VAR]`: the same chat (one-shot from
 * --messages-file, or interactive on a terminal) with a model on an OpenAI-compatible server
 * (docs/remote.md), through core/connections' client. The reply streams to stdout and the
 * statistics line, measured here, goes to stderr as for a local model.
 */
import type { ChatMessage } from "../../core/chat/template.ts";
import {
  listModels,
  remoteChatRequest,
  streamChat,
  type RemoteChatRequest,
  type RemoteReply,
} from "../../core/connections/client.ts";
import type { Endpoint } from "../../core/connections/store.ts";
import { checkBaseUrl } from "../../core/connections/url.ts";
import { UserError } from "../../core/errors.ts";
import { chatLoop } from "./chat-loop.ts";

export interface RemoteChatOptions {
  endpoint: string;
  apiKeyEnv?: string;
  model?: string;
  messagesFile?: string;
  maxNew: number;
  temperature: number;
  topP: number;
  seed?: number;
  stop: string[];
  quiet?: boolean;
  json?: boolean;
}

/** The endpoint from the options: URL checked, key read from the named variable. */
export function remoteEndpoint(
  opts: Pick<RemoteChatOptions, "endpoint" | "apiKeyEnv">,
  env: Record<string, string | undefined> = process.env,
): { endpoint: Endpoint; warning: string | null } {
  let apiKey: string | null = null;
  if (opts.apiKeyEnv !== undefined) {
    apiKey = env[opts.apiKeyEnv]?.trim() || null;
    if (apiKey === null) {
      throw new UserError(
        `--api-key-env ${opts.apiKeyEnv}: that environment variable is empty or not set`,
        "bad_api_key",
      );
    }
  }
  const { url, warning } = checkBaseUrl(opts.endpoint, apiKey !== null);
  return { endpoint: { name: url, baseUrl: url, apiKey }, warning };
}

/** --model, or the server's only model; several: the user must choose, and is told which. */
async function pickModel(endpoint: Endpoint, model: string | undefined): Promise<string> {
  if (model !== undefined) return model;
  const models = await listModels(endpoint);
  if (models.length === 1) return models[0]!.id;
  if (models.length === 0) {
    throw new UserError(`${endpoint.baseUrl} lists no models`, "remote_no_models");
  }
  throw new UserError(
    `${endpoint.baseUrl} serves several models; choose one with --model: ${models.map((m) => m.id).join(", ")}`,
    "remote_model_needed",
  );
}

function request(
  model: string,
  messages: ChatMessage[],
  opts: RemoteChatOptions,
): RemoteChatRequest {
  return remoteChatRequest(model, messages, {
    temperature: opts.temperature,
    topP: opts.topP,
    maxTokens: opts.maxNew,
    stop: opts.stop,
    seed: opts.seed ?? null,
  });
}

/** One reply: text to stdout as it comes (unless --json), waits and statistics to stderr. */
async function replyOnce(
  endpoint: Endpoint,
  req: RemoteChatRequest,
  opts: RemoteChatOptions,
  signal?: AbortSignal,
): Promise<RemoteReply> {
  const reply = await streamChat(
    endpoint,
    req,
    {
      onText: (text) => {
        if (!opts.json) process.stdout.write(text);
      },
      onWait: (seconds, error) => {
        if (!opts.json) {
          process.stderr.write(
            `redwing: the server is busy (HTTP ${error.status}); retrying in ${seconds} s\n`,
          );
        }
      },
    },
    { signal },
  );
  if (!opts.json) {
    if (reply.text !== "" && !reply.text.endsWith("\n") && !opts.quiet) process.stdout.write("\n");
    if (reply.line && !opts.quiet) process.stderr.write(`${reply.line}\n`);
  }
  return reply;
}

function replyJson(reply: RemoteReply, model: string): string {
  const s = reply.stats;
  return (
    JSON.stringify({
      text: reply.text,
      model,
      finish_reason: reply.finishReason,
      error: reply.error ? { code: reply.error.code, message: reply.error.message } : null,
      token_source: reply.tokenSource,
      prompt_tokens: reply.promptTokensKnown && s ? s.promptTokens : null,
      stats: s && {
        generated_tokens: s.generatedTokens,
        ttft_seconds: s.ttftSeconds,
        decode_seconds: s.decodeSeconds,
        decode_tokens_per_second:
          s.decodeSeconds > 0 ? Math.max(0, s.generatedTokens - 1) / s.decodeSeconds : 0,
      },
    }) + "\n"
  );
}

export async function remoteChat(opts: RemoteChatOptions, messages: ChatMessage[]): Promise<void> {
  const { endpoint, warning } = remoteEndpoint(opts);
  const quiet = opts.quiet === true || opts.json === true;
  if (warning && !quiet) process.stderr.write(`redwing: warning: ${warning}\n`);
  const model = await pickModel(endpoint, opts.model);
  if (!quiet) process.stderr.write(`redwing: chatting with "${model}" at ${endpoint.baseUrl}\n`);

  if (opts.messagesFile) {
    const reply = await replyOnce(endpoint, request(model, messages, opts), opts);
    if (opts.json) process.stdout.write(replyJson(reply, model));
    // The text so far was printed; the failure is the exit status and its message.
    if (reply.error) throw reply.error;
    return;
  }
  await chatLoop(
    messages,
    (history, signal) =>
      replyOnce(endpoint, request(model, history, opts), { ...opts, json: false }, signal),
    opts,
  );
}
