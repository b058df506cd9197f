/**
 * loadAll against events that overtake its calls' answers: events and answers travel on
 * different channels, so an answer made before an event can arrive after it (the races seen in
 * the e2e suite with two workers: the status stuck at "loading 90%" after the engine was ready,
 * no Unload button on the model that had just loaded).
 */
import { describe, expect, it } from "vitest";
import {
  DEFAULT_SETTINGS,
  type AppEvent,
  type EngineStatus,
  type InstalledModel,
} from "../../../core/app/api.ts";
import { runningDownload } from "../../../testkit/download.ts";
import type { RendererClient } from "../api/types.ts";
import { Store } from "./context.tsx";
import { loadAll } from "./load.ts";

const loading: EngineStatus = {
  state: "loading",
  model: "demo",
  pid: 42,
  loadFraction: 0.9,
  loadedWith: null,
  expertCacheSlots: null,
  reloadNeeded: false,
  memory: null,
  error: null,
};
const ready: EngineStatus = {
  ...loading,
  state: "ready",
  loadFraction: null,
  loadedWith: DEFAULT_SETTINGS.engine,
  expertCacheSlots: 0,
};

function model(loaded: boolean): InstalledModel {
  return {
    name: "demo",
    dir: "/models/demo",
    sizeBytes: 1,
    memoryEstimateBytes: 1,
    family: "gemma4",
    moe: true,
    isDemo: true,
    verify: { state: "ok" },
    loaded,
  };
}

/** Answers the other calls at once; `held` ones wait until the test answers them. */
function fakeClient(held: string[]): {
  client: RendererClient;
  answer(method: string, value: unknown): void;
} {
  const waiting = new Map<string, (value: unknown) => void>();
  const immediate: Record<string, unknown> = {
    "app.info": {},
    "settings.get": DEFAULT_SETTINGS,
    "engine.status": loading,
    "models.list": [model(false)],
    "models.catalog": [],
    "models.downloads": [],
    "server.status": { running: false },
    "live.history": [],
    "connections.list": [],
    "chat.list": [],
  };
  const client = {
    shell: "mock",
    call: (method: string) =>
      held.includes(method)
        ? new Promise((resolve) => waiting.set(method, resolve))
        : Promise.resolve(immediate[method]),
    subscribe: () => () => {},
    onConnection: () => () => {},
  } as unknown as RendererClient;
  return {
    client,
    answer(method, value) {
      const resolve = waiting.get(method);
      if (!resolve) throw new Error(`${method} was not called`);
      resolve(value);
    },
  };
}

function event(store: Store, e: AppEvent): void {
  store.dispatch({ type: "event", event: e });
}

/** Lets loadAll make its calls (it starts them synchronously, but be safe). */
const tick = () => new Promise((r) => setTimeout(r, 0));

describe("loadAll and events that overtake its answers", () => {
  it("an engine.status answered while loading does not undo the ready event that came first", async () => {
    const store = new Store();
    const { client, answer } = fakeClient(["engine.status"]);
    const done = loadAll(client, store, () => {});
    await tick();
    event(store, { type: "engine", status: ready });
    answer("engine.status", loading);
    await done;
    expect(store.getState().engine).toEqual(ready);
  });

  it("a models.list made before the load does not hide the loaded model the event shows", async () => {
    const store = new Store();
    const { client, answer } = fakeClient(["models.list"]);
    const done = loadAll(client, store, () => {});
    await tick();
    event(store, { type: "models", models: [model(true)] });
    answer("models.list", [model(false)]);
    await done;
    expect(store.getState().models?.[0]?.loaded).toBe(true);
  });

  it("a download's progress from events is not set back by an older list", async () => {
    const store = new Store();
    const { client, answer } = fakeClient(["models.downloads"]);
    const done = loadAll(client, store, () => {});
    await tick();
    event(store, { type: "download", download: runningDownload("t1", { bytesDone: 80 }) });
    answer("models.downloads", [runningDownload("t1", { bytesDone: 10 })]);
    await done;
    expect(store.getState().downloads.map((d) => d.bytesDone)).toEqual([80]);
  });

  it("answers apply when no event came meanwhile, also over state from before the call", async () => {
    const store = new Store();
    event(store, { type: "engine", status: loading });
    const { client, answer } = fakeClient(["engine.status", "models.list"]);
    const done = loadAll(client, store, () => {});
    await tick();
    answer("engine.status", ready);
    answer("models.list", [model(true)]);
    await done;
    expect(store.getState().engine).toEqual(ready);
    expect(store.getState().models?.[0]?.loaded).toBe(true);
  });
});
