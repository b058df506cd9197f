// The memory-limited case of `npm run bench -- vs-llama-cpp --memory-limit` (bench/memory-limit.ts,
// bench/vs-llama-cpp-memory.ts): how a run's end is read (the kernel's OOM kill against a crash),
// what llama-run.mjs printed however far it got, the rows and the table. The 30-layer model is not
// run here; where the test runs as root with a writable memory cgroup, a real child is killed by a
// real limit.
import { describe, expect, it } from "vitest";
import {
  describeOutcome,
  memoryLimiter,
  oomKillCount,
  runChild,
  runOutcome,
} from "../bench/memory-limit.ts";
import {
  formatLimitedTable,
  llamaRow,
  parseLlamaRun,
  rateRatio,
  redwingRow,
  type LimitedResult,
} from "../bench/vs-llama-cpp-memory.ts";

const V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
const V2_EVENTS = "low 0\nhigh 0\nmax 2031\noom 1\noom_kill 1\noom_group_kill 0\n";
const exitOf = (over: Partial<Parameters<typeof runOutcome>[0]>) => ({
  code: null,
  signal: null,
  stderrTail: "",
  timedOut: false,
  ...over,
});

describe("reading a memory group's OOM kills", () => {
  it("finds oom_kill in v1 memory.oom_control and v2 memory.events", () => {
    expect(oomKillCount(V1_OOM_CONTROL)).toBe(1);
    expect(oomKillCount(V2_EVENTS)).toBe(1);
    expect(oomKillCount("oom_kill_disable 0\nunder_oom 0\noom_kill 3")).toBe(3);
  });

  it("says null where the kernel does not count them (before 4.13)", () => {
    expect(oomKillCount("oom_kill_disable 0\nunder_oom 0\n")).toBeNull();
    expect(oomKillCount("")).toBeNull();
  });
});

describe("how a run under the limit ended", () => {
  it("is the limit's doing only when killed by SIGKILL and the group did not count zero kills", () => {
    expect(runOutcome(exitOf({ code: 0 }), 0)).toEqual({ kind: "ok" });
    expect(runOutcome(exitOf({ signal: "SIGKILL" }), 1)).toEqual({
      kind: "memory-limit",
      confirmed: true,
    });
    // A shell that did not exec reports the kill as 137.
    expect(runOutcome(exitOf({ code: 137 }), 2)).toEqual({ kind: "memory-limit", confirmed: true });
    // No count to read (systemd-run, no limit): most likely the limit, said so.
    expect(runOutcome(exitOf({ signal: "SIGKILL" }), null)).toEqual({
      kind: "memory-limit",
      confirmed: false,
    });
    // Killed, but not by the limit: a failure, not an OOM kill.
    expect(runOutcome(exitOf({ signal: "SIGKILL" }), 0).kind).toBe("failed");
    expect(runOutcome(exitOf({ signal: "SIGSEGV" }), 0)).toEqual({
      kind: "failed",
      detail: "killed by SIGSEGV",
    });
  });

  it("names a failure by its exit and the last line it wrote", () => {
    expect(
      runOutcome(exitOf({ code: 1, stderrTail: "loading\nerror: no such file\n" }), 0),
    ).toEqual({ kind: "failed", detail: "exit 1: error: no such file" });
    expect(runOutcome(exitOf({ signal: "SIGKILL", timedOut: true }), 0)).toEqual({
      kind: "failed",
      detail: "stopped: it ran past its time limit",
    });
  });

  it("reads as words for the table", () => {
    expect(describeOutcome({ kind: "memory-limit", confirmed: true }, "loading")).toBe(
      "killed by the memory limit while loading",
    );
    expect(describeOutcome({ kind: "memory-limit", confirmed: false })).toBe(
      "killed by the memory limit (SIGKILL; the group's OOM count is not readable)",
    );
    expect(describeOutcome({ kind: "ok" })).toBe("ran");
  });
});

