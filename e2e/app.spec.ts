/**
 * The app end to end, as a person uses it: web mode in Chromium (project "web") and the same
 * specs in Electron (project "electron", skipped without an Electron binary). Each test starts
 * the app on a fresh data directory; downloads come from the fake hub in this process.
 */
import { join } from "node:path";
import type { Locator, Page } from "@playwright/test";
import { expect, RESULTS, test } from "./fixtures.ts";
import { E2E_REPO, trickleWeights } from "./hub.ts";
import { loadRandomModel } from "./random-model.ts";
import {
  gotoView,
  lastReply,
  memoryMeter,
  messages,
  numberInput,
  send,
  setNumber,
  startDownload,
  STATS_LINE,
  valueNow,
  VIEWS,
  waitReady,
  waitReply,
} from "./ui.ts";

test("first run: the demo model is installed, the engine gets ready, and it quotes the verse asked for", async ({
  app,
}) => {
  const { page } = app;
  await gotoView(page, "Models");
  const installed = page.getByRole("region", { name: "Installed models" });
  const demo = installed.getByRole("article", { name: "demo", exact: true });
  await expect(demo).toBeVisible({ timeout: 60_000 });
  await expect(
    page.getByRole("region", { name: "Catalog" }).getByRole("article").first(),
  ).toBeVisible();
  await waitReady(page, "demo");
  await expect(demo.getByRole("button", { name: "Unload", exact: true })).toBeVisible();
  const meter = memoryMeter(page);
  await expect(meter).toBeVisible();
  await expect
    .poll(() => valueNow(meter), { message: "engine RSS in the meter" })
    .toBeGreaterThan(0);

  // First-run chat: the trained demo model quotes the verse it is asked for.
  await gotoView(page, "Tuning");
  await setNumber(page, "Temperature", "0");
  await gotoView(page, "Chat");
  await waitReady(page, "demo");
  await send(page, "Quote Genesis 1:3");
  expect(await waitReply(page)).toMatch(STATS_LINE);
  // Words of the verse (Genesis 1:3 KJV), not just any text: the reply is transformers' greedy
  // reply (demo-model/reference.json).
  const reply = await lastReply(page).innerText();
  expect(reply).toContain("Let there be light");
  expect(reply).toContain("and there was light");
});

test("chat: the reply streams in, then its statistics line; the memory meter moves", async ({
  app,
}) => {
  const { page } = app;
  await gotoView(page, "Chat");
  await waitReady(page);
  // A long reply to watch: the trained demo model answers in a sentence or two. 160 tokens are
  // plenty of streaming steps (the default 1024 made this the suite's slowest test).
  await loadRandomModel(app);
  await app.call("settings.update", { sampling: { maxNewTokens: 160 } });
  const meter = memoryMeter(page);
  await expect.poll(() => valueNow(meter)).toBeGreaterThan(0);
  const memory = new Set<number>([await valueNow(meter)]);
  await send(page, "Tell me a long story about a red bird.");
  const reply = lastReply(page);
  const stats = reply.getByTestId("stats-line");
  // Sample the reply while it is being written: the text must grow in several steps.
  const lengths: number[] = [];
  const deadline = Date.now() + 120_000;
  let sawStop = false;
  while (Date.now() < deadline) {
    const [text, done, now, stop] = await Promise.all([
      reply.innerText(),
      stats.count(),
      valueNow(meter),
      page.getByRole("button", { name: "Stop", exact: true }).count(),
    ]);
    if (done > 0) break;
    lengths.push(text.length);
    memory.add(now);
    if (stop > 0) sawStop = true;
    await page.waitForTimeout(100);
  }
  expect(sawStop, "a Stop button while replying").toBe(true);
  const growing = [...new Set(lengths)].filter((n) => n > 0);
  expect(
    growing.length,
    `reply lengths seen while streaming: ${lengths.join(",")}`,
  ).toBeGreaterThanOrEqual(3);
  expect(Math.max(...lengths)).toBeGreaterThan(Math.min(...lengths));
  const line = await waitReply(page);
  expect(line).toMatch(STATS_LINE);
  // Samples arrive twice a second: a few more after the reply.
  for (let i = 0; i < 6; i++) {
    memory.add(await valueNow(meter));
    await page.waitForTimeout(250);
  }
  expect(memory.size, `engine memory values seen: ${[...memory].join(", ")}`).toBeGreaterThan(1);
  await expect(messages(page).locator(":scope > li")).toHaveCount(2);
});

