/**
 * Per-token cost of the decode-service protocol: the same model and tokens decoded in-process
 * (`redwing-engine generate`, its decode_seconds) and through the service, streamed token by
 * token to this process via EngineClient (wall time from the first to the last token event as
 * the client sees them). Both stop at "length" after the same number of tokens.
 *
 *   npx tsx bench/protocol-overhead.ts MODEL_DIR [--tokens 2,17,99] [--max-new N]
 *                                      [--threads N] [--repeats R]
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { nativeBinary } from "../core/native.ts";
import { EngineClient } from "../core/engine/client.ts";
import { greedyGenerateArgs } from "./generate-report.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    tokens: { type: "string", default: "492,444,488,437,31,49,46,187" },
    "max-new": { type: "string", default: "390" },
    threads: { type: "string", default: "2" },
    repeats: { type: "string", default: "7" },
  },
});
const model = positionals[0];
if (!model) throw new Error("usage: protocol-overhead.ts MODEL_DIR [options]");
const tokens = values.tokens.split(",").map(Number);
const maxNew = Number(values["max-new"]);
const threads = Number(values.threads);
const repeats = Number(values.repeats);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

function inProcessRun(): number {
  const out = spawnSync(
    nativeBinary("redwing-engine"),
    [...greedyGenerateArgs(model!, tokens, maxNew), "--threads", String(threads)],
    { encoding: "utf8" },
  );
  if (out.status !== 0) throw new Error(out.stderr);
  const result = JSON.parse(out.stdout) as {
    tokens: number[];
    stop_reason: string;
    decode_seconds: number;
  };
  if (result.stop_reason !== "length")
    throw new Error("in-process run hit EOS: use a larger --max-new budget");
  return result.decode_seconds / (result.tokens.length - 1);
}

/** Seconds per token as the client sees them (first to last token), and the service's own. */
async function serviceRun(client: EngineClient, stream: boolean): Promise<[number, number]> {
  let first = 0;
  let last = 0;
  let count = 0;
  let own = 0;
  const started = performance.now();
  for await (const event of client.generate({
    tokens,
    max_new_tokens: maxNew,
    sampling: { temperature: 0 },
    stats_interval_ms: 0,
    stream,
  })) {
    if (event.type === "tokens") {
      last = performance.now();
      if (count === 0) first = last;
      count += event.tokens.length;
    } else if (event.type === "finished") {
      if (event.reason !== "length") throw new Error(`service run ended with ${event.reason}`);
      own = event.timings!.decode_seconds / (event.tokens.length - 1);
      if (!stream) {
        // Without token events: the whole request, minus the service's prefill time.
        const total = (performance.now() - started) / 1000 - event.timings!.prefill_seconds;
        return [total / (event.tokens.length - 1), own];
      }
    }
  }
  return [(last - first) / 1000 / (count - 1), own];
}

const home = mkdtempSync(join(tmpdir(), "redwing-overhead-"));
const client = await EngineClient.start({ env: { ...process.env, REDWING_HOME: home } });
const inProcess: number[] = [];
const streamed: number[] = [];
const serviceSide: number[] = [];
const unstreamed: number[] = [];
try {
  await client.load({ model, context: tokens.length + maxNew + 8, threads });
  // Interleaved, so that load from other processes hits every variant alike.
  for (let r = 0; r < repeats; r++) {
    inProcess.push(inProcessRun());
    const [viaClient, own] = await serviceRun(client, true);
    streamed.push(viaClient);
    serviceSide.push(own);
    unstreamed.push((await serviceRun(client, false))[0]);
  }
} finally {
  await client.close();
  rmSync(home, { recursive: true, force: true });
}

const us = (s: number) => `${(s * 1e6).toFixed(1)} us`;
const min = (xs: number[]) => Math.min(...xs);
const row = (name: string, xs: number[]) =>
  console.log(`${name.padEnd(44)} median ${us(median(xs))}/token, min ${us(min(xs))}/token`);
console.log(`model ${model}, ${maxNew} tokens, ${threads} threads, ${repeats} interleaved repeats`);
row("in-process decode (redwing-engine)", inProcess);
row("service, own decode time (events included)", serviceSide);
row("service -> client, one event per token", streamed);
row("service -> client, stream: false", unstreamed);
console.log(
  `protocol overhead per token (streamed - in-process): median ${us(median(streamed) - median(inProcess))}, min ${us(min(streamed) - min(inProcess))}`,
);