describe("running a child to its end", () => {
  it("returns a child killed by SIGKILL instead of throwing", async () => {
    const exit = await runChild([
      process.execPath,
      "-e",
      "console.log('before'); process.kill(process.pid, 'SIGKILL')",
    ]);
    expect(exit).toMatchObject({ code: null, signal: "SIGKILL", timedOut: false });
    expect(exit.stdout).toBe("before\n");
    expect(runOutcome(exit, null).kind).toBe("memory-limit");
  });

  it("stops a child that runs past its time limit", async () => {
    const exit = await runChild([process.execPath, "-e", "setTimeout(() => {}, 60_000)"], {
      timeoutMs: 300,
    });
    expect(exit.timedOut).toBe(true);
    expect(runOutcome(exit, 0).kind).toBe("failed");
  });

  const root = process.getuid?.() === 0;
  it.skipIf(!root)(
    "under a real memory group, a child that outgrows it is killed and counted (root with a writable memory cgroup)",
    async (context) => {
      const limit = 96 * 2 ** 20;
      const limiter = memoryLimiter(limit);
      try {
        if (!limiter.how.startsWith("cgroup")) context.skip();
        // Touches 16 MiB at a time, up to 1 GiB: far past the limit.
        const grow =
          "const held = []; for (let i = 0; i < 64; i++) held.push(Buffer.alloc(1 << 24).fill(1)); console.log('done')";
        const exit = await runChild(limiter.wrap([process.execPath, "-e", grow]), {
          timeoutMs: 30_000,
        });
        const kills = limiter.oomKills();
        expect(exit.stdout).not.toContain("done");
        expect(runOutcome(exit, kills)).toEqual({
          kind: "memory-limit",
          confirmed: kills !== null,
        });
        if (kills !== null) expect(kills).toBeGreaterThanOrEqual(1);
        const peak = limiter.peakBytes();
        if (peak !== null) {
          expect(peak).toBeGreaterThan(limit / 2);
          expect(peak).toBeLessThanOrEqual(limit);
        }
      } finally {
        limiter.dispose();
      }
    },
  );
});

const BUFFER_LINES = [
  JSON.stringify({ event: "model_buffer", type: "CPU_Mapped", mib: 1500.5 }),
  JSON.stringify({ event: "model_buffer", type: "CPU_REPACK", mib: 12000 }),
  JSON.stringify({ event: "model_buffer", type: "CPU_Mapped", mib: 100 }),
];
const LLAMA_REPORT = {
  engine: "llama.cpp",
  system_info: "AVX512 = 1",
  load_seconds: 4.5,
  prompt_tokens: 16,
  prefill_seconds: 40,
  decode_tokens: 8,
  decode_seconds: 64,
  peak_rss_bytes: 3.4 * 2 ** 30,
  prefill_read_bytes: 20e9,
  decode_read_bytes: 72e9,
  model_buffers_mib: { CPU_Mapped: 14000 },
};

