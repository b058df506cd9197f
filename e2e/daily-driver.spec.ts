/**
 * The rough edges a new user hit (issue 18), each walked end to end: where a reopened
 * conversation opens, a message typed right after "New chat", Send with no model, stopping while
 * the model is still thinking, regenerated versions, keyboard (Escape, Ctrl+Shift+O, focus after
 * Stop), download progress, the status when the engine is gone, "Reset to defaults", layout
 * (scroll offsets, long names, titles) and the note about the demo model.
 */
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Locator, Page } from "@playwright/test";
import type { Conversation, Message } from "../core/app/api.ts";
import { alive, expect, test, type RedwingApp } from "./fixtures.ts";
import { E2E_REPO, trickleWeights } from "./hub.ts";
import { loadRandomModel } from "./random-model.ts";
import {
  conversationItem,
  conversationList,
  engineState,
  gotoView,
  lastReply,
  messages,
  numberInput,
  send,
  setNumber,
  startDownload,
  STATS_LINE,
  valueNow,
  waitReady,
  waitReply,
} from "./ui.ts";

function composer(page: Page): Locator {
  return page.getByRole("textbox", { name: "Message", exact: true });
}

async function maxNewTokens(page: Page, value: string): Promise<void> {
  await gotoView(page, "Tuning");
  await setNumber(page, "Max new tokens", value);
  await gotoView(page, "Chat");
}

/** The conversation as the backend has it, by title. */
async function byTitle(app: RedwingApp, title: string): Promise<Conversation> {
  const summary = (await app.call("chat.list")).find((c) => c.title === title);
  expect(summary, `a conversation titled ${title}`).toBeDefined();
  return app.call("chat.get", { id: summary!.id });
}

async function newest(app: RedwingApp): Promise<Conversation> {
  const list = await app.call("chat.list");
  const top = [...list].sort((a, b) => b.updatedAt.localeCompare(a.updatedAt))[0];
  return app.call("chat.get", { id: top!.id });
}

/** Where the app keeps conversations (web mode: REDWING_HOME; Electron: its user data). */
function conversationsDir(app: RedwingApp): string {
  return join(
    app.shell === "web" ? app.home : join(app.home, "electron-user-data"),
    "conversations",
  );
}

test("the demo note, a message typed right after New chat, Ctrl+Shift+O, title width", async ({
  app,
}) => {
  const { page } = app;
  await maxNewTokens(page, "16");
  await waitReady(page, "demo");

  // The demo model is labelled in Chat, points to Models, and can be dismissed for good.
  const note = page.getByRole("note", { name: "About the demo model" });
  await expect(note).toBeVisible();
  await expect(note).toContainText("not an assistant");
  await note.getByRole("button", { name: "Open Models", exact: true }).click();
  await expect(page.getByRole("heading", { level: 1, name: "Models", exact: true })).toBeVisible();
  await gotoView(page, "Chat");
  await note.getByRole("button", { name: "Dismiss", exact: true }).click();
  await expect(note).toHaveCount(0);
  await page.reload();
  await gotoView(page, "Chat");
  await waitReady(page, "demo");
  await expect(note).toHaveCount(0);

  await send(page, "First conversation");
  await waitReply(page);
  // Creating a conversation answers late (a busy app): what is typed meanwhile must still go
  // into the new one, never into the conversation on screen before.
  await page.route("**/api/call/chat.create", async (route) => {
    await new Promise((resolve) => setTimeout(resolve, 1500));
    await route.continue();
  });
  const newChat = conversationList(page).getByRole("button", { name: "New chat", exact: true });
  await expect(newChat).toHaveAttribute("title", /Ctrl\+Shift\+O|⌘⇧O/);
  await newChat.click();
  await composer(page).click();
  await page.keyboard.type("Second conversation");
  await page.keyboard.press("Enter");
  await expect(conversationList(page).getByRole("listitem")).toHaveCount(2);
  expect(await waitReply(page)).toMatch(STATS_LINE);
  const first = await byTitle(app, "First conversation");
  expect(first.messages.map((m) => m.content).filter((_, i) => i % 2 === 0)).toEqual([
    "First conversation",
  ]);
  const second = await byTitle(app, "Second conversation");
  expect(second.messages.map((m) => m.role)).toEqual(["user", "assistant"]);
  await page.unroute("**/api/call/chat.create");

  // Ctrl+Shift+O from another view: Chat, a new empty conversation, focus in the message box.
  await gotoView(page, "Tuning");
  await page.keyboard.press("Control+Shift+O");
  await expect(page.getByRole("heading", { level: 1, name: "Chat", exact: true })).toBeVisible();
  await expect(conversationList(page).getByRole("listitem")).toHaveCount(3);
  await expect(composer(page)).toBeFocused();
  expect((await newest(app)).messages).toEqual([]);

  // Conversation titles use the list's width at 1280 px (not cut after ten characters).
  const title = "Notes about birds of the north";
  await app.call("chat.create", { title });
  const link = conversationItem(page, title).getByRole("link");
  await expect(link).toBeVisible();
  const fits = await link.evaluate((el) => el.scrollWidth <= el.clientWidth);
  expect(fits, `"${title}" is shown whole at 1280 px`).toBe(true);
});

