/**
 * Server load benchmark: starts `redwing serve` (demo model unless --model) as a child process
 * on 127.0.0.1 with an ephemeral port, runs N concurrent streaming chat clients for a bounded
 * time, and reports throughput, time to first token, the server's queue wait (from /health) and
 * the RSS of the server process and of the decode service, sampled once a second: both should
 * stay flat under a steady load. Then one client sends a prompt of the maximum body size (4 MiB,
 * `redwing serve`'s default --max-body) while another asks /health every 20 ms: the latency of
 * those answers shows whether one huge prompt stalls everyone (it must not: the length is checked
 * before tokenizing, and long prompts are tokenized off the event loop). Writes
 * bench/results/server-load.json.
 *
 *   node --import tsx bench/server-load.ts [--clients 6] [--seconds 20] [--max-tokens 24]
 */
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { writeResult } from "./stats.ts";

const root = fileURLToPath(new URL("..", import.meta.url));

export interface ServerLoadOptions {
  clients?: number;
  seconds?: number;
  maxTokens?: number;
  /** Model name or directory; default: the demo model in a temporary REDWING_HOME. */
  model?: string;
}

export interface ServerLoadReport {
  clients: number;
  seconds: number;
  maxTokens: number;
  requests: number;
  failures: number;
  completionTokens: number;
  tokensPerSecond: number;
  requestsPerSecond: number;
  ttftMs: { p50: number; p95: number; max: number };
  queueWaitMs: { mean: number; max: number };
  /** MB, sampled once a second over the run. */
  serverRssMB: { first: number; last: number; max: number };
  serviceRssMB: { first: number; last: number; max: number };
  /** /health latency while one client sends a prompt of the maximum body size. */
  healthDuringMaxBody: {
    bodyBytes: number;
    /** The big request's status and how long it took. */
    status: number;
    requestMs: number;
    probes: number;
    healthMs: { p50: number; max: number };
  };
}

/** The largest body `redwing serve` accepts by default (--max-body 4M). */
const MAX_BODY_BYTES = 4 * 1024 * 1024;

/** /health latency while a max-size prompt is sent, answered and refused (or tokenized). */
async function healthDuringMaxBody(url: string): Promise<ServerLoadReport["healthDuringMaxBody"]> {
  const overhead = JSON.stringify({ model: "x", prompt: "", max_tokens: 1 }).length + 64;
  const prompt = "hello world. ".repeat(Math.floor((MAX_BODY_BYTES - overhead) / 13));
  const model = ((await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] })
    .data[0]!.id;
  const body = JSON.stringify({ model, prompt, max_tokens: 1 });
  const started = performance.now();
  let settled = false;
  const big = fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  }).then(async (res) => {
    await res.text();
    return { status: res.status, ms: performance.now() - started };
  });
  void big.finally(() => (settled = true));
  const latencies: number[] = [];
  while (!settled) {
    const t0 = performance.now();
    await (await fetch(`${url}/health`)).json();
    latencies.push(performance.now() - t0);
    await new Promise((r) => setTimeout(r, 20));
  }
  const { status, ms } = await big;
  latencies.sort((a, b) => a - b);
  const r = (x: number): number => Math.round(x * 10) / 10;
  return {
    bodyBytes: body.length,
    status,
    requestMs: Math.round(ms),
    probes: latencies.length,
    healthMs: { p50: r(quantile(latencies, 0.5)), max: r(latencies.at(-1) ?? 0) },
  };
}

async function rssMB(pid: number): Promise<number | null> {
  try {
    const status = await readFile(`/proc/${pid}/status`, "utf8");
    const m = /VmRSS:\s+(\d+) kB/.exec(status);
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

function range(values: number[]): { first: number; last: number; max: number } {
  const r = (x: number): number => Math.round(x * 10) / 10;
  return { first: r(values[0] ?? 0), last: r(values.at(-1) ?? 0), max: r(Math.max(0, ...values)) };
}

/** One streaming request; resolves with its completion tokens and time to first content. */
async function streamOnce(
  url: string,
  maxTokens: number,
  client: number,
): Promise<{ tokens: number; ttftMs: number }> {
  const started = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "demo",
      messages: [
        { role: "system", content: "You are a load test." },
        { role: "user", content: `Client ${client}: say something.` },
      ],
      max_tokens: maxTokens,
      stream: true,
      stream_options: { include_usage: true },
      ignore_eos: true,
    }),
  });
  if (res.status !== 200 || !res.body) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let ttftMs = -1;
  let tokens = 0;
  let buffer = "";
  const decoder = new TextDecoder();
  for await (const bytes of res.body) {
    buffer += decoder.decode(bytes as Uint8Array, { stream: true });
    let end: number;
    while ((end = buffer.indexOf("\n\n")) !== -1) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const chunk = JSON.parse(event.slice(6)) as {
        choices: { delta: { content?: string } }[];
        usage?: { completion_tokens: number } | null;
        error?: { message: string };
      };
      if (chunk.error) throw new Error(chunk.error.message);
      if (ttftMs < 0 && chunk.choices[0]?.delta.content) ttftMs = performance.now() - started;
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
    }
  }
  return { tokens, ttftMs: ttftMs < 0 ? performance.now() - started : ttftMs };
}

