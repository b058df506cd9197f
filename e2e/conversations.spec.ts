/**
 * Conversations (issue 20): a branch made by editing an earlier message and switched with the
 * arrows (the screenshot of it goes to e2e/results/screenshots/), search with a highlighted hit
 * that opens its message, pin, and an export downloaded and imported back. One app, one test:
 * the demo model with replies of a few tokens.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { Locator, Page } from "@playwright/test";
import { ExportFileSchema } from "../core/app/api.ts";
import { expect, RESULTS, test } from "./fixtures.ts";
import {
  conversationItem,
  conversationList,
  gotoView,
  messages,
  send,
  setNumber,
  waitReady,
  waitReply,
} from "./ui.ts";

function userMessage(page: Page, n: number): Locator {
  return messages(page).locator('li[data-role="user"]').nth(n);
}

// Electron exports through its save dialog, which a test cannot answer: web mode only.
test.skip(({ shell }) => shell === "electron", "Electron's export goes through the save dialog");

test("branches, search, pin, export and import", async ({ app }, testInfo) => {
  const { page } = app;
  await gotoView(page, "Tuning");
  await setNumber(page, "Max new tokens", "6");
  await gotoView(page, "Chat");
  await waitReady(page);
  // Room for the messages in the screenshot.
  await page
    .getByRole("note", { name: "About the demo model" })
    .getByRole("button", { name: "Dismiss", exact: true })
    .click();

  // Two turns, then an edit of the first message: a new branch with its own reply.
  await send(page, "Where is the best café?");
  await waitReply(page);
  await send(page, "And after that?");
  await waitReply(page);
  const first = userMessage(page, 0);
  await first.getByRole("button", { name: "Edit", exact: true }).click();
  await page.getByRole("textbox", { name: "Edit message" }).fill("Where is the best bakery?");
  await page.getByRole("button", { name: "Save and resend", exact: true }).click();
  await waitReply(page);
  const rows = messages(page).locator(":scope > li");
  await expect(rows).toHaveCount(2);
  const version = first.getByTestId("version");
  await expect(version).toHaveText("2 / 2");

  // The arrows switch branches, each with its own later messages; the backend agrees.
  await first.getByRole("button", { name: "Previous version", exact: true }).click();
  await expect(version).toHaveText("1 / 2");
  await expect(rows).toHaveCount(4);
  await expect(userMessage(page, 1)).toContainText("And after that?");
  const branched = (await app.call("chat.list"))[0]!;
  expect((await app.call("chat.get", { id: branched.id })).messages.map((m) => m.role)).toEqual([
    "user",
    "assistant",
    "user",
    "assistant",
  ]);
  await first.scrollIntoViewIfNeeded();
  await page.screenshot({
    path: join(RESULTS, "screenshots", `${app.shell}-branched-conversation.png`),
  });
  await first.getByRole("button", { name: "Next version", exact: true }).click();
  await expect(rows).toHaveCount(2);
  await first.getByRole("button", { name: "Previous version", exact: true }).click();
  await expect(rows).toHaveCount(4);

  // A second conversation, newer: it lists first until the first one is pinned.
  await page.getByRole("button", { name: "New chat", exact: true }).click();
  await send(page, "Hello there");
  await waitReply(page);
  const links = conversationList(page).getByRole("list").first().getByRole("link");
  await expect(links.first()).toHaveText("Hello there");
  await conversationItem(page, branched.title)
    .getByRole("button", { name: "Pin", exact: true })
    .click();
  await expect(links.first()).toHaveText(branched.title);
  await expect(links).toHaveText([branched.title, "Hello there"]);

  // Search, case- and accent-insensitive: the hit marks "café" and opens the message.
  const search = page.getByRole("searchbox", { name: "Search conversations" });
  await search.fill("CAFE");
  const results = page.getByRole("list", { name: "Search results" });
  // The title (named after the first message) and the message itself.
  await expect(results.getByRole("link")).toHaveCount(2);
  const hit = results.getByRole("link").filter({ hasText: "You: Where is the best café?" });
  await expect(hit.locator("mark")).toHaveText("café");
  await page.screenshot({
    path: join(RESULTS, "screenshots", `${app.shell}-conversation-search.png`),
  });
  await hit.click();
  await expect(first).toContainText("Where is the best café?");
  await expect(first).toBeInViewport();
  await search.fill("");

  // Export everything as JSON (a download), then import it back: two more conversations, the
  // branch kept; a file that is not JSON is refused with a reason.
  const downloading = page.waitForEvent("download");
  await page.getByRole("button", { name: "Export JSON", exact: true }).click();
  const download = await downloading;
  const path = testInfo.outputPath(download.suggestedFilename());
  await download.saveAs(path);
  const exported = ExportFileSchema.parse(JSON.parse(await readFile(path, "utf8")));
  expect(exported.conversations).toHaveLength(2);

  const importInput = page.getByLabel("Import conversations file");
  await importInput.setInputFiles({
    name: "bad.json",
    mimeType: "application/json",
    buffer: Buffer.from("{nope"),
  });
  await expect(page.getByRole("alert").filter({ hasText: "not JSON" })).toBeVisible();
  await importInput.setInputFiles(path);
  await expect(conversationList(page).getByRole("status")).toHaveText(/Imported 2 conversations/);
  const list = await app.call("chat.list");
  expect(list).toHaveLength(4);
  const copies = list.filter((c) => c.title === branched.title);
  expect(copies).toHaveLength(2);
  const [original, copy] = await Promise.all(copies.map((c) => app.call("chat.get", { id: c.id })));
  expect({ ...copy!, id: original!.id }).toEqual(original);

  // One conversation as Markdown from the header.
  const md = page.waitForEvent("download");
  await page.getByRole("button", { name: "Export as Markdown", exact: true }).click();
  const mdPath = testInfo.outputPath("one.md");
  await (await md).saveAs(mdPath);
  expect(await readFile(mdPath, "utf8")).toMatch(/^# /);
});