test("a reopened conversation opens at its latest message; Jump to latest when scrolled up", async ({
  app,
}) => {
  let { page } = app;
  await waitReady(page);
  // Two conversations written as an older version stored them (no version fields): a long one
  // and a newer short one, which the app opens first.
  const paragraph =
    "The bird sang from the red branch while the river went on below it, and the morning " +
    "light moved slowly across the valley, field after field, until it reached the house. ";
  const at = (i: number) => new Date(Date.UTC(2026, 0, 1, 0, i)).toISOString();
  const long: Conversation = {
    id: "long-one",
    title: "A long conversation",
    systemPrompt: "",
    createdAt: at(0),
    updatedAt: at(100),
    messages: Array.from({ length: 40 }, (_, i): Message => {
      const n = Math.floor(i / 2) + 1;
      return i % 2 === 0
        ? { id: `u${n}`, role: "user", content: `Question ${n}`, createdAt: at(i) }
        : {
            id: `a${n}`,
            role: "assistant",
            content: `Answer ${n}.\n\n${paragraph.repeat(2)}\n\n${paragraph.repeat(3)}\n\n- one\n- two\n- three`,
            createdAt: at(i),
            model: "demo",
            finishReason: "eos",
          };
    }),
  };
  const short: Conversation = {
    id: "short-one",
    title: "A short one",
    systemPrompt: "",
    createdAt: at(200),
    updatedAt: at(200),
    messages: [{ id: "s1", role: "user", content: "Hi", createdAt: at(200) }],
  };
  await mkdir(conversationsDir(app), { recursive: true });
  for (const c of [long, short]) {
    await writeFile(join(conversationsDir(app), `${c.id}.json`), JSON.stringify(c));
  }
  await app.restart();
  page = app.page;
  await gotoView(page, "Chat");
  await expect(conversationItem(page, "A short one").getByRole("link")).toHaveAttribute(
    "aria-current",
    "true",
  );
  await conversationItem(page, "A long conversation").getByRole("link").click();
  await expect(messages(page).locator(":scope > li")).toHaveCount(40);
  // The element that scrolls the messages (found by what it does, not by a test id).
  const list = messages(page);
  const fromBottom = () =>
    list.evaluate((ol) => {
      const el = ol.closest(".overflow-y-auto")!;
      return Math.round(el.scrollHeight - el.scrollTop - el.clientHeight);
    });
  await expect.poll(fromBottom, { message: "opens at the latest message" }).toBeLessThan(2);
  await expect(lastReply(page)).toBeInViewport();
  const jump = page.getByRole("button", { name: /Jump to latest/ });
  await expect(jump).toBeHidden();
  // Still there a moment later (rows laid out late must not leave it above the bottom).
  await page.waitForTimeout(500);
  expect(await fromBottom()).toBeLessThan(2);

  await list.evaluate((ol) => ol.closest(".overflow-y-auto")!.scrollTo({ top: 0 }));
  await expect(jump).toBeVisible();
  await expect(lastReply(page)).not.toBeInViewport();
  await jump.click();
  await expect.poll(fromBottom).toBeLessThan(2);
  await expect(lastReply(page)).toBeInViewport();
  await expect(jump).toBeHidden();
});

