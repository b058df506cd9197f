/**
 * The remote client against a second Redwing, `redwing serve` in its own process on the demo
 * model: models, a streamed reply with client-side statistics, the server restarted between two
 * requests, and each fault (refused, 401, 429 with Retry-After, cut mid-stream). Timeouts use
 * tiny local servers that stall on purpose.
 */
import { existsSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { enterTempHome, type TempHome } from "../../testkit/home.ts";
import { runCli } from "../../testkit/run-cli.ts";
import { startRemoteServe, type RemoteServe } from "../../testkit/remote-serve.ts";
import { nativeBuildDir } from "../native.ts";
import { listModels, RemoteError, remoteChatRequest, streamChat } from "./client.ts";
import { retryAfterSeconds } from "./errors.ts";
import type { Endpoint } from "./store.ts";

const haveService = existsSync(join(nativeBuildDir(), "redwing-service"));
const hello = [{ role: "user" as const, content: "Hello" }];

function endpoint(url: string, apiKey: string | null = null): Endpoint {
  return { name: "test", baseUrl: url, apiKey };
}

async function rejection(p: Promise<unknown>): Promise<RemoteError> {
  const e = await p.then(
    () => null,
    (error: unknown) => error,
  );
  expect(e).toBeInstanceOf(RemoteError);
  return e as RemoteError;
}

/** Holds the engine of `url` with a long streamed request (vLLM's ignore_eos: a known length). */
async function holdEngine(url: string): Promise<AbortController> {
  const abort = new AbortController();
  const res = await fetch(`${url}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "demo",
      messages: hello,
      // To the context's end, not a count: 400 tokens of the demo model could finish inside
      // the client's 1 s Retry-After wait, and the retry found the engine free.
      max_tokens: 100_000,
      stream: true,
      ignore_eos: true,
    }),
    signal: abort.signal,
  });
  const reader = res.body!.getReader();
  await reader.read(); // it holds the engine now
  reader.read().catch(() => undefined);
  return abort;
}

describe.skipIf(!haveService)("remote client against redwing serve", () => {
  let home: TempHome;
  let remote: RemoteServe;
  let keyed: RemoteServe;

  beforeAll(async () => {
    home = await enterTempHome("redwing-remote-");
    // --queue-limit 0: a request while another generates gets 429 at once. Each server has its
    // own home: one engine process per model directory (its lock).
    [remote, keyed] = await Promise.all([
      startRemoteServe(join(home.dir, "a"), { args: ["--queue-limit", "0"] }),
      startRemoteServe(join(home.dir, "b"), { args: ["--api-key", "sesame"] }),
    ]);
  }, 120_000);

  afterAll(async () => {
    await remote?.stop("SIGKILL");
    await keyed?.stop("SIGKILL");
    await home?.leave();
  });

  it("lists the models and streams a reply with client-side statistics", async () => {
    expect(await listModels(endpoint(remote.url))).toEqual([{ id: "demo", ownedBy: "redwing" }]);
    const pieces: string[] = [];
    const r = await streamChat(
      endpoint(remote.url),
      { model: "demo", messages: hello, maxTokens: 12, temperature: 0 },
      { onText: (t) => pieces.push(t) },
    );
    expect(r.error).toBeNull();
    expect(r.text.length).toBeGreaterThan(0);
    expect(pieces.join("")).toBe(r.text);
    expect(["stop", "length"]).toContain(r.finishReason);
    // Our server sends usage when asked (stream_options.include_usage): its counts are used.
    expect(r.tokenSource).toBe("usage");
    expect(r.promptTokensKnown).toBe(true);
    expect(r.stats!.generatedTokens).toBeGreaterThan(0);
    expect(r.stats!.generatedTokens).toBeLessThanOrEqual(12);
    expect(r.stats!.promptTokens).toBeGreaterThan(3);
    expect(r.stats!.ttftSeconds).toBeGreaterThan(0);
    expect(r.line).toMatch(
      /^\d+\.\d t\/s, TTFT: \d+\.\dms \(\d+\.\d t\/s, \d+ tokens\), \d+ tokens \(server's count\)$/,
    );
  });

  it("refuses a wrong or missing key with 401, in plain words", async () => {
    const missing = await rejection(listModels(endpoint(keyed.url)));
    expect(missing.code).toBe("remote_auth");
    expect(missing.message).toContain("needs an API key (HTTP 401)");
    const wrong = await rejection(
      streamChat(endpoint(keyed.url, "wrong"), { model: "demo", messages: hello, maxTokens: 2 }),
    );
    expect(wrong.code).toBe("remote_auth");
    expect(wrong.message).toContain("The API key was refused");
    expect(await listModels(endpoint(keyed.url, "sesame"))).toHaveLength(1);
  });

  it("chats from the CLI: bin/redwing chat --endpoint, with the key from --api-key-env", async () => {
    const messages = join(home.dir, "messages.json");
    await writeFile(messages, JSON.stringify(hello));
    process.env.REDWING_TEST_REMOTE_KEY = "sesame";
    try {
      // No --model: the server's only model.
      const ok = await runCli(
        "chat",
        "--endpoint",
        keyed.url,
        "--api-key-env",
        "REDWING_TEST_REMOTE_KEY",
        "--messages-file",
        messages,
        "--max-new",
        "8",
      );
      expect(ok.code, ok.err).toBe(0);
      expect(ok.out.trim().length).toBeGreaterThan(0);
      expect(ok.err).toContain(`chatting with "demo" at ${keyed.url}`);
      expect(ok.err).toMatch(
        /^\d+\.\d t\/s, TTFT: \d+\.\dms \(\d+\.\d t\/s, \d+ tokens\), \d+ tokens \(server's count\)$/m,
      );
      const json = await runCli(
        "chat",
        "--endpoint",
        keyed.url,
        "--api-key-env",
        "REDWING_TEST_REMOTE_KEY",
        "--model",
        "demo",
        "--messages-file",
        messages,
        "--max-new",
        "4",
        "--json",
      );
      expect(JSON.parse(json.out)).toMatchObject({
        model: "demo",
        error: null,
        token_source: "usage",
      });
    } finally {
      delete process.env.REDWING_TEST_REMOTE_KEY;
    }
    const refused = await runCli("chat", "--endpoint", keyed.url, "--messages-file", messages);
    expect(refused.code).toBe(1);
    expect(refused.err).toContain(`redwing: ${keyed.url} needs an API key (HTTP 401)`);
  });

  it("waits out a 429's Retry-After once, then says the server is busy", async () => {
    let holder = await holdEngine(remote.url);
    const waits: number[] = [];
    // Released while the client waits: the automatic retry gets the engine.
    const served = await streamChat(
      endpoint(remote.url),
      { model: "demo", messages: hello, maxTokens: 3 },
      {
        onWait: (seconds, e) => {
          waits.push(seconds);
          expect(e.status).toBe(429);
          holder.abort();
        },
      },
    );
    expect(waits).toEqual([1]);
    expect(served.error).toBeNull();
    expect(served.waited).toEqual({ seconds: 1, status: 429 });
    expect(served.line).toContain("after waiting 1 s (HTTP 429)");

    // Still busy after the wait: an error that says so, with the wait.
    holder = await holdEngine(remote.url);
    try {
      const busy = await rejection(
        streamChat(endpoint(remote.url), { model: "demo", messages: hello, maxTokens: 3 }),
      );
      expect(busy.code).toBe("remote_busy");
      expect(busy.retryAfterSeconds).toBe(1);
      expect(busy.message).toMatch(/busy \(HTTP 429\) and asks to wait 1 s/);
    } finally {
      holder.abort();
    }
  });

  it("goes on after the server restarts between two requests", async () => {
    const first = await streamChat(endpoint(remote.url), {
      model: "demo",
      messages: hello,
      maxTokens: 4,
    });
    expect(first.error).toBeNull();
    await remote.stop("SIGTERM");
    remote = await startRemoteServe(join(home.dir, "a"), {
      port: remote.port,
      args: ["--queue-limit", "0"],
    });
    const second = await streamChat(endpoint(remote.url), {
      model: "demo",
      messages: hello,
      maxTokens: 4,
    });
    expect(second.error).toBeNull();
    expect(second.text.length).toBeGreaterThan(0);
  }, 60_000);

  it("keeps the text of a stream cut mid-way, then says the server is not running", async () => {
    const url = remote.url;
    let killed = false;
    const r = await streamChat(
      endpoint(url),
      { model: "demo", messages: hello, maxTokens: 400, temperature: 0 },
      {
        onText: () => {
          if (killed) return;
          killed = true;
          remote.child.kill("SIGKILL");
        },
      },
    );
    expect(killed).toBe(true);
    expect(r.finishReason).toBe("error");
    expect(r.error!.code).toBe("remote_cut");
    expect(r.error!.message).toContain("was cut before the reply ended; the text so far is kept");
    expect(r.text.length).toBeGreaterThan(0);
    await remote.stop("SIGKILL");

    const refused = await rejection(listModels(endpoint(url)));
    expect(refused.code).toBe("remote_refused");
    expect(refused.message).toBe(
      `Could not connect to ${url}: the connection was refused. Is the server running at ${url}?`,
    );
    const refusedChat = await rejection(
      streamChat(endpoint(url), { model: "demo", messages: hello }),
    );
    expect(refusedChat.code).toBe("remote_refused");
  });
});

describe("remoteChatRequest", () => {
  it("sends roles a server knows and the sampling as given", () => {
    const r = remoteChatRequest(
      "m",
      [
        { role: "system", content: "be brief" },
        { role: "user", content: "hi" },
        { role: "assistant", content: "hello" },
        { role: "tool", content: "42" },
      ],
      { temperature: 0.5, topP: 0.9, maxTokens: 7, stop: ["\n"], seed: null },
    );
    expect(r).toEqual({
      model: "m",
      messages: [
        { role: "system", content: "be brief" },
        { role: "user", content: "hi" },
        { role: "assistant", content: "hello" },
        { role: "user", content: "42" },
      ],
      temperature: 0.5,
      topP: 0.9,
      maxTokens: 7,
      stop: ["\n"],
      seed: null,
    });
  });
});

describe("remote client timeouts", () => {
  let server: Server;
  let url: string;

  beforeAll(async () => {
    server = createServer((req, res) => {
      if (req.url?.endsWith("/models")) return; // never answers
      // One delta, then silence: a stalled stream.
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(
        `data: ${JSON.stringify({ id: "1", object: "chat.completion.chunk", created: 0, model: "m", choices: [{ index: 0, delta: { content: "Hi" }, finish_reason: null }] })}\n\n`,
      );
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  });

  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  it("says when the server does not answer in time", async () => {
    const e = await rejection(listModels(endpoint(url), { timeoutMs: 200 }));
    expect(e.code).toBe("remote_timeout");
    expect(e.message).toContain("did not answer in time");
  });

  it("stops a stream that goes silent, keeping its text", async () => {
    const r = await streamChat(endpoint(url), { model: "m", messages: hello }, {}, { idleMs: 300 });
    expect(r.text).toBe("Hi");
    expect(r.finishReason).toBe("error");
    expect(r.error!.code).toBe("remote_timeout");
    expect(r.error!.message).toContain("sent nothing for 0 s");
    // No usage from this server: the tokens were counted from the deltas, and the line says so.
    expect(r.tokenSource).toBe("counted");
    expect(r.line).toMatch(/, 1 tokens \(counted from the stream\)$/);
  });

  it("reads Retry-After as seconds or as an HTTP date", () => {
    expect(retryAfterSeconds("3")).toBe(3);
    expect(retryAfterSeconds(new Date(10_000).toUTCString(), 4_000)).toBe(6);
    expect(retryAfterSeconds("soon")).toBeNull();
    expect(retryAfterSeconds(null)).toBeNull();
  });
});