test("stop mid-answer keeps the text so far and frees the engine", async ({ app }) => {
  const { page } = app;
  await gotoView(page, "Tuning");
  await setNumber(page, "Max new tokens", "30000");
  await gotoView(page, "Chat");
  await waitReady(page);
  await loadRandomModel(app); // writes until stopped; the demo model ends its turn
  await send(page, "Write forever.");
  const reply = lastReply(page);
  const stop = page.getByRole("button", { name: "Stop", exact: true });
  await expect(stop).toBeVisible();
  await expect.poll(async () => (await reply.innerText()).length).toBeGreaterThan(40);
  await stop.click();
  await expect(stop).toHaveCount(0);
  await expect(page.getByRole("button", { name: "Send", exact: true })).toBeVisible();
  await waitReady(page);
  const kept = await reply.innerText();
  await page.waitForTimeout(1500);
  expect(await reply.innerText(), "no text after Stop").toBe(kept);
  const [summary] = await app.call("chat.list");
  const conversation = await app.call("chat.get", { id: summary!.id });
  const last = conversation.messages.at(-1)!;
  expect(last.role).toBe("assistant");
  expect(last.finishReason).toBe("cancelled");
  expect(last.content.length).toBeGreaterThan(0);
  expect(last.stats?.generatedTokens ?? 0).toBeLessThan(30000);
});