test("regenerate keeps the earlier replies, with arrows between them, across a reload", async ({
  app,
}) => {
  const { page } = app;
  await maxNewTokens(page, "12");
  await gotoView(page, "Tuning");
  await setNumber(page, "Temperature", "1");
  await gotoView(page, "Chat");
  await waitReady(page);
  await send(page, "Tell me a fortune.");
  await waitReply(page);
  const first = (await newest(app)).messages[1]!;

  const reply = lastReply(page);
  const regenerate = async () => {
    const before = (await newest(app)).messages[1]!.id;
    await reply.getByRole("button", { name: "Regenerate", exact: true }).click();
    await expect
      .poll(async () => {
        const m = (await newest(app)).messages[1]!;
        return m.id !== before && m.finishReason !== undefined;
      })
      .toBe(true);
    await waitReply(page);
    return (await newest(app)).messages[1]!;
  };
  const second = await regenerate();
  const version = reply.getByTestId("version");
  await expect(version).toHaveText("2 / 2");
  await expect(messages(page).locator(":scope > li")).toHaveCount(2);

  await reply.getByRole("button", { name: "Previous version", exact: true }).click();
  await expect(version).toHaveText("1 / 2");
  await expect
    .poll(async () => (await newest(app)).messages[1]!.id, { message: "the first reply shown" })
    .toBe(first.id);
  const stored = (await newest(app)).messages[1]!;
  expect(stored.content).toBe(first.content);
  expect(stored.stats?.line).toBe(first.stats?.line);
  expect(stored.otherVersions?.map((v) => v.id)).toEqual([second.id]);
  expect(await reply.getByTestId("stats-line").innerText()).toBe(first.stats?.line);

  await page.reload();
  await gotoView(page, "Chat");
  await expect(version).toHaveText("1 / 2");
  await expect(reply.getByRole("button", { name: "Previous version", exact: true })).toBeDisabled();
  await reply.getByRole("button", { name: "Next version", exact: true }).click();
  await expect(version).toHaveText("2 / 2");
  await expect.poll(async () => (await newest(app)).messages[1]!.id).toBe(second.id);

  const third = await regenerate();
  await expect(version).toHaveText("3 / 3");
  expect(
    [...(third.otherVersions ?? []).map((v) => v.id), third.id],
    "every reply kept, oldest first",
  ).toEqual([first.id, second.id, third.id]);
});

test("keyboard: Escape stops a reply, Stop keeps the focus; stopping while thinking stores no statistics", async ({
  app,
}) => {
  const { page } = app;
  await maxNewTokens(page, "30000");
  await waitReady(page);
  await loadRandomModel(app); // writes until stopped
  const stop = page.getByRole("button", { name: "Stop", exact: true });

  // Escape, with the focus wherever the Send click left it.
  await send(page, "Write forever.");
  await expect.poll(async () => (await lastReply(page).innerText()).length).toBeGreaterThan(30);
  await page.keyboard.press("Escape");
  await expect(stop).toHaveCount(0);
  await expect
    .poll(async () => (await newest(app)).messages.at(-1)?.finishReason)
    .toBe("cancelled");

  // Stop from the keyboard: the focus stays in the message box, not on the page.
  await send(page, "Again, forever.");
  await expect.poll(async () => (await lastReply(page).innerText()).length).toBeGreaterThan(30);
  await stop.focus();
  await page.keyboard.press("Enter");
  await expect(stop).toHaveCount(0);
  await expect(composer(page)).toBeFocused();

  // Stopped before the first token (a long prompt is still being read): no "0 tokens" line.
  const long = "the quick brown fox jumps over the lazy dog and ".repeat(300);
  await composer(page).fill(long);
  await composer(page).press("Enter");
  const reply = lastReply(page);
  await expect(reply).toContainText("Thinking");
  await page.keyboard.press("Escape");
  await expect(stop).toHaveCount(0);
  await expect
    .poll(async () => (await newest(app)).messages.at(-1)?.finishReason)
    .toBe("cancelled");
  const last = (await newest(app)).messages.at(-1)!;
  expect(last.content).toBe("");
  expect(last.stats, "no statistics for a reply with no tokens").toBeUndefined();
  await expect(reply.getByTestId("stats-line")).toHaveCount(0);
  await expect(reply).toContainText("Stopped.");
});

