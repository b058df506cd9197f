/**
 * A fake backend for developing the UI without the engine: `vite` dev server, `/?mock`. Only
 * reachable from dev builds (client.ts imports it behind `import.meta.env.DEV`). Streams canned
 * replies, simulates downloads, verify and live samples. Send "/crash" to see the engine-crash
 * path, "/fail" for a failed reply; `?mock&long` seeds a 400-message conversation.
 */
import {
  AppCallError,
  curlExample,
  DEFAULT_SETTINGS,
  effectiveGpuMisses,
  effectiveVramBudget,
  parseCall,
  SERVER_OFF,
  type AppError,
  type AppEvent,
  type CatalogItem,
  type Conversation,
  type Download,
  type EngineStatus,
  type InstalledModel,
  type LiveSample,
  type MemoryPlan,
  type ModelSearch,
  type Message,
  type Method,
  type Result,
  type ServerStatus,
  type Settings,
} from "../../../core/app/api.ts";
import type { RendererClient } from "./types.ts";

const GB = 1e9;
const TOTAL = 24 * GB;

/** The loaded demo model's memory, at start and after every load. */
const DEMO_MEMORY: NonNullable<EngineStatus["memory"]> = {
  modelBytes: 48_300_000,
  weightsBytes: 45_000_000,
  kvBytes: 33_000_000,
  expertCacheBytes: 0,
  workBytes: 14_000_000,
  estimateBytes: 92_000_000,
  rssBytes: 85_000_000,
};

const REPLY = `Here is a short answer with some **markdown**.

1. Lists work
2. So do \`inline code\` and [links](https://example.com)

\`\`\`python
def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
\`\`\`

| Setting | Value |
| --- | --- |
| temperature | 0.2 |
| top-k | 64 |

That's all.`;

function now(): string {
  return new Date().toISOString();
}