test("sampling and context settings persist across a restart", async ({ app }) => {
  let { page } = app;
  await waitReady(page);
  await gotoView(page, "Tuning");
  const values: [string, string][] = [
    ["Temperature", "0.7"],
    ["Top-k", "40"],
    ["Top-p", "0.9"],
    ["Repetition penalty", "1.1"],
    ["Seed", "1234"],
    ["Max new tokens", "300"],
  ];
  for (const [label, value] of values) await setNumber(page, label, value);
  await setNumber(page, "Context length", "2048");
  await expect(page.getByText("needs reload").first()).toBeVisible();
  const apply = page.getByRole("button", { name: "Apply and reload", exact: true });
  await expect(apply).toBeEnabled();
  await apply.click();
  // The status still reads "ready" for a moment after the click: wait for the reloaded engine.
  await expect.poll(async () => (await app.call("engine.status")).loadedWith?.context).toBe(2048);
  await waitReady(page);
  await expect(apply).toBeDisabled();
  expect((await app.call("engine.status")).reloadNeeded).toBe(false);

  // GPU memory: off on the CPU, saying why; on a GPU backend it takes a size, saved in bytes, and
  // asks for a reload; back on the CPU (which ignores it) no reload is needed.
  const gpuMemory = numberInput(page, "GPU memory");
  const backend = page.getByLabel("Backend", { exact: true });
  // Where the GPU's expert misses run (split, on the CPU or copied) and how many it copies: off on
  // the CPU and on a GPU without GPU memory, each saying why.
  const gpuMisses = page.getByLabel("Experts the GPU misses", { exact: true });
  const copies = numberInput(page, "Experts copied to the GPU");
  const engineSaved = async () => (await app.call("settings.get")).engine;
  await expect(gpuMemory).toBeDisabled();
  await expect(
    page.getByText("The CPU backend uses host memory only", { exact: false }),
  ).toBeVisible();
  await expect(gpuMisses).toBeDisabled();
  await expect(copies).toBeDisabled();
  await expect(page.locator("#field-gpu-misses-help")).toContainText(
    "The CPU backend computes every expert on the CPU",
  );
  await backend.selectOption("vulkan");
  await expect(gpuMemory).toBeEnabled();
  await expect(gpuMisses).toBeDisabled();
  await expect(page.locator("#field-gpu-misses-help")).toContainText("Set GPU memory first");
  await setNumber(page, "GPU memory", "6 GiB");
  await expect
    .poll(async () => (await app.call("settings.get")).engine.vramBudgetBytes)
    .toBe(6 * 1024 ** 3);
  await expect(page.locator("#field-vram-budget-badge")).toHaveText("needs reload");
  // Under GPU memory: the choice is on, the misses split by default with two for the GPU;
  // copying every miss instead turns the copies off; computing them on the CPU turns them on
  // again, as the extra copies.
  await expect(gpuMisses).toBeEnabled();
  await expect(gpuMisses).toHaveValue("split");
  await expect(page.locator("#field-gpu-misses-help")).toContainText(
    "while the CPU computes the rest",
  );
  await expect(page.locator("#field-gpu-misses-badge")).toHaveText("needs reload");
  await expect(copies).toBeEnabled();
  await expect(copies).toHaveValue("2");
  await expect(page.locator("#field-gpu-expert-copies-help")).toContainText(
    "how many of the GPU's misses it copies",
  );
  await gpuMisses.selectOption({ label: "Copy to GPU" });
  await expect.poll(async () => (await engineSaved()).gpuMisses).toBe("copy");
  await expect(copies).toBeDisabled();
  await expect(page.locator("#field-gpu-expert-copies-help")).toContainText(
    "Only with Split between GPU and CPU or Compute on CPU",
  );
  await gpuMisses.selectOption({ label: "Compute on CPU (hybrid)" });
  await expect.poll(async () => (await engineSaved()).gpuMisses).toBe("cpu");
  await expect(page.locator("#field-gpu-misses-help")).toContainText(
    "only their results go to the GPU",
  );
  await expect(copies).toBeEnabled();
  await expect(page.locator("#field-gpu-expert-copies-help")).toContainText(
    "also copied to the GPU's slots",
  );
  // A bad count is refused with the reason, by the field and by the API, and not saved.
  await copies.fill("-1");
  await copies.press("Tab");
  await expect(page.locator("#field-gpu-expert-copies-error")).toHaveText(
    "Enter a value from 0 to 128.",
  );
  await expect(app.call("settings.update", { engine: { gpuExpertCopies: 1.5 } })).rejects.toThrow(
    "engine.gpuExpertCopies: experts copied to the GPU must be a whole number",
  );
  expect((await engineSaved()).gpuExpertCopies).toBe(2);
  await setNumber(page, "Experts copied to the GPU", "0");
  await expect.poll(async () => (await engineSaved()).gpuExpertCopies).toBe(0);
  await expect(page.locator("#field-gpu-expert-copies-badge")).toHaveText("needs reload");
  await backend.selectOption("cpu");
  await expect(gpuMemory).toBeDisabled();
  await expect(page.locator("#field-vram-budget-badge")).toHaveCount(0);
  // The CPU ignores the choice: off again, kept, and no reload asked for.
  await expect(gpuMisses).toBeDisabled();
  await expect(gpuMisses).toHaveValue("cpu");
  await expect(page.locator("#field-gpu-misses-badge")).toHaveCount(0);
  await expect(page.locator("#field-gpu-expert-copies-badge")).toHaveCount(0);
  await expect(apply).toBeDisabled();

  await app.restart();
  page = app.page;
  await gotoView(page, "Tuning");
  for (const [label, value] of [...values, ["Context length", "2048"] as [string, string]]) {
    await expect(numberInput(page, label), label).toHaveValue(value);
  }
  const settings = await app.call("settings.get");
  expect(settings.sampling).toMatchObject({
    temperature: 0.7,
    topK: 40,
    topP: 0.9,
    repetitionPenalty: 1.1,
    seed: 1234,
    maxNewTokens: 300,
  });
  expect(settings.engine.context).toBe(2048);
  expect(settings.engine.vramBudgetBytes).toBe(6 * 1024 ** 3);
  expect(settings.engine).toMatchObject({ gpuMisses: "cpu", gpuExpertCopies: 0 });
  await expect(numberInput(page, "GPU memory")).toHaveValue("6 GiB");
  await waitReady(page);
  expect((await app.call("engine.status")).loadedWith?.context).toBe(2048);
  // Back on Vulkan after the restart, the hybrid choice and its count are there, on again.
  await page.getByLabel("Backend", { exact: true }).selectOption("vulkan");
  const restartedMisses = page.getByLabel("Experts the GPU misses", { exact: true });
  await expect(restartedMisses).toBeEnabled();
  await expect(restartedMisses).toHaveValue("cpu");
  await expect(numberInput(page, "Experts copied to the GPU")).toBeEnabled();
  await expect(numberInput(page, "Experts copied to the GPU")).toHaveValue("0");
});

