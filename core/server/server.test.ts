/**
 * The OpenAI-compatible server driven by the official `openai` client (and raw fetch where the
 * wire format itself is checked), against the demo model on 127.0.0.1 with an ephemeral port.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { enterTempHome, type TempHome } from "../../testkit/home.ts";
import { loadChatTemplate, renderChat } from "../chat/template.ts";
import { loadTokenizer, type ChatTokenizer } from "../chat/tokenizer.ts";
import { ensureDemoModel } from "../demo/demo.ts";
import { nativeBuildDir } from "../native.ts";
import { checkBinding, startServer, type RedwingServer } from "./server.ts";

const haveService = existsSync(join(nativeBuildDir(), "redwing-service"));
const CONTEXT = 256;

let home: string;
let tempHome: TempHome | undefined;
let server: RedwingServer;
let client: OpenAI;
let tokenizer: ChatTokenizer;
let template: string;

/** Not in OpenAI's types: vLLM's extension, so that the demo's output has a known length. */
const noEos = { ignore_eos: true } as object;

async function until(condition: () => boolean, timeoutMs = 10_000): Promise<void> {
  const start = Date.now();
  while (!condition()) {
    if (Date.now() - start > timeoutMs) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function post(path: string, body: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${server.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body,
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

describe.skipIf(!haveService)("OpenAI-compatible server", () => {
  beforeAll(async () => {
    tempHome = await enterTempHome("redwing-server-");
    home = tempHome.dir;
    const dir = await ensureDemoModel(join(home, "models", "demo"));
    tokenizer = await loadTokenizer(dir);
    template = await loadChatTemplate(dir, tokenizer.configTemplate, "gemma4");
    server = await startServer({ port: 0, queueLimit: 1, context: CONTEXT, bodyLimit: 64 * 1024 });
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
  }, 120_000);

  afterAll(async () => {
    await server?.close();
    await tempHome?.leave();
  });

  it("binds to 127.0.0.1 and lists its model", async () => {
    expect(server.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(["demo"]);
    const health = await (await fetch(`${server.url}/health`)).json();
    expect(health).toMatchObject({ status: "ok", model: "demo" });
  });

  const messages = [
    { role: "system" as const, content: "You are terse." },
    { role: "user" as const, content: "Say something." },
  ];
  let reference = "";

  it("answers a chat, stopping at max_tokens with finish_reason length", async () => {
    const r = await client.chat.completions.create({
      model: "demo",
      messages,
      temperature: 0,
      max_completion_tokens: 6,
      ...noEos,
    });
    expect(r.object).toBe("chat.completion");
    expect(r.choices).toHaveLength(1);
    expect(r.choices[0]!.finish_reason).toBe("length");
    expect(r.usage!.completion_tokens).toBe(6);
    // The prompt went through the model's own chat template.
    const expected = tokenizer.encode(
      renderChat(template, messages, {
        bosToken: tokenizer.bosToken,
        eosToken: tokenizer.eosToken,
      }),
      { addBos: true },
    );
    expect(r.usage!.prompt_tokens).toBe(expected.length);
    reference = r.choices[0]!.message.content!;
    expect(reference.length).toBeGreaterThan(0);
  });

  it("streams the same answer as server-sent events, with usage and cached tokens", async () => {
    const stream = await client.chat.completions.create({
      model: "demo",
      messages,
      temperature: 0,
      max_tokens: 6,
      stream: true,
      stream_options: { include_usage: true },
      ...noEos,
    });
    let text = "";
    const reasons: (string | null)[] = [];
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      expect(chunk.object).toBe("chat.completion.chunk");
      for (const c of chunk.choices) {
        text += c.delta.content ?? "";
        reasons.push(c.finish_reason);
      }
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe(reference);
    expect(reasons.at(-1)).toBe("length");
    expect(usage!.completion_tokens).toBe(6);
    // Same prompt as the request before: the service reused its KV cache.
    expect(usage!.prompt_tokens_details!.cached_tokens).toBeGreaterThan(0);
  });

  it("ends at a stop sequence without emitting it", async () => {
    const chars = Array.from(reference);
    const k = Math.floor(chars.length / 2);
    const stop = chars.slice(k, k + 2).join("");
    const r = await client.chat.completions.create({
      model: "demo",
      messages,
      temperature: 0,
      max_tokens: 6,
      stop: [stop, "never-appears"],
      ...noEos,
    });
    expect(r.choices[0]!.finish_reason).toBe("stop");
    expect(r.choices[0]!.message.content).toBe(reference.slice(0, reference.indexOf(stop)));
  });

  it("serves raw completions, streamed to data: [DONE]", async () => {
    const body = {
      model: "demo",
      prompt: "Once upon",
      max_tokens: 3,
      temperature: 0,
      stream: true,
    };
    const res = await post("/v1/completions", JSON.stringify({ ...body, ignore_eos: true }));
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const events = res.text.split("\n\n").filter((e) => e.startsWith("data: "));
    expect(events.at(-1)).toBe("data: [DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
    const streamed = chunks.map((c) => c.choices[0].text).join("");
    expect(chunks.at(-1).choices[0].finish_reason).toBe("length");
    const whole = await client.completions.create({ ...body, stream: false, ...noEos });
    expect(whole.choices[0]!.text).toBe(streamed);
    expect(whole.usage!.completion_tokens).toBe(3);
  });

  it("cancels the generation of a client that disconnects", async () => {
    const before = server.metrics.cancelled;
    const abort = new AbortController();
    const stream = await client.chat.completions.create(
      { model: "demo", messages, max_tokens: 200, stream: true, ...noEos },
      { signal: abort.signal },
    );
    let chunks = 0;
    try {
      for await (const chunk of stream) {
        void chunk;
        if (++chunks === 3) abort.abort();
      }
    } catch {
      // the client's own abort
    }
    await until(() => !server.queue.active);
    expect(server.metrics.cancelled).toBe(before + 1);
    // The engine stopped well short of the 200 tokens asked for.
    const stats = await server.engine.stats();
    expect(stats.generated_tokens).toBeLessThan(100);
  });

  it("queues one request and refuses the next with 429 and Retry-After", async () => {
    const abort = new AbortController();
    const long = await client.chat.completions.create(
      { model: "demo", messages, max_tokens: 200, stream: true, ...noEos },
      { signal: abort.signal },
    );
    const iterator = long[Symbol.asyncIterator]();
    await iterator.next(); // it holds the engine now
    const waiting = client.chat.completions.create({
      model: "demo",
      messages,
      max_tokens: 2,
      ...noEos,
    });
    await until(() => server.queue.waiting === 1);
    const refused = await client.chat.completions
      .create({ model: "demo", messages, max_tokens: 2 })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    expect((refused as InstanceType<typeof OpenAI.RateLimitError>).headers.get("retry-after")).toBe(
      "1",
    );
    abort.abort();
    const served = await waiting;
    expect(served.choices[0]!.finish_reason).toBe("length");
    expect(server.metrics.queueWaitMsMax).toBeGreaterThan(0);
  });

  it("drops a queued request whose client goes away", async () => {
    const before = server.metrics.cancelled;
    const holder = new AbortController();
    const long = await client.chat.completions.create(
      { model: "demo", messages, max_tokens: 200, stream: true, ...noEos },
      { signal: holder.signal },
    );
    await long[Symbol.asyncIterator]().next();
    const quitter = new AbortController();
    const queued = client.chat.completions
      .create({ model: "demo", messages, max_tokens: 2 }, { signal: quitter.signal })
      .catch((e: unknown) => e);
    await until(() => server.queue.waiting === 1);
    quitter.abort();
    expect(await queued).toBeInstanceOf(OpenAI.APIUserAbortError);
    await until(() => server.queue.waiting === 0);
    holder.abort();
    await until(() => !server.queue.active);
    expect(server.metrics.cancelled).toBe(before + 2);
  });

  it("answers errors in OpenAI's shape with the right status", async () => {
    const bad = await post("/v1/chat/completions", "{not json");
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.text).error).toMatchObject({ type: "invalid_request_error" });

    const wrongType = await post(
      "/v1/chat/completions",
      JSON.stringify({ model: "demo", messages, temperature: "hot" }),
    );
    expect(wrongType.status).toBe(400);
    expect(JSON.parse(wrongType.text).error).toMatchObject({
      type: "invalid_request_error",
      param: "temperature",
    });

    const big = await post(
      "/v1/completions",
      JSON.stringify({ model: "demo", prompt: "x".repeat(100_000) }),
    );
    expect(big.status).toBe(413);
    expect(JSON.parse(big.text).error.code).toBe("body_too_large");

    const unknown = await client.chat.completions
      .create({ model: "gpt-4o", messages })
      .catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(OpenAI.NotFoundError);
    expect((unknown as InstanceType<typeof OpenAI.NotFoundError>).code).toBe("model_not_found");

    const tooLong = await client.chat.completions
      .create({ model: "demo", messages: [{ role: "user", content: "word ".repeat(CONTEXT) }] })
      .catch((e: unknown) => e);
    expect(tooLong).toBeInstanceOf(OpenAI.BadRequestError);
    expect((tooLong as InstanceType<typeof OpenAI.BadRequestError>).code).toBe(
      "context_length_exceeded",
    );

    const n2 = await client.chat.completions
      .create({ model: "demo", messages, n: 2 })
      .catch((e: unknown) => e);
    expect(n2).toBeInstanceOf(OpenAI.BadRequestError);

    const tools = await client.chat.completions
      .create({
        model: "demo",
        messages,
        tools: [{ type: "function", function: { name: "get_time", parameters: {} } }],
      })
      .catch((e: unknown) => e);
    expect(tools).toBeInstanceOf(OpenAI.BadRequestError);
    expect((tools as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("tools_unsupported");

    const noRoute = await fetch(`${server.url}/v1/embeddings`, { method: "POST" });
    expect(noRoute.status).toBe(404);
    // No CORS unless configured.
    const cors = await fetch(`${server.url}/health`, { headers: { origin: "http://evil.test" } });
    expect(cors.headers.get("access-control-allow-origin")).toBeNull();
  });

  it("answers 503 when the engine crashes, and the next request works", async () => {
    const pending = client.chat.completions
      .create({ model: "demo", messages, max_tokens: 200, ...noEos })
      .catch((e: unknown) => e);
    await until(() => server.queue.active);
    await new Promise((r) => setTimeout(r, 300));
    process.kill(server.engine.pid!, "SIGKILL");
    const crashed = await pending;
    expect(crashed).toBeInstanceOf(OpenAI.APIError);
    expect((crashed as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
    const after = await client.chat.completions.create({
      model: "demo",
      messages,
      temperature: 0,
      max_tokens: 6,
      ...noEos,
    });
    expect(after.choices[0]!.message.content).toBe(reference);
  });

  it("checks the API key on every request and sends CORS headers only when configured", async () => {
    // A second engine needs its own copy of the model (the first one holds its lock).
    const second = await ensureDemoModel(join(home, "demo-b"));
    const secured = await startServer({
      model: second,
      port: 0,
      context: CONTEXT,
      apiKey: "s3cret",
      corsOrigin: "http://app.test",
    });
    try {
      const anon = new OpenAI({ baseURL: `${secured.url}/v1`, apiKey: "wrong", maxRetries: 0 });
      await expect(anon.models.list()).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
      const health = await fetch(`${secured.url}/health`);
      expect(health.status).toBe(401);
      const ok = new OpenAI({ baseURL: `${secured.url}/v1`, apiKey: "s3cret", maxRetries: 0 });
      expect((await ok.models.list()).data[0]!.id).toBe("demo-b");
      const preflight = await fetch(`${secured.url}/v1/chat/completions`, {
        method: "OPTIONS",
        headers: { origin: "http://app.test", "access-control-request-method": "POST" },
      });
      expect(preflight.status).toBe(204);
      expect(preflight.headers.get("access-control-allow-origin")).toBe("http://app.test");
    } finally {
      await secured.close();
    }
  });
});

describe("checkBinding", () => {
  it("allows loopback, and anything else only with --allow-remote and an API key", () => {
    expect(() => checkBinding({ host: "127.0.0.1" })).not.toThrow();
    expect(() => checkBinding({ host: "::1" })).not.toThrow();
    expect(() => checkBinding({ host: "0.0.0.0" })).toThrow(/--allow-remote/);
    expect(() => checkBinding({ host: "0.0.0.0", allowRemote: true })).toThrow(/API key/);
    expect(() => checkBinding({ host: "0.0.0.0", allowRemote: true, apiKey: "k" })).not.toThrow();
  });
});