export function createMockClient(): RendererClient {
  const listeners = new Set<(e: AppEvent) => void>();
  const emit = (event: AppEvent) => {
    for (const l of listeners) l(event);
  };
  let seq = 1;
  const newId = (p: string) => `${p}${Date.now().toString(36)}${(seq++).toString(36)}`;

  let settings: Settings = structuredClone(DEFAULT_SETTINGS);
  let loadedWith = structuredClone(settings.engine);
  const reloadNeeded = () => JSON.stringify(loadedWith) !== JSON.stringify(settings.engine);

  const models: InstalledModel[] = [
    {
      name: "demo",
      dir: "/home/user/.redwing/models/demo",
      sizeBytes: 48_300_000,
      memoryEstimateBytes: 92_000_000,
      family: "gemma3",
      moe: false,
      isDemo: true,
      verify: { state: "ok", checkedAt: now() },
      loaded: true,
    },
  ];
  const catalog = (): CatalogItem[] => [
    {
      id: "demo",
      title: "Demo model",
      description: "A tiny synthetic model that ships with Redwing, for trying the app.",
      kind: "demo",
      repo: null,
      downloadBytes: null,
      installBytes: 48_300_000,
      memoryBytes: 92_000_000,
      memoryNote: "Fits anywhere.",
      fits: true,
      licence: {
        name: "Apache-2.0",
        url: "https://www.apache.org/licenses/LICENSE-2.0",
        gated: false,
        note: "",
      },
      installedAs: models.some((m) => m.name === "demo") ? "demo" : null,
    },
    {
      id: "gemma-4-26b-a4b",
      title: "Gemma 4 26B-A4B (MoE)",
      description:
        "Mixture of experts: 26B parameters, about 4B active per token. Streams experts from disk.",
      kind: "hub",
      repo: "mlx-community/gemma-4-26b-a4b-it-4bit",
      downloadBytes: 15.6 * GB,
      installBytes: 15.9 * GB,
      memoryBytes: 6.1 * GB + settings.engine.context * 40_000,
      memoryNote: `With ${settings.engine.expertCacheSlots} expert slots per layer.`,
      fits: true,
      licence: {
        name: "Gemma Terms of Use",
        url: "https://ai.google.dev/gemma/terms",
        gated: true,
        note: "Accept the terms on Hugging Face first.",
      },
      installedAs: models.some((m) => m.name === "gemma-4-26b-a4b") ? "gemma-4-26b-a4b" : null,
    },
    {
      id: "gemma-3-1b",
      title: "Gemma 3 1B",
      description: "Small dense model: quick on any machine.",
      kind: "hub",
      repo: "mlx-community/gemma-3-1b-it-4bit",
      downloadBytes: 0.73 * GB,
      installBytes: 0.75 * GB,
      memoryBytes: 1.1 * GB,
      memoryNote: "",
      fits: true,
      licence: {
        name: "Gemma Terms of Use",
        url: "https://ai.google.dev/gemma/terms",
        gated: true,
        note: "",
      },
      installedAs: models.some((m) => m.name === "gemma-3-1b") ? "gemma-3-1b" : null,
    },
  ];

  let engine: EngineStatus = {
    state: "ready",
    model: "demo",
    pid: 4242,
    loadFraction: null,
    loadedWith,
    expertCacheSlots: null,
    reloadNeeded: false,
    memory: DEMO_MEMORY,
    error: null,
  };
  const setEngine = (patch: Partial<EngineStatus>) => {
    engine = { ...engine, ...patch, reloadNeeded: reloadNeeded() };
    emit({ type: "engine", status: engine });
  };

  let server: ServerStatus = SERVER_OFF;
  const downloads = new Map<string, Download>();
  const timers = new Map<string, ReturnType<typeof setInterval>>();

  const conversations = new Map<string, Conversation>();
  const seed = (title: string, count: number): Conversation => {
    const c: Conversation = {
      id: newId("c"),
      title,
      systemPrompt: "",
      createdAt: now(),
      updatedAt: now(),
      messages: [],
    };
    for (let i = 0; i < count; i++) {
      c.messages.push({
        id: newId("m"),
        role: "user",
        content: `Question ${i + 1}: how does the expert cache work?`,
        createdAt: now(),
      });
      c.messages.push({
        id: newId("m"),
        role: "assistant",
        content:
          i % 3 === 0 ? REPLY : `Answer ${i + 1}. The cache keeps the most used experts in memory.`,
        createdAt: now(),
        model: "demo",
        finishReason: "eos",
        stats: stats(40 + i),
      });
    }
    conversations.set(c.id, c);
    return c;
  };
  seed("Trying markdown", 2);
  if (new URLSearchParams(window.location.search).has("long")) seed("A long chat", 200);

  const summaries = () =>
    [...conversations.values()].map((c) => ({
      id: c.id,
      title: c.title,
      updatedAt: c.updatedAt,
      messageCount: c.messages.length,
      pinned: c.pinned === true,
    }));
  const emitConversations = () => emit({ type: "conversations", conversations: summaries() });

  let generating: {
    conversationId: string;
    message: Message;
    timer: ReturnType<typeof setInterval>;
    tokens: number;
    start: number;
  } | null = null;
  let lastTps: number | null = null;
  let lastTtft: number | null = null;
  let lastTokens: number | null = null;
  /** A reply finished since the last live sample. */
  let justFinished = false;

  function stats(tokens: number) {
    const tps = 18 + Math.random() * 4;
    return {
      line: `${tps.toFixed(1)} t/s, TTFT: 660.1ms (19.7 t/s, 13 tokens), ${tokens} tokens`,
      decodeTokensPerSecond: tps,
      ttftMs: 660.1,
      prefillTokensPerSecond: 19.7,
      promptTokens: 13,
      generatedTokens: tokens,
      peakRssBytes: 90_000_000,
      hitRate: null,
    };
  }

  function finish(reason: Message["finishReason"], error?: AppError) {
    if (!generating) return;
    clearInterval(generating.timer);
    const g = generating;
    generating = null;
    justFinished = true;
    const c = conversations.get(g.conversationId);
    const done: Message = {
      ...g.message,
      finishReason: reason,
      stats: error ? undefined : stats(g.tokens),
    };
    if (error) done.error = error;
    if (c) c.messages = c.messages.map((m) => (m.id === done.id ? done : m));
    emit({ type: "chat.done", conversationId: g.conversationId, message: done });
    if (engine.state === "generating") setEngine({ state: "ready" });
    emitConversations();
  }

  function startReply(c: Conversation, prompt: string): void {
    const message: Message = {
      id: newId("m"),
      role: "assistant",
      content: "",
      createdAt: now(),
      model: engine.model ?? "demo",
    };
    c.messages.push(message);
    c.updatedAt = now();
    if (engine.state !== "ready") {
      // Answer at once, fail right after: like a request to a dead engine.
      setTimeout(() => {
        generating = {
          conversationId: c.id,
          message,
          timer: setInterval(() => {}, 1e6),
          tokens: 0,
          start: Date.now(),
        };
        finish(
          "error",
          engine.error ?? {
            code: "engine_not_ready",
            message: "No model is loaded.",
            action: "load_model",
          },
        );
      }, 50);
      return;
    }
    const words = REPLY.split(/(?<=\s)/);
    let i = 0;
    const start = Date.now();
    setEngine({ state: "generating" });
    const timer = setInterval(() => {
      if (!generating) return;
      if (prompt.trim() === "/crash" && i === 8) {
        const error: AppError = {
          code: "engine_crashed",
          message: "The engine stopped unexpectedly (signal SIGKILL).",
          action: "restart_engine",
          detail: "exit signal SIGKILL, pid 4242",
        };
        finish("error", error);
        setEngine({ state: "crashed", pid: null, error, memory: null });
        return;
      }
      if (prompt.trim() === "/fail" && i === 5) {
        finish("error", {
          code: "context_overflow",
          message:
            "This conversation is 4,300 tokens, more than the 4,096-token context holds (this model supports up to 8,192). Raise the context to 4,608, or start a new chat.",
          action: "apply_fix",
          fix: { label: "Raise context to 4,608", model: "demo", engine: { context: 4608 } },
        });
        return;
      }
      if (i >= words.length) {
        finish("eos");
        return;
      }
      const text = words[i++]!;
      message.content += text;
      generating.tokens++;
      lastTokens = generating.tokens;
      lastTtft = 660;
      lastTps = generating.tokens / ((Date.now() - start) / 1000 + 0.001);
      emit({ type: "chat.delta", conversationId: c.id, messageId: message.id, text });
    }, 45);
    generating = { conversationId: c.id, message, timer, tokens: 0, start };
  }

  // Live samples twice a second.
  setInterval(() => {
    const base = engine.memory?.rssBytes ?? null;
    const rss =
      base == null ? null : base + (generating ? 12e6 * Math.random() + 8e6 : 2e6 * Math.random());
    const gpuTier = effectiveGpuMisses(settings.engine);
    // The 26B at 2 GB: 168 of a token's expert uses miss the GPU over its 30 layers, 3.4 MB each.
    // "copy" copies every miss; "cpu" computes every miss on the CPU and copies gpuExpertCopies a
    // layer besides; "split" copies and computes that many on the GPU and the CPU the rest.
    const misses = 168;
    const copied =
      gpuTier?.gpuMisses === "copy"
        ? misses
        : 30 * Math.min(gpuTier?.gpuExpertCopies ?? 0, misses / 30);
    const cpuExperts =
      gpuTier?.gpuMisses === "copy" ? 0 : gpuTier?.gpuMisses === "split" ? misses - copied : misses;
    const sample: LiveSample = {
      t: Date.now(),
      generating: !!generating,
      ...(justFinished ? { finished: true } : {}),
      rssBytes: rss,
      peakRssBytes: rss == null ? null : Math.max(rss, 98_000_000),
      budgetBytes: settings.engine.memoryBudgetBytes ?? engine.memory?.estimateBytes ?? null,
      freeMemoryBytes: 17.2 * GB + Math.random() * 0.1 * GB,
      totalMemoryBytes: TOTAL,
      decodeTokensPerSecond: generating ? 17 + Math.random() * 5 : lastTps,
      ttftMs: lastTtft,
      generatedTokens: lastTokens,
      expertCache: {
        slots: settings.engine.expertCacheSlots,
        hitRate: 0.91 + Math.random() * 0.02,
        readBytesPerToken: 3.4e6,
        ioWaitMsPerToken: 4.2 + Math.random() * 0.6,
        // A GPU memory budget on a GPU backend: the RAM tier, 4 GPU slots under every expert.
        ...(gpuTier
          ? {
              gpuSlots: 4,
              gpuHitRate: 0.3,
              ramHitRate: 0.62 + Math.random() * 0.02,
              gpuCopyBytesPerToken: copied * 3.4e6,
              cpuExpertsPerToken: cpuExperts,
              cpuExpertMsPerToken: (cpuExperts / misses) * (38 + Math.random() * 4),
            }
          : {}),
      },
      powerWatts: 11 + Math.random() * 3,
      joulesPerToken: 0.62,
      thermal: null,
    };
    justFinished = false;
    emit({ type: "live", sample });
  }, 500);

  function progressDownload(d: Download): void {
    const t = setInterval(() => {
      const cur = downloads.get(d.taskId);
      if (!cur || cur.state !== "running") return;
      const rate = 40e6 + Math.random() * 8e6;
      const bytesDone = Math.min(cur.bytesTotal, cur.bytesDone + cur.bytesTotal * 0.03);
      const next: Download = {
        ...cur,
        phase: "downloading",
        bytesDone,
        rate,
        etaSeconds: (cur.bytesTotal - bytesDone) / rate,
        file: "model-00001-of-00003.safetensors",
      };
      if (bytesDone >= cur.bytesTotal) {
        Object.assign(next, {
          state: "done",
          phase: "done",
          rate: null,
          etaSeconds: 0,
          file: null,
        });
        clearInterval(t);
        timers.delete(d.taskId);
        if (!models.some((m) => m.name === d.name)) {
          models.push({
            name: d.name,
            dir: `/home/user/.redwing/models/${d.name}`,
            sizeBytes: cur.bytesTotal,
            memoryEstimateBytes: 1.1 * GB,
            family: "gemma3",
            moe: false,
            isDemo: false,
            verify: { state: "ok" },
            loaded: false,
          });
          emit({ type: "models", models: structuredClone(models) });
        }
      }
      downloads.set(d.taskId, next);
      emit({ type: "download", download: next });
    }, 250);
    timers.set(d.taskId, t);
  }

  function fail(code: string, message: string, action: AppError["action"] = null): never {
    throw new AppCallError({ code, message, action });
  }

  const handlers: { [M in Method]?: (p: never) => unknown } = {
    "app.info": () => ({
      version: "0.1.0-mock",
      shell: "web",
      platform: "linux",
      arch: "x64",
      dataDir: "/home/user/.redwing",
      modelsDir: "/home/user/.redwing/models",
      hardwareThreads: 8,
      totalMemoryBytes: TOTAL,
      features: { energy: true, thermal: false, reveal: false },
    }),
    "settings.get": () => settings,
    "settings.update": (p: Partial<Settings>) => {
      settings = {
        ...settings,
        ...p,
        sampling: { ...settings.sampling, ...p.sampling },
        engine: { ...settings.engine, ...p.engine },
        server: { ...settings.server, ...p.server },
      };
      emit({ type: "settings", settings, reloadNeeded: reloadNeeded() });
      return { settings, reloadNeeded: reloadNeeded() };
    },
    "settings.reset": () => {
      settings = structuredClone(DEFAULT_SETTINGS);
      emit({ type: "settings", settings, reloadNeeded: reloadNeeded() });
      return settings;
    },
    "settings.memoryPlan": (p: { engine?: Partial<Settings["engine"]> }): MemoryPlan => {
      const e = { ...settings.engine, ...p.engine };
      const kv = (e.context * 26 * 2 * 8 * 256 * (e.kvDtype === "f16" ? 2 : 4)) / 8;
      const slots = e.memoryBudgetBytes
        ? Math.max(4, Math.min(128, Math.floor(e.memoryBudgetBytes / 0.15e9)))
        : e.expertCacheSlots;
      const experts = slots * 30 * 4.2e6;
      const work = 0.3 * GB;
      const total = 1.9 * GB + kv + experts + work;
      // A GPU backend holds the same parts in device memory (less the process's own share).
      const vramBudget = effectiveVramBudget(e) ?? null;
      const device = e.backend === "cpu" ? 0 : total - 0.1 * GB;
      return {
        model: engine.model,
        weightsBytes: 1.9 * GB,
        kvBytes: kv,
        expertCacheBytes: experts,
        workBytes: work,
        totalBytes: total,
        deviceBytes: device,
        expertCacheSlots: slots,
        expectedHitRate: Math.min(0.99, 0.55 + slots / 100),
        hitRateSource: slots === 16 ? "measured" : "estimate",
        freeMemoryBytes: 17.2 * GB,
        fits: total < 17.2 * GB,
        budgetBytes: e.memoryBudgetBytes,
        vramBudgetBytes: vramBudget,
        overBudget:
          e.memoryBudgetBytes !== null && total > e.memoryBudgetBytes
            ? "the memory budget cannot hold the plan"
            : vramBudget !== null && device > vramBudget
              ? "GPU memory budget cannot hold the plan"
              : null,
      };
    },
    "models.catalog": () => catalog(),
    "models.list": () => structuredClone(models),
    "models.search": (p: { query: string }): ModelSearch => {
      const base = {
        url: "https://huggingface.co/",
        likes: 0,
        updatedAt: null,
        installedAs: null,
        gated: false,
        access: "open" as const,
      };
      return {
        query: p.query,
        endpoint: "https://huggingface.co",
        tokenSet: false,
        models: [
          {
            ...base,
            repo: `mlx-community/${p.query}-it-4bit`,
            downloads: 12_000,
            status: "runnable",
            reason: null,
            family: "gemma3",
            architecture: "Gemma 3",
            format: "MLX 4-bit",
            downloadBytes: 3.4 * GB,
            installBytes: 2.2 * GB,
            memoryBytes: 2.9 * GB,
            fits: true,
            licence: { id: "gemma", name: "gemma", url: null },
          },
          {
            ...base,
            repo: `someone/${p.query}-GGUF`,
            downloads: 9_000,
            status: "unsupported",
            reason:
              "GGUF only: Redwing reads safetensors checkpoints (MLX 4/8-bit, or bf16/f16/f32)",
            family: null,
            architecture: null,
            format: "GGUF",
            downloadBytes: null,
            installBytes: null,
            memoryBytes: null,
            fits: null,
            licence: { id: null, name: null, url: null },
          },
        ],
      };
    },
    "models.install": (p: { ref: string; name?: string }) => {
      const name = p.name ?? p.ref.split("/").pop()!.replace(/@.*/, "");
      const item = catalog().find((c) => c.id === p.ref);
      const d: Download = {
        taskId: newId("t"),
        ref: p.ref,
        name,
        state: "running",
        phase: "resolving",
        bytesDone: 0,
        bytesTotal: item?.downloadBytes ?? 2.1 * GB,
        rate: null,
        etaSeconds: null,
        file: null,
        note: null,
        error: null,
      };
      downloads.set(d.taskId, d);
      progressDownload(d);
      return d;
    },
    "models.downloads": () => [...downloads.values()],
    "models.pause": (p: { taskId: string }) => {
      const d = downloads.get(p.taskId) ?? fail("not_found", "No such download");
      const next: Download = {
        ...d,
        state: "paused",
        phase: "paused",
        rate: null,
        etaSeconds: null,
        note: "Paused: the part fetched so far is kept.",
      };
      downloads.set(d.taskId, next);
      emit({ type: "download", download: next });
      return next;
    },
    "models.resume": (p: { taskId: string }) => {
      const d = downloads.get(p.taskId) ?? fail("not_found", "No such download");
      const next: Download = {
        ...d,
        state: "running",
        phase: "downloading",
        note: "Resumed",
        error: null,
      };
      downloads.set(d.taskId, next);
      if (!timers.has(d.taskId)) progressDownload(next);
      emit({ type: "download", download: next });
      return next;
    },
    "models.cancel": (p: { taskId: string }) => {
      const d = downloads.get(p.taskId) ?? fail("not_found", "No such download");
      clearInterval(timers.get(d.taskId));
      timers.delete(d.taskId);
      const next: Download = {
        ...d,
        state: "cancelled",
        rate: null,
        etaSeconds: null,
        bytesDone: 0,
      };
      downloads.set(d.taskId, next);
      emit({ type: "download", download: next });
      return next;
    },
    "models.dismiss": (p: { taskId: string }) => {
      downloads.delete(p.taskId);
      return { ok: true };
    },
    "models.verify": (p: { name: string }) => {
      const m = models.find((x) => x.name === p.name) ?? fail("not_found", `No model "${p.name}"`);
      let f = 0;
      const t = setInterval(() => {
        f += 0.2;
        m.verify = f >= 1 ? { state: "ok", checkedAt: now() } : { state: "checking", fraction: f };
        if (f >= 1) clearInterval(t);
        emit({ type: "models", models: structuredClone(models) });
      }, 300);
      m.verify = { state: "checking", fraction: 0 };
      emit({ type: "models", models: structuredClone(models) });
      return m.verify;
    },
    "models.remove": (p: { name: string }) => {
      const i = models.findIndex((x) => x.name === p.name);
      if (i >= 0) models.splice(i, 1);
      emit({ type: "models", models: structuredClone(models) });
      return { ok: true };
    },
    "models.reveal": (p: { name: string }) => ({
      path: `/home/user/.redwing/models/${p.name}`,
      shown: false,
    }),
    "engine.status": () => engine,
    "engine.load": (p: { model?: string }) => {
      const name = p.model ?? settings.activeModel ?? "demo";
      for (const m of models) m.loaded = false;
      setEngine({ state: "loading", model: name, loadFraction: 0, error: null });
      let f = 0;
      const t = setInterval(() => {
        f += 0.25;
        if (f >= 1) {
          clearInterval(t);
          for (const m of models) m.loaded = m.name === name;
          loadedWith = structuredClone(settings.engine);
          setEngine({
            state: "ready",
            loadFraction: null,
            pid: 4243,
            loadedWith,
            memory: DEMO_MEMORY,
          });
          emit({ type: "models", models: structuredClone(models) });
        } else setEngine({ loadFraction: f });
      }, 300);
      settings = { ...settings, activeModel: name === "demo" ? null : name };
      return engine;
    },
    "engine.unload": () => {
      for (const m of models) m.loaded = false;
      setEngine({ state: "stopped", pid: null, memory: null, loadedWith: null });
      emit({ type: "models", models: structuredClone(models) });
      return engine;
    },
    "engine.reload": () => handlers["engine.load"]!({ model: engine.model ?? undefined } as never),
    "chat.list": () => summaries(),
    "chat.get": (p: { id: string }) =>
      structuredClone(conversations.get(p.id) ?? fail("not_found", "No such conversation")),
    "chat.create": (p: { title?: string; systemPrompt?: string }) => {
      const c: Conversation = {
        id: newId("c"),
        title: p.title ?? "New conversation",
        systemPrompt: p.systemPrompt ?? settings.systemPrompt,
        createdAt: now(),
        updatedAt: now(),
        messages: [],
      };
      conversations.set(c.id, c);
      emitConversations();
      return structuredClone(c);
    },
    "chat.rename": (p: { id: string; title: string }) => {
      const c = conversations.get(p.id) ?? fail("not_found", "No such conversation");
      c.title = p.title;
      emitConversations();
      return structuredClone(c);
    },
    "chat.setSystemPrompt": (p: { id: string; systemPrompt: string }) => {
      const c = conversations.get(p.id) ?? fail("not_found", "No such conversation");
      c.systemPrompt = p.systemPrompt;
      return structuredClone(c);
    },
    "chat.delete": (p: { id: string }) => {
      conversations.delete(p.id);
      emitConversations();
      return { ok: true };
    },
    "chat.send": (p: { conversationId: string; content: string }) => {
      const c = conversations.get(p.conversationId) ?? fail("not_found", "No such conversation");
      if (generating) fail("busy", "A reply is already being written.", null);
      c.messages.push({ id: newId("m"), role: "user", content: p.content, createdAt: now() });
      if (c.title === "New conversation") c.title = p.content.slice(0, 40);
      startReply(c, p.content);
      emitConversations();
      return structuredClone(c);
    },
    "chat.regenerate": (p: { conversationId: string }) => {
      const c = conversations.get(p.conversationId) ?? fail("not_found", "No such conversation");
      if (c.messages.at(-1)?.role === "assistant") c.messages.pop();
      startReply(c, c.messages.at(-1)?.content ?? "");
      return structuredClone(c);
    },
    "chat.selectVersion": (p: { conversationId: string; messageId: string; index: number }) => {
      const c = conversations.get(p.conversationId) ?? fail("not_found", "No such conversation");
      // The mock's Regenerate keeps no versions: there is only the one shown.
      if (p.index !== 0) fail("version_not_found", "This reply has one version.");
      return structuredClone(c);
    },
    "chat.edit": (p: { conversationId: string; messageId: string; content: string }) => {
      const c = conversations.get(p.conversationId) ?? fail("not_found", "No such conversation");
      const i = c.messages.findIndex((m) => m.id === p.messageId);
      if (i < 0) fail("not_found", "No such message");
      c.messages = c.messages.slice(0, i + 1);
      c.messages[i] = { ...c.messages[i]!, content: p.content };
      startReply(c, p.content);
      return structuredClone(c);
    },
    "chat.stop": (p: { conversationId: string }) => {
      if (generating?.conversationId === p.conversationId) finish("cancelled");
      return { ok: true };
    },
    "chat.pin": (p: { id: string; pinned: boolean }) => {
      const c = conversations.get(p.id) ?? fail("not_found", "No such conversation");
      c.pinned = p.pinned;
      emitConversations();
      return structuredClone(c);
    },
    // The mock searches titles only, without snippets; the real search is core/app/conversation-search.ts.
    "chat.search": (p: { query: string }) =>
      [...conversations.values()]
        .filter((c) => p.query.trim() && c.title.toLowerCase().includes(p.query.toLowerCase()))
        .map((c) => ({
          conversationId: c.id,
          title: c.title,
          updatedAt: c.updatedAt,
          pinned: c.pinned === true,
          messageId: null,
          role: null,
          snippet: c.title,
          highlights: [],
        })),
    "server.status": () => server,
    "server.cancel": () => ({ ok: true }),
    "server.set": (p: { enabled: boolean; port?: number }) => {
      const port = p.port ?? settings.server.port;
      server = p.enabled
        ? {
            running: true,
            url: `http://127.0.0.1:${port}/v1`,
            modelId: engine.model,
            example: curlExample(`http://127.0.0.1:${port}/v1`, engine.model ?? "demo"),
            error: null,
            requests: [],
            unavailable: null,
          }
        : SERVER_OFF;
      settings = { ...settings, server: { enabled: p.enabled, port } };
      emit({ type: "server", status: server });
      return server;
    },
    "live.history": () => [],
    "connections.list": () => [],
  };

  return {
    shell: "mock",
    async call<M extends Method>(method: M, params?: unknown): Promise<Result<M>> {
      const parsed = parseCall(method, params);
      if (!parsed.ok) throw new AppCallError(parsed.error);
      await new Promise((r) => setTimeout(r, 30));
      const handler = handlers[method] as ((p: unknown) => unknown) | undefined;
      if (!handler) fail("unknown_method", `mock: ${method} is not implemented`);
      return structuredClone(handler(parsed.params)) as Result<M>;
    },
    subscribe(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    onConnection(listener) {
      listener("open");
      return () => {};
    },
  };
}