describe("what llama-run.mjs printed", () => {
  it("a run killed while loading: its buffers, not loaded, no report", () => {
    // The kill can cut the last line short.
    const out = [...BUFFER_LINES, '{"event":"mod'].join("\n");
    const r = parseLlamaRun(out);
    expect(r).toEqual({
      loaded: false,
      buffersMib: { CPU_Mapped: 1600.5, CPU_REPACK: 12000 },
      report: null,
    });
    const row = llamaRow(
      "llama.cpp default",
      { ...exitOf({ signal: "SIGKILL" }), stdout: out },
      1,
      3.5 * 2 ** 30,
    );
    expect(row.outcome).toBe("killed by the memory limit while loading");
    expect(row.decode_tok_s).toBeNull();
    expect(row.prefill_tok_s).toBeNull();
    expect(row.group_peak_bytes).toBe(3.5 * 2 ** 30);
    expect(row.model_buffers_mib).toEqual({ CPU_Mapped: 1600.5, CPU_REPACK: 12000 });
  });

  it("a run killed after loading says so", () => {
    const out = [BUFFER_LINES[0], JSON.stringify({ event: "loaded", load_seconds: 3 })].join("\n");
    expect(parseLlamaRun(out).loaded).toBe(true);
    const row = llamaRow("x", { ...exitOf({ signal: "SIGKILL" }), stdout: out }, 1, null);
    expect(row.outcome).toBe("killed by the memory limit while running");
  });

  it("a run to the end: rates, reads per decode token, peak RSS", () => {
    const out = [
      BUFFER_LINES[0],
      JSON.stringify({ event: "loaded", load_seconds: 4.5 }),
      JSON.stringify(LLAMA_REPORT),
      "",
    ].join("\n");
    expect(parseLlamaRun(out).report).toMatchObject({ decode_tokens: 8, decode_read_bytes: 72e9 });
    const row = llamaRow("mapped", { ...exitOf({ code: 0 }), stdout: out }, 0, 3.4e9);
    expect(row.outcome).toBe("ran");
    expect(row.decode_tok_s).toBeCloseTo(8 / 64, 10);
    expect(row.prefill_tok_s).toBeCloseTo(16 / 40, 10);
    expect(row.decode_read_bytes_per_token).toBe(9e9);
    expect(row.peak_rss_bytes).toBe(LLAMA_REPORT.peak_rss_bytes);
  });

  it("a clean exit without a report is a failure, not a row of numbers", () => {
    const row = llamaRow("x", { ...exitOf({ code: 0 }), stdout: BUFFER_LINES[0]! }, 0, null);
    expect(row.outcome).toBe("failed (no report)");
    expect(row.decode_tok_s).toBeNull();
  });
});

/** A `redwing-engine generate` report with the fields the row reads; the rest zero. */
function generateReport(over: Record<string, unknown>) {
  const stat = {
    hits: 0,
    gpu_hits: 0,
    misses: 0,
    bytes_read: 0,
    gpu_copy_bytes: 0,
    cpu_experts: 0,
    cpu_expert_ms: 0,
    io_wait_ms: 0,
    compute_ms: 0,
  };
  return JSON.stringify({
    tokens: [1, 2, 3, 4, 5, 6, 7, 8, 9],
    stop_reason: "length",
    prompt_tokens: 16,
    prefill_seconds: 2,
    decode_seconds: 4,
    expert_cache_slots: 21,
    gpu_expert_slots: 0,
    direct_io: true,
    peak_rss_bytes: 3.2 * 2 ** 30,
    device_memory_bytes: 0,
    decode_hit_rate: 0.5,
    decode_gpu_hit_rate: 0,
    decode_ram_hit_rate: 0.5,
    decode_bytes_read_per_token: 400e6,
    decode_gpu_copy_bytes_per_token: 0,
    decode_io_wait_ms_per_token: 300,
    gpu_misses: "copy",
    gpu_expert_copies: -1,
    decode_cpu_experts_per_token: 0,
    decode_cpu_expert_ms_per_token: 0,
    decode_parts_ms_per_token: { experts: 400 },
    token_stats: [stat, stat],
    backend: "cpu",
    device: "cpu",
    prefill_submissions: 0,
    prefill_dispatches: 0,
    decode_submissions_per_token: 0,
    decode_dispatches_per_token: 0,
    decode_barriers_per_token: 0,
    kernel_times: [],
    ...over,
  });
}

describe("Redwing's row", () => {
  it("takes rates, slots and reads from the engine's report", () => {
    const row = redwingRow(
      "Redwing",
      { ...exitOf({ code: 0 }), stdout: generateReport({}) },
      0,
      3.4e9,
      20,
    );
    expect(row).toMatchObject({
      outcome: "ran",
      slots: 21, // what the run used, not the plan's guess
      peak_rss_bytes: 3.2 * 2 ** 30,
      decode_read_bytes_per_token: 400e6,
      group_peak_bytes: 3.4e9,
    });
    expect(row.decode_tok_s).toBeCloseTo(8 / 4, 10);
    expect(row.prefill_tok_s).toBeCloseTo(16 / 2, 10);
  });

  it("a Redwing killed by the limit keeps the planned slots and no rates", () => {
    const row = redwingRow(
      "Redwing",
      { ...exitOf({ signal: "SIGKILL" }), stdout: "" },
      1,
      null,
      20,
    );
    expect(row).toMatchObject({
      outcome: "killed by the memory limit",
      slots: 20,
      decode_tok_s: null,
    });
  });
});