test("no model loaded: Send is off with a hint, and nothing is stored", async ({ app }) => {
  const { page } = app;
  await gotoView(page, "Chat");
  await waitReady(page);
  await app.call("engine.unload");
  await expect(engineState(page)).toContainText("no model loaded");
  await composer(page).fill("Hello?");
  const sendButton = page.getByRole("button", { name: "Send", exact: true });
  await expect(sendButton).toBeDisabled();
  await expect(page.getByText("No model is loaded")).toBeVisible();
  await composer(page).press("Enter");
  await page.waitForTimeout(500);
  await expect(composer(page)).toHaveValue("Hello?");
  expect(await app.call("chat.list")).toEqual([]);
  // The API refuses the turn too, storing nothing.
  const c = await app.call("chat.create", {});
  await expect(app.call("chat.send", { conversationId: c.id, content: "Hello?" })).rejects.toThrow(
    /no_model/,
  );
  expect((await app.call("chat.get", { id: c.id })).messages).toEqual([]);
  await page.getByRole("button", { name: "Open Models", exact: true }).click();
  await expect(page.getByRole("heading", { level: 1, name: "Models", exact: true })).toBeVisible();
});

test("the engine killed: the status is not ready, its Restart recovers; killed again, Restart engine in the error recovers", async ({
  app,
}) => {
  const { page } = app;
  await gotoView(page, "Chat");
  await waitReady(page);
  const before = await app.call("engine.status");
  process.kill(before.pid!, "SIGKILL");
  await expect.poll(() => alive(before.pid!)).toBe(false);
  const header = page.getByRole("banner");
  await expect(engineState(page)).toContainText("crashed", { timeout: 30_000 });
  await expect(engineState(page)).not.toContainText("ready");
  await expect(page.getByRole("button", { name: "Send", exact: true })).toBeDisabled();
  await header.getByRole("button", { name: "Restart", exact: true }).click();
  await waitReady(page);
  await expect(header.getByRole("button", { name: "Restart", exact: true })).toHaveCount(0);
  const restarted = await app.call("engine.status");
  expect(restarted.pid).not.toBe(before.pid);

  // Killed again: the error shows with "Restart engine", which recovers, and chat works.
  process.kill(restarted.pid!, "SIGKILL");
  await expect.poll(() => alive(restarted.pid!)).toBe(false);
  const restart = page.getByRole("button", { name: "Restart engine", exact: true }).first();
  const alert = page.getByRole("alert").filter({ has: restart });
  await expect(alert.first()).toBeVisible({ timeout: 30_000 });
  await restart.click();
  await waitReady(page);
  await expect(alert).toHaveCount(0);
  const after = await app.call("engine.status");
  expect(after.pid).not.toBe(restarted.pid);
  expect(alive(after.pid!)).toBe(true);
  await send(page, "Are you back?");
  expect(await waitReply(page)).toMatch(STATS_LINE);
});

test("Reset to defaults asks first; views start at the top; a long model name fits the sidebar", async ({
  app,
}) => {
  const { page } = app;
  await waitReady(page);
  await gotoView(page, "Tuning");
  await setNumber(page, "Temperature", "0.7");
  const reset = page.getByRole("button", { name: "Reset to defaults", exact: true });
  await reset.click();
  const dialog = page.getByRole("dialog");
  await expect(dialog).toContainText("Reset every setting");
  await dialog.getByRole("button", { name: "Cancel", exact: true }).click();
  await expect(dialog).toHaveCount(0);
  expect((await app.call("settings.get")).sampling.temperature).toBe(0.7);
  await reset.click();
  await dialog.getByRole("button", { name: "Reset settings", exact: true }).click();
  await expect.poll(async () => (await app.call("settings.get")).sampling.temperature).toBe(0.2);
  await expect(numberInput(page, "Temperature")).toHaveValue("0.2");

  // Scrolled to the bottom of Tuning, then Models: Models starts at its top.
  await expect(numberInput(page, "Temperature")).toBeVisible();
  const scroller = page.locator("main > div.flex-1");
  // (Parts of the view arrive late, the memory plan: scroll until it is scrolled.)
  await expect
    .poll(() =>
      scroller.evaluate((el) => {
        el.scrollTo({ top: el.scrollHeight });
        return el.scrollTop;
      }),
    )
    .toBeGreaterThan(100);
  await gotoView(page, "Models");
  expect(await scroller.evaluate((el) => el.scrollTop)).toBe(0);

  const name = "random-words-with-a-rather-long-name-for-the-sidebar-q8";
  await loadRandomModel(app, name);
  const state = engineState(page);
  await expect(state).toHaveAttribute("title", new RegExp(name));
  const box = (await state.boundingBox())!;
  const header = (await page.getByRole("banner").boundingBox())!;
  expect(box.x + box.width, "the name ends inside the sidebar").toBeLessThanOrEqual(
    header.x + header.width,
  );
});