test("download from the hub: progress, cancel, pause and resume, verified install, chat", async ({
  app,
  hub,
}) => {
  const { page } = app;
  trickleWeights(hub);
  await gotoView(page, "Models");
  const downloads = page.getByRole("region", { name: "Downloads" });

  // 1. Start, see progress with a rate, cancel: nothing is installed.
  await startDownload(page, E2E_REPO);
  let item = downloads.getByRole("article").first();
  const bar = (): Locator => item.getByRole("progressbar");
  await expect(item).toBeVisible();
  await expect.poll(() => valueNow(bar())).toBeGreaterThan(0);
  expect(await valueNow(bar())).toBeLessThan(100);
  await expect(item).toContainText(/\/s/);
  await item.getByRole("button", { name: "Cancel", exact: true }).click();
  const [cancelled] = await app.call("models.downloads");
  await expect.poll(async () => (await app.call("models.downloads"))[0]?.state).toBe("cancelled");
  const name = cancelled!.name;
  const installed = page.getByRole("region", { name: "Installed models" });
  await expect(installed.getByRole("article", { name, exact: true })).toHaveCount(0);
  const dismiss = item.getByRole("button", { name: "Dismiss", exact: true });
  if ((await dismiss.count()) > 0) await dismiss.click();
  await expect(downloads.getByRole("article", { name, exact: true })).toHaveCount(0);

  // 2. Again; pause (no progress while paused), resume from where it was, finish.
  await startDownload(page, E2E_REPO);
  item = downloads.getByRole("article", { name, exact: true });
  await expect.poll(() => valueNow(bar())).toBeGreaterThan(5);
  await item.getByRole("button", { name: "Pause", exact: true }).click();
  await expect(item.getByRole("button", { name: "Resume", exact: true })).toBeVisible();
  const paused = await valueNow(bar());
  hub.faults.length = 0; // after the pause, the rest at full speed
  await page.waitForTimeout(1500);
  const pausedAt = Date.now();
  expect(await valueNow(bar()), "progress while paused").toBe(paused);
  await item.getByRole("button", { name: "Resume", exact: true }).click();
  await expect.poll(() => valueNow(bar())).toBeGreaterThan(paused);
  const model = installed.getByRole("article", { name, exact: true });
  await expect(model).toBeVisible({ timeout: 90_000 });
  // Resume fetched the rest after the pause (the installer keeps whole verified units; a file
  // this small is one unit, so it comes again from its start).
  const fetchedAfterPause = hub.log.filter(
    (r) => r.t > pausedAt && r.method === "GET" && r.server === "cdn",
  );
  expect(fetchedAfterPause.length).toBeGreaterThan(0);

  // 3. Verify, load, chat.
  await model.getByRole("button", { name: "Verify", exact: true }).click();
  await expect(model.getByTestId("verify-state")).toHaveText("verified", { timeout: 60_000 });
  await model.getByRole("button", { name: "Load", exact: true }).click();
  await waitReady(page, name);
  await gotoView(page, "Chat");
  await page.getByRole("button", { name: "New chat", exact: true }).click();
  await send(page, "Hello, tiny model!");
  expect(await waitReply(page)).toMatch(STATS_LINE);
  const [summary] = await app.call("chat.list");
  const conversation = await app.call("chat.get", { id: summary!.id });
  expect(conversation.messages.at(-1)?.model).toBe(name);
});

test("screenshots of every main view at 1280x800 and 420x800, light and dark", async ({
  app,
}, testInfo) => {
  const { page } = app;
  await gotoView(page, "Tuning");
  await setNumber(page, "Max new tokens", "120");
  await gotoView(page, "Chat");
  await waitReady(page);
  await send(page, "Say something in *markdown* with a `code` sample.");
  await waitReply(page);
  const saved: string[] = [];
  for (const scheme of ["light", "dark"] as const) {
    await page.emulateMedia({ colorScheme: scheme });
    for (const width of [1280, 420]) {
      await page.setViewportSize({ width, height: 800 });
      for (const view of VIEWS) {
        await openView(page, view);
        if (view === "Live") await page.waitForTimeout(400); // a live sample or two
        const path = join(
          RESULTS,
          "screenshots",
          `${app.shell}-${view.toLowerCase()}-${width}x800-${scheme}.png`,
        );
        await page.screenshot({ path });
        await testInfo.attach(`${view} ${width}x800 ${scheme}`, { path, contentType: "image/png" });
        saved.push(path);
      }
    }
  }
  console.log(`screenshots:\n${saved.map((p) => `  ${p}`).join("\n")}`);
});

/** gotoView, also at narrow widths where the navigation may sit behind a menu button. */
async function openView(page: Page, view: (typeof VIEWS)[number]) {
  const nav = page.getByRole("navigation", { name: "Main" });
  const button = nav.getByRole("button", { name: view, exact: true });
  if (!(await button.isVisible())) {
    const menu = page.getByRole("button", { name: /menu|navigation/i }).first();
    if ((await menu.count()) > 0) await menu.click();
  }
  await gotoView(page, view);
}
