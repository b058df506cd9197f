/**
 * The app's OpenAI-compatible server as a user watches it (issue 18): its requests listed in the
 * Server view with Cancel, a chat reply that waits behind a server request saying so (and
 * cancelling it), and the server answering 503 while the engine restarts after a crash, then
 * serving again without anyone pressing "Restart engine".
 */
import { freePort } from "../testkit/free-port.ts";
import { expect, test, type RedwingApp } from "./fixtures.ts";
import { loadRandomModel, RANDOM_MODEL } from "./random-model.ts";
import { gotoView, lastReply, send, waitReady, waitReply } from "./ui.ts";

/** Switches the server on and answers its /v1 address. */
async function serverOn(app: RedwingApp): Promise<string> {
  const status = await app.call("server.set", { enabled: true, port: await freePort() });
  return status.url!;
}

/** A request long enough to watch: generated through end-of-turn tokens, to the context's end. */
function longRequest(url: string): Promise<Response> {
  return fetch(`${url}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "demo",
      messages: [{ role: "user", content: "Tell me a long story." }],
      max_tokens: 100_000,
      ignore_eos: true,
    }),
  });
}

async function errorCode(res: Response): Promise<string> {
  return ((await res.json()) as { error: { code: string } }).error.code;
}

/**
 * A streamed request that names no sampling field (as standard clients send it), and its decode
 * rate measured here: the tokens after the first over the time from the first text to the last,
 * as the chat's statistics line counts them.
 */
async function streamedDecodeRate(url: string, model: string, maxTokens: number): Promise<number> {
  const res = await fetch(`${url}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model,
      messages: [{ role: "user", content: "Tell me a story." }],
      max_tokens: maxTokens,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  expect(res.status).toBe(200);
  const decoder = new TextDecoder();
  let buffered = "";
  let first = 0;
  let last = 0;
  let tokens = 0;
  for await (const chunk of res.body!) {
    const now = performance.now();
    buffered += decoder.decode(chunk as Uint8Array, { stream: true });
    const lines = buffered.split("\n");
    buffered = lines.pop()!;
    for (const line of lines) {
      if (!line.startsWith("data: {")) continue;
      const event = JSON.parse(line.slice(6)) as {
        choices: { delta?: { content?: string } }[];
        usage?: { completion_tokens: number } | null;
      };
      if (event.choices[0]?.delta?.content) {
        first ||= now;
        last = now;
      }
      if (event.usage) tokens = event.usage.completion_tokens;
    }
  }
  expect(tokens, "the request ran to its max_tokens").toBe(maxTokens);
  return (tokens - 1) / ((last - first) / 1000);
}

async function runningRequest(app: RedwingApp): Promise<void> {
  await expect
    .poll(async () => (await app.call("server.status")).requests[0]?.state)
    .toBe("running");
}

test("server requests: listed with Cancel, and a chat waiting behind one says so", async ({
  app,
}) => {
  const { page } = app;
  await waitReady(page, "demo");
  await app.call("settings.update", { sampling: { maxNewTokens: 8 } });
  const url = await serverOn(app);

  // The Server view lists a running request with its client and tokens, and cancels it.
  await gotoView(page, "Server");
  const first = longRequest(url);
  const list = page.getByTestId("server-requests");
  const row = list.locator('li[data-state="running"]');
  await expect(row).toContainText(/Running · chat from .*127\.0\.0\.1:\d+/);
  await expect(row).toContainText(/\d+ of at most \d+ tokens/);
  await row.getByRole("button", { name: /^Cancel the request from / }).click();
  const cancelled = await first;
  expect(cancelled.status).toBe(503);
  expect(await errorCode(cancelled)).toBe("request_cancelled");
  await expect(page.getByText("None in progress.")).toBeVisible();

  // A chat reply queued behind a server request says what it waits for, and can cancel it.
  const second = longRequest(url);
  await runningRequest(app);
  await gotoView(page, "Chat");
  await send(page, "Hello");
  const waiting = lastReply(page).getByTestId("waiting-for-server");
  await expect(waiting).toContainText("Waiting for a server request to finish");
  await waiting.getByRole("button", { name: "Cancel it", exact: true }).click();
  expect((await second).status).toBe(503);
  await waitReply(page);
  await expect(waiting).toHaveCount(0);

  // A request without top_k / top_p / temperature decodes as fast as chat: it gets Tuning's
  // values (the random-weight model has Gemma 3's 262k vocabulary, where sampling from all of
  // it, OpenAI's top_k 0, made requests several times slower than chat). A ratio, not a time.
  const tokens = 48;
  await loadRandomModel(app); // writes until the token limit
  await app.call("settings.update", { sampling: { maxNewTokens: tokens } });
  await expect.poll(async () => (await app.call("server.status")).modelId).toBe(RANDOM_MODEL);
  const served = (await app.call("server.status")).url!;
  await page.getByRole("button", { name: "New chat", exact: true }).click();
  await send(page, "Tell me a story.");
  const chatRate = Number(/^([\d.]+) t\/s/.exec(await waitReply(page))![1]);
  const serverRate = await streamedDecodeRate(served, RANDOM_MODEL, tokens);
  console.log(
    `decode: chat ${chatRate.toFixed(1)} t/s, server request without sampling fields ${serverRate.toFixed(1)} t/s (ratio ${(serverRate / chatRate).toFixed(2)})`,
  );
  expect(serverRate / chatRate).toBeGreaterThan(0.5);
});

test("server: 503 with Retry-After while the engine restarts after a crash, then 200 again", async ({
  app,
}) => {
  const { page } = app;
  await waitReady(page, "demo");
  const url = await serverOn(app);
  const inFlight = longRequest(url);
  await runningRequest(app);
  const pid = (await app.call("engine.status")).pid!;
  process.kill(pid, "SIGKILL");
  expect((await inFlight).status).toBeGreaterThanOrEqual(500);

  // The server never refuses the connection: 503 until the restarted engine has the model.
  const statuses: number[] = [];
  await expect
    .poll(
      async () => {
        const res = await fetch(`${url}/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            model: "demo",
            messages: [{ role: "user", content: "Hi" }],
            max_tokens: 2,
          }),
        });
        statuses.push(res.status);
        if (res.status === 503) expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(0);
        await res.body?.cancel();
        return res.status;
      },
      { timeout: 60_000, intervals: [20] },
    )
    .toBe(200);
  expect(statuses.every((s) => s === 503 || s === 200)).toBe(true);
  await waitReady(page, "demo");
  expect((await app.call("engine.status")).pid).not.toBe(pid);
  expect((await app.call("server.status")).running).toBe(true);
});
