/**
 * A load that never leaves the user with nothing (issue 18, items 1 and 3): a load the settings
 * cannot satisfy is refused before the loaded model is unloaded, and the error offers the fix
 * as its button, once (a toast, no engine banner).
 */
import type { Page } from "@playwright/test";
import { expect, test, type RedwingApp } from "./fixtures.ts";
import { loadRandomModel, RANDOM_MODEL } from "./random-model.ts";
import { gotoView, setNumber, waitReady } from "./ui.ts";

const DEMO = "demo";

async function clickLoad(page: Page, model: string): Promise<void> {
  await gotoView(page, "Models");
  await page
    .getByRole("article", { name: model, exact: true })
    .getByRole("button", { name: "Load", exact: true })
    .click();
}

async function loadedModel(app: RedwingApp): Promise<string | null> {
  const status = await app.call("engine.status");
  return status.state === "ready" ? status.model : null;
}

test("per-model settings; the Chat picker; a context beyond the maximum keeps the loaded model and offers Load with 4096", async ({
  app,
}) => {
  const { page } = app;
  await waitReady(page, DEMO);
  // 8192 saved as the demo model's own context (its maximum is 4096), not applied yet.
  await gotoView(page, "Tuning");
  await setNumber(page, "Context length", "8192");
  await expect.poll(async () => (await app.call("settings.get")).engine.context).toBe(8192);

  // Another model loads with its own settings (the defaults), not the demo's 8192.
  await loadRandomModel(app); // its maximum is 32768
  const switched = await app.call("settings.get");
  expect(switched.engine.context).toBe(4096);
  expect(switched.models[DEMO]?.engine.context).toBe(8192);

  // Chat's picker: the demo with its saved 8192 is refused; the random model stays loaded.
  await gotoView(page, "Chat");
  const picker = page.getByRole("combobox", { name: "Model" });
  await expect(picker).toHaveValue(RANDOM_MODEL);
  await picker.selectOption(DEMO);
  const alert = page.getByRole("alert").filter({ hasText: "at most 4096 tokens" });
  await expect(alert).toHaveCount(1);
  await expect(alert).toContainText(`"${RANDOM_MODEL}" stays loaded`);
  expect(await loadedModel(app)).toBe(RANDOM_MODEL);
  await waitReady(page, RANDOM_MODEL);
  await expect(picker).toHaveValue(RANDOM_MODEL);
  const kept = await app.call("settings.get");
  expect(kept.activeModel).toBe(RANDOM_MODEL);
  expect(kept.engine.context).toBe(4096);
  // Once: the engine itself is fine, so no banner repeats the error.
  await expect(page.getByRole("alert")).toHaveCount(1);

  await alert.getByRole("button", { name: "Load with 4096" }).click();
  await waitReady(page, DEMO);
  await expect(picker).toHaveValue(DEMO);
  expect((await app.call("settings.get")).engine.context).toBe(4096);
  await expect.poll(async () => (await app.call("engine.status")).loadedWith?.context).toBe(4096);
  await expect(alert).toHaveCount(0);
});

test("a memory budget too small for the model names the cause and offers the budget fix", async ({
  app,
}) => {
  const { page } = app;
  await waitReady(page, DEMO);
  // The demo model's own budget, then another model.
  await app.call("settings.update", { engine: { memoryBudgetBytes: 1024 * 1024 } });
  await loadRandomModel(app);

  await clickLoad(page, DEMO);
  const alert = page.getByRole("alert").filter({ hasText: "memory budget" });
  await expect(alert).toHaveCount(1);
  const text = (await alert.innerText()).split("\n")[0]!;
  expect(text).toContain('The memory budget of 1.0 MiB is too small for "demo"');
  expect(text).toMatch(/weights [\d.]+ [KMG]iB, KV cache [\d.]+ [KMG]iB/);
  expect(text).not.toMatch(/Verify|reinstall|\bGB\b|\bMB\b/);
  await expect(alert.getByRole("button", { name: "Verify model" })).toHaveCount(0);
  expect(await loadedModel(app)).toBe(RANDOM_MODEL);
  await expect(page.getByRole("alert")).toHaveCount(1);

  const fix = alert.getByRole("button", { name: /^Load with a [\d.]+ [KMG]iB budget$/ });
  await fix.click();
  await waitReady(page, DEMO);
  const budget = (await app.call("settings.get")).engine.memoryBudgetBytes;
  expect(budget).toBeGreaterThan(1024 * 1024);
  expect((await app.call("engine.status")).loadedWith?.memoryBudgetBytes).toBe(budget);
});
