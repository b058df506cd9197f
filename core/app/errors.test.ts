/** Failures as the user sees them, and the engine queue shared by chat, server and loads. */
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { AppErrorSchema } from "./api.ts";
import { EngineCrashError, EngineError } from "../engine/index.ts";
import { UserError } from "../errors.ts";
import { QueueAbortedError, QueueFullError } from "../server/queue.ts";
import { AppFailure, toAppError } from "./errors.ts";
import { EngineQueue } from "../server/queue.ts";

function errno(code: string, message = code): Error {
  return Object.assign(new Error(message), { code });
}

describe("toAppError", () => {
  const cases: [string, unknown, string, string | null][] = [
    [
      "crash",
      new EngineCrashError("killed", null, "SIGKILL", ""),
      "engine_crashed",
      "restart_engine",
    ],
    [
      "closed client",
      new EngineError("closed", "engine_closed"),
      "engine_unavailable",
      "restart_engine",
    ],
    ["no model", new EngineError("no model is loaded", "not_loaded"), "no_model", "load_model"],
    [
      "overflow",
      new EngineError("too long", "context_overflow"),
      "context_overflow",
      "raise_context",
    ],
    [
      "load failed",
      new EngineError("cannot map weights.bin", "load_failed"),
      "load_failed",
      "verify_model",
    ],
    [
      "non-finite logits",
      new EngineError("the logits hold NaN or infinity", "non_finite_logits"),
      "non_finite_logits",
      "verify_model",
    ],
    [
      "corrupt file",
      new UserError("weights.bin in /m is corrupt", "model_corrupt"),
      "model_corrupt",
      "reinstall_model",
    ],
    [
      "missing file",
      new UserError("experts/layer_000.bin is missing", "model_incomplete"),
      "model_incomplete",
      "reinstall_model",
    ],
    ["installer disk full", new UserError("no space left", "no_space"), "disk_full", "free_space"],
    [
      "ENOSPC",
      errno("ENOSPC", "ENOSPC: no space left on device, write"),
      "disk_full",
      "free_space",
    ],
    ["installer network", new UserError("cannot reach the hub", "network"), "network", "retry"],
    [
      "fetch failed",
      Object.assign(new TypeError("fetch failed"), { cause: errno("ECONNREFUSED") }),
      "network",
      "retry",
    ],
    ["busy", new QueueFullError(4), "busy", "retry"],
    ["plain", new UserError("no model named x", "model_not_found"), "model_not_found", null],
    ["bug", new RangeError("oops"), "internal", null],
  ];
  it.each(cases)("%s", (_name, error, code, action) => {
    const e = toAppError(error);
    expect(AppErrorSchema.parse(e)).toEqual(e);
    expect(e.code).toBe(code);
    expect(e.action).toBe(action);
    // Plain words: a sentence, capitalized, ending with a full stop.
    expect(e.message).toMatch(/^[A-Z"].*[.)]$/s);
  });

  it("reads a stored reply's old reduce_context as raise_context (its text said to raise it)", () => {
    const stored = {
      code: "context_overflow",
      message: "raise the context",
      action: "reduce_context",
    };
    expect(AppErrorSchema.parse(stored).action).toBe("raise_context");
  });

  it("passes AppFailures through and names zod's complaint", () => {
    const f = new AppFailure("model_exists", "A model named x is already installed.");
    expect(toAppError(f)).toEqual({
      code: "model_exists",
      message: "A model named x is already installed.",
      action: null,
    });
    const zod = z.object({ port: z.number() }).safeParse({ port: "x" });
    expect(toAppError(zod.error).message).toMatch(/^Invalid port:/);
  });
});

describe("EngineQueue", () => {
  it("gives turns in order, knows who generates, bounds only server requests", async () => {
    const q = new EngineQueue(1);
    const seen: (string | null)[] = [];
    q.onChange = (h) => seen.push(h);
    const load = await q.acquire(undefined, { kind: "exclusive" });
    expect(q.active).toBe(true);
    expect(q.generating).toBe(false);
    const order: string[] = [];
    const chat = q.acquire(undefined, { unbounded: true }).then((r) => (order.push("chat"), r));
    const api = q.acquire().then((r) => (order.push("api"), r)); // fills the one waiting place
    await expect(q.acquire()).rejects.toBeInstanceOf(QueueFullError);
    const more = q.acquire(undefined, { unbounded: true }); // the app's own turns always wait
    const aborted = new AbortController();
    const leaving = q.acquire(aborted.signal, { unbounded: true });
    aborted.abort();
    await expect(leaving).rejects.toBeInstanceOf(QueueAbortedError);
    load();
    const releaseChat = await chat;
    expect(q.generating).toBe(true);
    releaseChat();
    (await api)();
    (await more)();
    expect(order).toEqual(["chat", "api"]);
    expect(q.active).toBe(false);
    expect(seen).toEqual(["exclusive", "generate", null]);
  });
});
