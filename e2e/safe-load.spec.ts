/**
 * A load that never leaves the user with nothing (issue 18, items 1 and 3): a load the settings
 * cannot satisfy is refused before the loaded model is unloaded, and the error offers the fix
 * as its button, once (a toast, no engine banner).
 */
import type { Page } from "@playwright/test";
import { expect, test, type RedwingApp } from "./fixtures.ts";
import { loadRandomModel, RANDOM_MODEL } from "./random-model.ts";
import { gotoView, numberInput, setNumber, waitReady } from "./ui.ts";

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

test("per-model settings named in Tuning; the Chat picker; Load with 4096; a too-small budget offers the budget fix", async ({
  app,
}) => {
  const { page } = app;
  await waitReady(page, DEMO);
  // 8192 saved as the demo model's own context (its maximum is 4096), not applied yet.
  await gotoView(page, "Tuning");
  const whose = page.getByTestId("tuning-model");
  await expect(whose).toContainText(`Settings for ${DEMO}, saved for this model`);
  await setNumber(page, "Context length", "8192");
  await expect.poll(async () => (await app.call("settings.get")).engine.context).toBe(8192);

  // Another model loads with its own settings (the defaults), not the demo's 8192.
  await loadRandomModel(app); // its maximum is 32768
  const switched = await app.call("settings.get");
  expect(switched.engine.context).toBe(4096);
  expect(switched.models[DEMO]?.engine.context).toBe(8192);
  await gotoView(page, "Tuning");
  await expect(whose).toContainText(`Settings for ${RANDOM_MODEL}, saved for this model`);
  await expect(numberInput(page, "Context length")).toHaveValue("4096");

  // Stop strings: checked before they are saved, then saved for this model.
  const stops = page.getByRole("textbox", { name: "Stop strings", exact: true });
  await stops.fill(Array.from({ length: 9 }, (_, i) => `s${i}`).join("\n"));
  await stops.blur();
  await expect(page.getByText("At most 8 stop strings (there are 9).")).toBeVisible();
  await stops.fill("END\n###\\n");
  await stops.blur();
  await expect
    .poll(async () => (await app.call("settings.get")).sampling.stop)
    .toEqual(["END", "###\n"]);

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

  // A memory budget too small for the model names the cause and offers the budget fix. The
  // demo model's own budget, then another model; the plan badge names the budget, not the free
  // memory, for that model's tiny budget too.
  await app.call("settings.update", { engine: { memoryBudgetBytes: 1024 * 1024 } });
  await app.call("engine.load", { model: RANDOM_MODEL });
  await waitReady(page, RANDOM_MODEL);
  await app.call("settings.update", { engine: { memoryBudgetBytes: 1024 * 1024 } });
  await gotoView(page, "Tuning");
  const plan = page.getByRole("region", { name: /^Memory plan/ });
  await expect(plan).toContainText("more than the memory budget");
  await expect(plan).not.toContainText("more than the free memory");
  await expect(page.getByTestId("plan-verdict")).toContainText("The memory budget (1.0 MiB)");
  await expect(numberInput(page, "Memory budget")).toHaveValue("1 MiB");
  await app.call("settings.update", { engine: { memoryBudgetBytes: null } });

  await clickLoad(page, DEMO);
  const budgetAlert = page.getByRole("alert").filter({ hasText: "memory budget" });
  await expect(budgetAlert).toHaveCount(1);
  const text = (await budgetAlert.innerText()).split("\n")[0]!;
  expect(text).toContain('The memory budget of 1.0 MiB is too small for "demo"');
  expect(text).toMatch(/weights [\d.]+ [KMG]iB, KV cache [\d.]+ [KMG]iB/);
  expect(text).not.toMatch(/Verify|reinstall|\bGB\b|\bMB\b/);
  await expect(budgetAlert.getByRole("button", { name: "Verify model" })).toHaveCount(0);
  expect(await loadedModel(app)).toBe(RANDOM_MODEL);
  await expect(page.getByRole("alert")).toHaveCount(1);

  const fix = budgetAlert.getByRole("button", { name: /^Load with a [\d.]+ [KMG]iB budget$/ });
  await fix.click();
  await waitReady(page, DEMO);
  const budget = (await app.call("settings.get")).engine.memoryBudgetBytes;
  expect(budget).toBeGreaterThan(1024 * 1024);
  // waitReady can pass on "ready" (the other model, still loaded) then "demo" (loading): poll.
  await expect
    .poll(async () => (await app.call("engine.status")).loadedWith?.memoryBudgetBytes)
    .toBe(budget);
});