describe("the memory-limited table", () => {
  const base: LimitedResult = {
    date: "2026-12-02T07:40:00.000Z",
    model: "synthetic gemma-4-26b-a4b, 30 of 30 layers",
    memory_limit_bytes: 3.5 * 2 ** 30,
    memory_limit_how: "cgroup v1 memory.limit_in_bytes",
    page_cache_dropped: true,
    threads: 2,
    prompt_tokens: 16,
    decode_tokens: 8,
    load_average_before: [2.5, 2.1, 2],
    load_average_after: [3.04, 2.5, 2.1],
    rows: [
      {
        engine: "llama.cpp, as it runs by default",
        outcome: "killed by the memory limit while loading",
        decode_tok_s: null,
        prefill_tok_s: null,
        peak_rss_bytes: null,
        group_peak_bytes: 3.5 * 2 ** 30,
        decode_read_bytes_per_token: null,
        slots: null,
        model_buffers_mib: { CPU_REPACK: 12288, CPU_Mapped: 1024 },
      },
      {
        engine: "llama.cpp, mapped file, no repacking",
        outcome: "ran",
        decode_tok_s: 0.125,
        prefill_tok_s: 0.4,
        peak_rss_bytes: 3 * 2 ** 30,
        group_peak_bytes: 3.5 * 2 ** 30,
        decode_read_bytes_per_token: 9 * 2 ** 30,
        slots: null,
        model_buffers_mib: { CPU_Mapped: 13312 },
      },
      {
        engine: "Redwing, --memory-budget 3.50 GiB",
        outcome: "ran",
        decode_tok_s: 2,
        prefill_tok_s: 8,
        peak_rss_bytes: 3.2 * 2 ** 30,
        group_peak_bytes: 3.3 * 2 ** 30,
        decode_read_bytes_per_token: 400 * 2 ** 20,
        slots: 21,
        model_buffers_mib: null,
      },
    ],
    decode_ratio: rateRatio(2, 0.125),
    prefill_ratio: rateRatio(8, 0.4),
  };

  it("prints each engine's outcome, rates, memory and reads, then the ratio", () => {
    const lines = formatLimitedTable(base);
    expect(lines[0]).toContain(
      "Under a memory limit of 3.50 GiB (cgroup v1 memory.limit_in_bytes)",
    );
    expect(lines[0]).toContain("16-token prompt, 8 decode tokens, 2 threads");
    expect(lines[0]).toContain("load average 2.5 2.1 2.0 before, 3.0 2.5 2.1 after");
    expect(lines[1]).toBe("Page cache dropped before each run.");
    expect(lines).toContain(
      "| llama.cpp, as it runs by default | killed by the memory limit while loading | - | - | - | 3.50 GiB | - |",
    );
    expect(lines).toContain(
      "| llama.cpp, mapped file, no repacking | ran | 0.13 | 0.40 | 3.00 GiB | 3.50 GiB | 9.00 GiB |",
    );
    expect(lines).toContain(
      "| Redwing, --memory-budget 3.50 GiB (21 slots) | ran | 2.00 | 8.00 | 3.20 GiB | 3.30 GiB | 400.0 MiB |",
    );
    expect(lines).toContain(
      "llama.cpp, as it runs by default: model buffers CPU_REPACK 12.00 GiB, CPU_Mapped 1.00 GiB",
    );
    expect(lines.at(-1)).toBe(
      "Redwing / llama.cpp (mapped, no repacking): decode 16.0x, prefill 20.0x",
    );
  });

  it("says when the cache could not be dropped and when there is no ratio", () => {
    const lines = formatLimitedTable({
      ...base,
      page_cache_dropped: false,
      decode_ratio: rateRatio(2, null),
      prefill_ratio: null,
    });
    expect(lines[1]).toContain("could NOT be dropped");
    expect(lines.at(-1)).toBe(
      "Redwing / llama.cpp (mapped, no repacking): - (one of them did not run)",
    );
  });
});