export async function runServerLoadBench(
  options: ServerLoadOptions = {},
): Promise<ServerLoadReport> {
  const clients = options.clients ?? 6;
  const seconds = options.seconds ?? 20;
  const maxTokens = options.maxTokens ?? 24;
  const home = await mkdtemp(join(tmpdir(), "redwing-server-load-"));
  const args = ["serve", "--port", "0", "--quiet", "--queue-limit", String(clients)];
  if (options.model) args.push("--model", options.model);
  const child = spawn(join(root, "bin", "redwing"), args, {
    env: { ...process.env, REDWING_HOME: process.env.REDWING_HOME ?? home },
    stdio: ["ignore", "ignore", "pipe"],
  });
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const lines = createInterface({ input: child.stderr });
      lines.on("line", (line) => {
        const m = /at (http:\/\/[^\s]+)\/v1/.exec(line);
        if (m) resolve(m[1]!);
      });
      child.once("exit", (code) => reject(new Error(`redwing serve exited with ${code}`)));
    });
    const health = async (): Promise<{
      engine_pid: number | null;
      metrics: { queueWaitMsTotal: number; queueWaitMsMax: number; requests: number };
    }> => (await fetch(`${url}/health`)).json() as never;

    const serverRss: number[] = [];
    const serviceRss: number[] = [];
    const sample = async (): Promise<void> => {
      const h = await health();
      const a = await rssMB(child.pid!);
      const b = h.engine_pid ? await rssMB(h.engine_pid) : null;
      if (a !== null) serverRss.push(a);
      if (b !== null) serviceRss.push(b);
    };
    await sample();
    const sampler = setInterval(() => void sample(), 1000);

    const deadline = performance.now() + seconds * 1000;
    const ttfts: number[] = [];
    let requests = 0;
    let failures = 0;
    let completionTokens = 0;
    const started = performance.now();
    await Promise.all(
      Array.from({ length: clients }, async (_, c) => {
        while (performance.now() < deadline) {
          try {
            const r = await streamOnce(url, maxTokens, c);
            requests++;
            completionTokens += r.tokens;
            ttfts.push(r.ttftMs);
          } catch (error) {
            failures++;
            console.error(`client ${c}: ${(error as Error).message}`);
          }
        }
      }),
    );
    const elapsed = (performance.now() - started) / 1000;
    clearInterval(sampler);
    await sample();
    const h = await health();
    const bigPrompt = await healthDuringMaxBody(url);
    ttfts.sort((a, b) => a - b);
    const report: ServerLoadReport = {
      clients,
      seconds: Math.round(elapsed * 10) / 10,
      maxTokens,
      requests,
      failures,
      completionTokens,
      tokensPerSecond: Math.round((completionTokens / elapsed) * 10) / 10,
      requestsPerSecond: Math.round((requests / elapsed) * 100) / 100,
      ttftMs: {
        p50: Math.round(quantile(ttfts, 0.5)),
        p95: Math.round(quantile(ttfts, 0.95)),
        max: Math.round(ttfts.at(-1) ?? 0),
      },
      queueWaitMs: {
        mean: Math.round(h.metrics.queueWaitMsTotal / Math.max(1, h.metrics.requests)),
        max: Math.round(h.metrics.queueWaitMsMax),
      },
      serverRssMB: range(serverRss),
      serviceRssMB: range(serviceRss),
      healthDuringMaxBody: bigPrompt,
    };
    console.log(
      `${clients} clients, ${report.seconds} s: ${requests} requests (${failures} failed), ` +
        `${report.tokensPerSecond} tok/s, ${report.requestsPerSecond} req/s; ` +
        `TTFT p50 ${report.ttftMs.p50} ms p95 ${report.ttftMs.p95} ms; ` +
        `queue wait mean ${report.queueWaitMs.mean} ms max ${report.queueWaitMs.max} ms`,
    );
    console.log(
      `RSS MB (first/last/max): server ${Object.values(report.serverRssMB).join("/")}, ` +
        `service ${Object.values(report.serviceRssMB).join("/")}`,
    );
    console.log(
      `/health while one client sends a ${(bigPrompt.bodyBytes / 1048576).toFixed(1)} MiB prompt ` +
        `(answered ${bigPrompt.status} in ${bigPrompt.requestMs} ms): ${bigPrompt.probes} probes, ` +
        `p50 ${bigPrompt.healthMs.p50} ms, max ${bigPrompt.healthMs.max} ms`,
    );
    await writeResult("server-load", report);
    return report;
  } finally {
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
    await rm(home, { recursive: true, force: true });
  }
}

function flag(name: string): number | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i === -1 ? undefined : Number(process.argv[i + 1]);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const i = process.argv.indexOf("--model");
  await runServerLoadBench({
    clients: flag("clients"),
    seconds: flag("seconds"),
    maxTokens: flag("max-tokens"),
    model: i === -1 ? undefined : process.argv[i + 1],
  });
}