test("download progress: an honest planning state, KiB/s, resume keeps the bar; remove, then one card", async ({
  app,
  hub,
}) => {
  const { page } = app;
  trickleWeights(hub);
  await gotoView(page, "Models");
  const downloads = page.getByRole("region", { name: "Downloads" });
  // Every state the card shows, as it is drawn.
  await page.evaluate(() => {
    const seen: { text: string; now: string | null; status: string }[] = [];
    (window as unknown as { seen: typeof seen }).seen = seen;
    const record = () => {
      const card = document.querySelector('section[aria-label="Downloads"] article');
      if (!card) return;
      const bar = card.querySelector('[role="progressbar"]');
      const status = card.querySelector("p > span:first-child")?.textContent ?? "";
      const text = (card as HTMLElement).innerText;
      const now = bar?.getAttribute("aria-valuenow") ?? null;
      const prev = seen.at(-1);
      if (!prev || prev.text !== text || prev.now !== now) seen.push({ text, now, status });
    };
    new MutationObserver(record).observe(document.body, {
      subtree: true,
      childList: true,
      characterData: true,
      attributes: true,
    });
  });
  const seen = () =>
    page.evaluate(
      () =>
        (window as unknown as { seen: { text: string; now: string | null; status: string }[] })
          .seen,
    );
  await startDownload(page, E2E_REPO);
  const item = downloads.getByRole("article").first();
  const bar = item.getByRole("progressbar");
  await expect.poll(() => valueNow(bar)).toBeGreaterThan(5);
  await expect(item).toContainText(/\d+(\.\d+)? KiB\/s/);
  await item.getByRole("button", { name: "Pause", exact: true }).click();
  await expect(item.getByRole("button", { name: "Resume", exact: true })).toBeVisible();
  const paused = await valueNow(bar);
  hub.faults.length = 0; // after the pause, the rest at full speed
  const mark = (await seen()).length;
  await item.getByRole("button", { name: "Resume", exact: true }).click();
  const name = (await app.call("models.downloads"))[0]!.name;
  const installed = page
    .getByRole("region", { name: "Installed models" })
    .getByRole("article", { name, exact: true });
  await expect(installed).toBeVisible({ timeout: 90_000 });

  const all = await seen();
  const texts = all.map((s) => s.text).join("\n---\n");
  expect(texts, "never a size of nothing").not.toMatch(/0 B of 0 B/);
  expect(texts, "never 0.0 MiB/s").not.toMatch(/(^|[^\d.])0\.0 [KMG]i?B\/s/);
  expect(texts, "one unit family: binary").not.toMatch(/\d (kB|MB|GB)\b/);
  expect(all.some((s) => /Looking up|Planning|Checking/.test(s.status))).toBe(true);
  // After Resume, until bytes flow again, the bar stays where the pause left it.
  const afterResume = all.slice(mark);
  const flowing = afterResume.findIndex((s) => /Downloading|Finishing|Installed/.test(s.status));
  const beforeBytes = afterResume.slice(0, flowing < 0 ? undefined : flowing);
  expect(beforeBytes.length, "states shown between Resume and the download").toBeGreaterThan(0);
  for (const s of beforeBytes) expect(Number(s.now), `after resume: ${s.status}`).toBe(paused);

  // Remove it: its finished card does not say "Installed" any more; a new download is one card.
  hub.faults.length = 0;
  await installed.getByRole("button", { name: "Remove", exact: true }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Remove model", exact: true }).click();
  await expect(installed).toHaveCount(0);
  await expect(downloads.getByRole("article", { name, exact: true })).toHaveCount(0);
  await startDownload(page, E2E_REPO);
  await expect(installed).toBeVisible({ timeout: 90_000 });
  await expect(downloads.getByRole("article", { name, exact: true })).toHaveCount(1);
  expect((await app.call("models.downloads")).filter((d) => d.name === name)).toHaveLength(1);
});
