import { describe, expect, it } from "vitest";
import {
  AppEventSchema,
  DEFAULT_SETTINGS,
  SERVER_OFF,
  type AppBackend,
  type AppEvent,
  type EngineStatus,
  type Method,
} from "../core/app/api.ts";
import { AppFailure } from "../core/app/errors.ts";
import { UserError } from "../core/errors.ts";
import { EventPump, closeWithin, handleCall, snapshotEvents } from "./ipc.ts";

const APP = "app://redwing/index.html";

const engine: EngineStatus = {
  state: "ready",
  model: "demo",
  pid: 42,
  loadFraction: null,
  loadedWith: DEFAULT_SETTINGS.engine,
  expertCacheSlots: null,
  reloadNeeded: true,
  memory: null,
  error: null,
};

/** A backend answering fixed results, recording calls, and publishing events on demand. */
class FakeBackend implements AppBackend {
  calls: Array<[string, unknown]> = [];
  listeners = new Set<(event: AppEvent) => void>();
  gate: Promise<void> = Promise.resolve();

  async call(method: Method, params: unknown): Promise<never> {
    this.calls.push([method, params]);
    await this.gate;
    const results: Partial<Record<Method, unknown>> = {
      "settings.get": DEFAULT_SETTINGS,
      "models.list": [],
      "engine.status": engine,
      "server.status": SERVER_OFF,
      "chat.list": [
        { id: "c1", title: "Hi", updatedAt: "2025-01-01", messageCount: 2, pinned: false },
      ],
      "models.downloads": [],
      "chat.delete": { ok: true },
    };
    if (method === "models.remove") throw new UserError("no model named x", "model_not_found");
    if (method === "engine.reload") throw new Error("boom");
    if (method === "engine.load") {
      throw new AppFailure("engine_crashed", "The engine stopped.", "restart_engine");
    }
    return results[method] as never;
  }
  subscribe(listener: (event: AppEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
  emit(event: AppEvent): void {
    for (const l of this.listeners) l(event);
  }
}

describe("handleCall", () => {
  it("passes a valid call from the app to the backend with parsed params", async () => {
    const backend = new FakeBackend();
    const outcome = await handleCall(backend, "chat.delete", { id: "c1" }, APP);
    expect(outcome).toEqual({ ok: true, result: { ok: true } });
    expect(backend.calls).toEqual([["chat.delete", { id: "c1" }]]);
    // Missing params count as {} for calls without params.
    await handleCall(backend, "settings.get", undefined, APP);
    expect(backend.calls[1]).toEqual(["settings.get", {}]);
  });

  it("refuses other senders before looking at the call", async () => {
    const backend = new FakeBackend();
    for (const sender of [null, "https://example.com/", "file:///x/index.html"]) {
      const outcome = await handleCall(backend, "chat.delete", { id: "c1" }, sender);
      expect(outcome).toMatchObject({ ok: false, error: { code: "forbidden" } });
    }
    expect(backend.calls).toEqual([]);
  });

  it("rejects unknown methods and bad params with the schema's reason", async () => {
    const backend = new FakeBackend();
    expect(await handleCall(backend, "fs.readFile", {}, APP)).toMatchObject({
      ok: false,
      error: { code: "unknown_method" },
    });
    expect(await handleCall(backend, "__proto__", {}, APP)).toMatchObject({
      ok: false,
      error: { code: "unknown_method" },
    });
    expect(await handleCall(backend, 7, {}, APP)).toMatchObject({
      ok: false,
      error: { code: "bad_request" },
    });
    const bad = await handleCall(backend, "models.remove", { name: "../../etc" }, APP);
    expect(bad).toMatchObject({ ok: false, error: { code: "bad_request" } });
    const extra = await handleCall(backend, "chat.delete", { id: "c1", evil: true }, APP);
    expect(extra).toMatchObject({ ok: false, error: { code: "bad_request" } });
    expect(backend.calls).toEqual([]);
  });

  it("answers backend failures as AppErrors instead of throwing", async () => {
    const backend = new FakeBackend();
    expect(await handleCall(backend, "models.remove", { name: "x" }, APP)).toEqual({
      ok: false,
      error: { code: "model_not_found", message: "No model named x.", action: null },
    });
    const internal = await handleCall(backend, "engine.reload", {}, APP);
    expect(internal.ok).toBe(false);
    if (!internal.ok) expect(internal.error).toMatchObject({ code: "internal", message: /boom/i });
    // A failure that knows its next step keeps it (the renderer shows that button).
    expect(await handleCall(backend, "engine.load", {}, APP)).toMatchObject({
      ok: false,
      error: { code: "engine_crashed", action: "restart_engine" },
    });
  });
});

describe("events", () => {
  it("snapshots the state as valid events in web mode's order", async () => {
    const events = await snapshotEvents(new FakeBackend());
    expect(events.map((e) => e.type)).toEqual([
      "settings",
      "models",
      "engine",
      "server",
      "conversations",
    ]);
    for (const event of events) expect(AppEventSchema.safeParse(event).success).toBe(true);
    expect(events[0]).toMatchObject({ type: "settings", reloadNeeded: true });
  });

  it("forwards live events, and on resync sends the snapshot before events raised meanwhile", async () => {
    const backend = new FakeBackend();
    const sent: string[] = [];
    const pump = new EventPump(backend, (e) => sent.push(e.type));
    const live: AppEvent = { type: "engine", status: { ...engine, state: "generating" } };
    backend.emit(live);
    expect(sent).toEqual(["engine"]);

    let open!: () => void;
    backend.gate = new Promise((r) => (open = r));
    const resync = pump.resync();
    void pump.resync(); // a second request while the first gathers adds nothing
    backend.emit({
      type: "server",
      status: { ...SERVER_OFF, running: true },
    });
    expect(sent).toEqual(["engine"]); // held back
    open();
    await resync;
    expect(sent).toEqual([
      "engine",
      "settings",
      "models",
      "engine",
      "server",
      "conversations",
      "server",
    ]);

    pump.close();
    backend.emit(live);
    expect(sent).toHaveLength(7);
    expect(backend.listeners.size).toBe(0);
  });
});

describe("closeWithin", () => {
  it("reports closed, failed, or timeout without hanging", async () => {
    expect(await closeWithin(async () => {}, 1000)).toBe("closed");
    expect(await closeWithin(() => Promise.reject(new Error("x")), 1000)).toBe("failed");
    const started = Date.now();
    expect(await closeWithin(() => new Promise(() => {}), 50)).toBe("timeout");
    expect(Date.now() - started).toBeLessThan(1000);
  });
});
