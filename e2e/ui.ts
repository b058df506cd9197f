/**
 * Steps the specs share, written against the accessible names of the app contract
 * (/tmp/redwing-app-contract.md: "UI accessible names"), so they read like what a person does.
 */
import { expect, type Locator, type Page } from "@playwright/test";

export const VIEWS = ["Models", "Chat", "Tuning", "Live", "Server", "Connections"] as const;
export type View = (typeof VIEWS)[number];

/** `19.9 t/s, TTFT: 660.1ms (19.7 t/s, 13 tokens), 53 tokens` */
export const STATS_LINE =
  /^\d+(\.\d+)? t\/s, TTFT: \d+(\.\d+)?ms \(\d+(\.\d+)? t\/s, \d+ tokens?\), \d+ tokens?/;

/** Opens a main view with the Main navigation and waits for its heading. */
export async function gotoView(page: Page, view: View): Promise<void> {
  const button = page.getByRole("navigation", { name: "Main" }).getByRole("button", {
    name: view,
    exact: true,
  });
  await button.click();
  await expect(button).toHaveAttribute("aria-current", "page");
  await expect(page.getByRole("heading", { level: 1, name: view, exact: true })).toBeVisible();
}

export function engineState(page: Page): Locator {
  return page.getByTestId("engine-state");
}

/** Waits until the engine is ready (model loaded, not generating). */
export async function waitReady(page: Page, model?: string, timeout = 120_000): Promise<void> {
  await expect(engineState(page)).toContainText("ready", { timeout });
  if (model !== undefined) await expect(engineState(page)).toContainText(model);
}

/** The memory meter in the Live strip (visible on every view at 1024 px and wider). */
export function memoryMeter(page: Page): Locator {
  return page
    .getByRole("complementary", { name: "Live" })
    .getByRole("meter", { name: "Engine memory" })
    .first();
}

export function messages(page: Page): Locator {
  return page.getByRole("list", { name: "Messages" });
}

export function lastReply(page: Page): Locator {
  return messages(page).locator('li[data-role="assistant"]').last();
}

/** Types a message in the Chat view and sends it with the Send button. */
export async function send(page: Page, text: string): Promise<void> {
  await page.getByRole("textbox", { name: "Message", exact: true }).fill(text);
  await page.getByRole("button", { name: "Send", exact: true }).click();
  await expect(messages(page).locator('li[data-role="user"]').last()).toContainText(text);
}

/** Waits for the reply being written to finish, and answers its statistics line. */
export async function waitReply(page: Page, timeout = 120_000): Promise<string> {
  const stats = lastReply(page).getByTestId("stats-line");
  await expect(stats).toBeVisible({ timeout });
  await expect(page.getByRole("button", { name: "Stop", exact: true })).toHaveCount(0);
  return (await stats.innerText()).trim();
}

/**
 * Sets a numeric setting in the Tuning view: the number input (spinbutton) labelled `label`, or
 * a plain text box when the renderer uses one. Tab commits it (changes save on change).
 */
export async function setNumber(page: Page, label: string, value: string): Promise<void> {
  const input = numberInput(page, label);
  await input.fill(value);
  await input.press("Tab");
  await expect(input).toHaveValue(value);
}

export function numberInput(page: Page, label: string): Locator {
  return page
    .getByRole("spinbutton", { name: label, exact: true })
    .or(page.getByRole("textbox", { name: label, exact: true }))
    .first();
}

/** The value of an `aria-valuenow`, as a number. */
export async function valueNow(locator: Locator): Promise<number> {
  return Number(await locator.getAttribute("aria-valuenow"));
}

/** Asks the Models view (open) to download `repo` from the hub. */
export async function startDownload(page: Page, repo: string): Promise<void> {
  await page.getByRole("textbox", { name: "Hugging Face repository", exact: true }).fill(repo);
  await page.getByRole("button", { name: "Download repository", exact: true }).click();
}

/** The conversation list in the Chat view. */
export function conversationList(page: Page): Locator {
  return page.getByRole("navigation", { name: "Conversations" });
}

/** The list item of the conversation titled `title` (its link, Rename and Delete buttons). */
export function conversationItem(page: Page, title: string): Locator {
  return conversationList(page)
    .getByRole("listitem")
    .filter({ has: page.getByRole("link", { name: title, exact: true }) });
}

/**
 * Lets the page use the Clipboard API (web mode: Chromium asks for permission; Electron's
 * window has it already).
 */
export async function allowClipboard(page: Page): Promise<void> {
  const origin = new URL(page.url()).origin;
  if (origin.startsWith("http")) {
    await page.context().grantPermissions(["clipboard-read", "clipboard-write"], { origin });
  }
}

/** What the page's clipboard holds now. */
export function readClipboard(page: Page): Promise<string> {
  return page.evaluate(() => navigator.clipboard.readText());
}
