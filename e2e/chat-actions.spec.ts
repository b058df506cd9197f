/**
 * The actions around a chat, as a person uses them: renaming and deleting conversations, editing,
 * regenerating and copying messages, the per-conversation system prompt, the OpenAI-compatible
 * server switch, and reaching the views with the keyboard alone. Each test starts the app on a
 * fresh data directory (e2e/fixtures.ts); replies are kept short to keep the run quick.
 */
import { freePort } from "../testkit/free-port.ts";
import type { Page } from "@playwright/test";
import type { Conversation, Message } from "../core/app/api.ts";
import { expect, test, type RedwingApp } from "./fixtures.ts";
import {
  allowClipboard,
  conversationItem,
  conversationList,
  gotoView,
  lastReply,
  messages,
  readClipboard,
  send,
  setNumber,
  STATS_LINE,
  waitReady,
  waitReply,
} from "./ui.ts";

/** Short replies: at most this many tokens. */
const MAX_TOKENS = "16";

async function shortReplies(page: Page, temperature?: string): Promise<void> {
  await gotoView(page, "Tuning");
  await setNumber(page, "Max new tokens", MAX_TOKENS);
  if (temperature !== undefined) await setNumber(page, "Temperature", temperature);
  await gotoView(page, "Chat");
}

/** The current conversation as the backend has it (the most recently updated one). */
async function latest(app: RedwingApp): Promise<Conversation> {
  const list = await app.call("chat.list");
  const newest = [...list].sort((a, b) => b.updatedAt.localeCompare(a.updatedAt))[0];
  expect(newest, "a conversation exists").toBeDefined();
  return app.call("chat.get", { id: newest!.id });
}

function lastAssistant(c: Conversation): Message {
  const m = c.messages.at(-1);
  expect(m?.role, "the conversation ends with a reply").toBe("assistant");
  return m!;
}

test("conversations: rename and delete, both kept across a reload", async ({ app }) => {
  const { page } = app;
  await shortReplies(page);
  await waitReady(page);
  const list = conversationList(page);
  const newChat = list.getByRole("button", { name: "New chat", exact: true });

  await newChat.click();
  await send(page, "First conversation");
  await waitReply(page);
  await newChat.click();
  await send(page, "Second conversation");
  await waitReply(page);
  await expect(list.getByRole("listitem")).toHaveCount(2);

  // Rename the first: its Rename button opens a title box; Enter saves.
  const first = conversationItem(page, "First conversation");
  await first.getByRole("button", { name: "Rename", exact: true }).click();
  const title = list.getByRole("textbox", { name: "Conversation title", exact: true });
  await expect(title).toBeFocused();
  await title.fill("Notes about birds");
  await title.press("Enter");
  await expect(title).toHaveCount(0);
  await expect(conversationItem(page, "Notes about birds")).toHaveCount(1);
  await expect(conversationItem(page, "First conversation")).toHaveCount(0);
  await page.reload();
  await gotoView(page, "Chat");
  await expect(conversationItem(page, "Notes about birds")).toHaveCount(1);
  await expect(conversationItem(page, "Second conversation")).toHaveCount(1);
  expect((await app.call("chat.list")).map((c) => c.title).sort()).toEqual([
    "Notes about birds",
    "Second conversation",
  ]);

  // Delete the second: a confirmation first, then it is gone, the renamed one stays.
  const second = conversationItem(page, "Second conversation");
  await second.getByRole("button", { name: "Delete", exact: true }).click();
  const dialog = page.getByRole("dialog");
  await expect(dialog).toBeVisible();
  await dialog.getByRole("button", { name: "Delete conversation", exact: true }).click();
  await expect(dialog).toHaveCount(0);
  await expect(second).toHaveCount(0);
  await expect(list.getByRole("listitem")).toHaveCount(1);
  await page.reload();
  await gotoView(page, "Chat");
  await expect(conversationItem(page, "Notes about birds")).toHaveCount(1);
  await expect(conversationItem(page, "Second conversation")).toHaveCount(0);
  expect((await app.call("chat.list")).map((c) => c.title)).toEqual(["Notes about birds"]);
});

test("messages: edit and resend, regenerate at temperature 0, copy", async ({ app }) => {
  const { page } = app;
  await shortReplies(page, "0");
  await waitReady(page);
  const list = messages(page);
  const newChat = page.getByRole("button", { name: "New chat", exact: true });

  // What the model answers to the edited text, in a conversation of its own. The engine reuses
  // the cached prefix a new prompt shares with the previous one ("...Name three") and runs only
  // the rest, and that is not bit for bit a fresh prompt's run: the CPU backend picks its kernels
  // by row count (a product of one row, such as an expert with one token of the chunk, takes the
  // decode product). At temperature 0 a near tie can then pick another word: on an AMD EPYC with
  // AVX-512 VNNI a fresh reference ended "shall work", the edited reply "shall be". So the
  // reference is made the way the edit is, after a conversation that starts with the same words,
  // and both replies run from the same cached rows.
  await newChat.click();
  await send(page, "Name three colours.");
  await waitReply(page);
  await newChat.click();
  await send(page, "Name three animals.");
  await waitReply(page);
  const reference = lastAssistant(await latest(app)).content;
  expect(reference.length).toBeGreaterThan(0);

  // Two exchanges, then edit the first question: a new branch, with nothing after it yet.
  await newChat.click();
  await send(page, "Name three colours.");
  await waitReply(page);
  await send(page, "And three more.");
  await waitReply(page);
  await expect(list.locator(":scope > li")).toHaveCount(4);
  const before = await latest(app);
  const firstUser = list.locator('li[data-role="user"]').first();
  await firstUser.getByRole("button", { name: "Edit", exact: true }).click();
  const box = list.getByRole("textbox", { name: "Edit message", exact: true });
  await expect(box).toHaveValue("Name three colours.");
  await box.fill("Name three animals.");
  await list.getByRole("button", { name: "Save and resend", exact: true }).click();
  await expect(box).toHaveCount(0);
  await expect.poll(async () => (await latest(app)).messages.at(-1)?.finishReason).toBeTruthy();
  expect(await waitReply(page)).toMatch(STATS_LINE);
  await expect(list.locator(":scope > li")).toHaveCount(2);
  await expect(list.locator('li[data-role="user"]')).toHaveText(/Name three animals\./);
  const edited = await latest(app);
  expect(edited.id).toBe(before.id);
  expect(edited.messages.map((m) => [m.role, m.role === "user" ? m.content : ""])).toEqual([
    ["user", "Name three animals."],
    ["assistant", ""],
  ]);
  const editedReply = lastAssistant(edited);
  expect(before.messages.map((m) => m.id)).not.toContain(editedReply.id);
  expect(editedReply.content, "the reply answers the edited text").toBe(reference);
  expect(editedReply.content, "not the old reply").not.toBe(before.messages[1]!.content);

  // Regenerate: a new reply (new statistics) in place of the last one. A regenerate reuses the
  // whole cached prompt but its last token, which runs alone (the decode product), where the
  // edited reply ran it inside a chunk: not bit for bit the same rows, so at temperature 0 a near
  // tie may pick another word than the edited reply did (on an Intel Xeon with AMX it ended
  // "shall be" where the edit had "shall work"). Two regenerates run the same rows, so the
  // second must give the first one's text.
  const regenerate = async (previousId: string): Promise<Message> => {
    await lastReply(page).getByRole("button", { name: "Regenerate", exact: true }).click();
    await expect
      .poll(async () => {
        const last = (await latest(app)).messages.at(-1);
        return last?.id !== previousId && last?.finishReason !== undefined;
      })
      .toBe(true);
    const statsLine = await waitReply(page);
    const reply = lastAssistant(await latest(app));
    expect(reply.finishReason).not.toBe("error");
    expect(reply.content.length).toBeGreaterThan(0);
    expect(statsLine).toMatch(STATS_LINE);
    expect(statsLine).toBe(reply.stats?.line);
    await expect(list.locator(":scope > li")).toHaveCount(2);
    return reply;
  };
  const firstRegenerated = await regenerate(editedReply.id);
  expect(firstRegenerated.stats?.line).not.toBe(editedReply.stats?.line);
  const regenerated = await regenerate(firstRegenerated.id);
  expect(regenerated.id).not.toBe(firstRegenerated.id);
  expect(regenerated.content, "the same text at temperature 0").toBe(firstRegenerated.content);

  // Copy: the reply's text on the clipboard, then the question's.
  await allowClipboard(page);
  const reply = lastReply(page);
  await reply.getByRole("button", { name: "Copy", exact: true }).click();
  await expect(reply.getByRole("status")).toHaveText("Copied");
  expect(await readClipboard(page)).toBe(regenerated.content);
  await list
    .locator('li[data-role="user"]')
    .getByRole("button", { name: "Copy", exact: true })
    .click();
  await expect.poll(() => readClipboard(page)).toBe("Name three animals.");
});

test("system prompt: kept per conversation across a reload; new ones start with the default", async ({
  app,
}) => {
  const { page } = app;
  // The default for new conversations is set in Tuning, saved when the field is left.
  await gotoView(page, "Tuning");
  const defaultField = page.getByRole("textbox", { name: "Default system prompt", exact: true });
  await defaultField.fill("Answer briefly.");
  await defaultField.press("Tab");
  await expect
    .poll(async () => (await app.call("settings.get")).systemPrompt)
    .toBe("Answer briefly.");
  // Before any conversation exists, Chat shows the default it will start with.
  await gotoView(page, "Chat");
  const prompt = page.getByRole("textbox", { name: "System prompt", exact: true });
  await expect(prompt).toHaveValue("Answer briefly.");
  await page.getByRole("button", { name: "New chat", exact: true }).click();
  await expect(conversationList(page).getByRole("listitem")).toHaveCount(1);
  // The new conversation is the current one (until then typing edits the draft for the next).
  await expect(
    page.getByRole("region", { name: "Conversation" }).locator("p").first(),
  ).toContainText("New chat");
  await expect(prompt).toHaveValue("Answer briefly.");
  // A reload right after typing (no pause, focus still in the field) keeps the edit: it is
  // saved as the page goes away.
  await prompt.fill("You are a pirate. Answer in rhymes.");
  await page.reload();
  const [summary] = await app.call("chat.list");
  await expect
    .poll(async () => (await app.call("chat.get", { id: summary!.id })).systemPrompt)
    .toBe("You are a pirate. Answer in rhymes.");
  await page.reload();
  await gotoView(page, "Chat");
  await expect(prompt).toHaveValue("You are a pirate. Answer in rhymes.");

  await page.getByRole("button", { name: "New chat", exact: true }).click();
  await expect(conversationList(page).getByRole("listitem")).toHaveCount(2);
  await expect(prompt).toHaveValue("Answer briefly.");
  const created = (await app.call("chat.list")).find((c) => c.id !== summary!.id);
  expect((await app.call("chat.get", { id: created!.id })).systemPrompt).toBe("Answer briefly.");
  // The first conversation still has its own.
  expect((await app.call("chat.get", { id: summary!.id })).systemPrompt).toBe(
    "You are a pirate. Answer in rhymes.",
  );
});

test("server: the switch serves the loaded model on the chosen port; Copy example", async ({
  app,
}) => {
  const { page } = app;
  await gotoView(page, "Server");
  await waitReady(page);
  const port = await freePort();
  await setNumber(page, "Port", String(port));
  await expect.poll(async () => (await app.call("settings.get")).server.port).toBe(port);

  const toggle = page.getByRole("switch", { name: "OpenAI-compatible server", exact: true });
  const address = page.getByTestId("server-url");
  await expect(toggle).toHaveAttribute("aria-checked", "false");
  await expect(toggle).toBeEnabled();
  const engine = await app.call("engine.status");
  await toggle.click();
  await expect(toggle).toHaveAttribute("aria-checked", "true", { timeout: 60_000 });
  const url = `http://127.0.0.1:${port}/v1`;
  await expect(address).toHaveText(url);

  const models = (await (await fetch(`${url}/models`)).json()) as { data: { id: string }[] };
  expect(models.data.length).toBeGreaterThan(0);
  const modelId = models.data[0]!.id;
  const res = await fetch(`${url}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: modelId,
      messages: [{ role: "user", content: "Hello!" }],
      max_tokens: 4,
    }),
  });
  expect(res.status).toBe(200);
  const completion = (await res.json()) as {
    choices: { message: { role: string; content: string } }[];
    usage: { completion_tokens: number };
  };
  expect(completion.choices[0]?.message.role).toBe("assistant");
  expect(completion.usage.completion_tokens).toBeGreaterThan(0);
  expect(completion.usage.completion_tokens).toBeLessThanOrEqual(4);
  // One engine serves both: the app's engine process is the same one.
  expect((await app.call("engine.status")).pid).toBe(engine.pid);

  await allowClipboard(page);
  const example = page.locator("pre");
  await expect(example).toContainText(url);
  await page.getByRole("button", { name: "Copy example", exact: true }).click();
  await expect.poll(() => readClipboard(page)).toContain(`curl ${url}/chat/completions`);
  expect((await readClipboard(page)).trim()).toBe((await example.innerText()).trim());

  await toggle.click();
  await expect(toggle).toHaveAttribute("aria-checked", "false");
  await expect(address).not.toHaveText(url);
  await expect
    .poll(() =>
      fetch(`${url}/models`).then(
        () => "answered",
        () => "refused",
      ),
    )
    .toBe("refused");
});

test("keyboard: Tab reaches the main navigation, Enter opens Tuning, focus is visible", async ({
  app,
}) => {
  const { page } = app;
  await page.reload();
  await expect(page.getByRole("heading", { level: 1 }).first()).toBeVisible();
  const focused = () =>
    page.evaluate(() => {
      const el = document.activeElement;
      const nav = el?.closest('nav[aria-label="Main"]');
      return { inMain: !!nav && el?.tagName === "BUTTON", text: el?.textContent?.trim() ?? "" };
    });
  let presses = 0;
  for (; presses < 30; presses++) {
    await page.keyboard.press("Tab");
    if ((await focused()).inMain) break;
  }
  expect((await focused()).inMain, "Tab reached a button of the Main navigation").toBe(true);
  expect((await focused()).text, "the first one reached").toMatch(/Models$/);
  for (; presses < 40 && !/Tuning$/.test((await focused()).text); presses++) {
    await page.keyboard.press("Tab");
  }
  const tuning = page.getByRole("navigation", { name: "Main" }).getByRole("button", {
    name: "Tuning",
    exact: true,
  });
  await expect(tuning).toBeFocused();
  await expect.poll(() => focusRing(page)).toBe(true);
  await page.keyboard.press("Enter");
  await expect(page.getByRole("heading", { level: 1, name: "Tuning", exact: true })).toBeVisible();
  await expect(tuning).toHaveAttribute("aria-current", "page");
  await expect(tuning).toBeFocused();
  expect(await focusRing(page), "a visible focus style after Enter").toBe(true);
});

/**
 * Whether the focused element draws a focus indicator: an outline or a box shadow that a button
 * of the same kind without focus (the Main navigation's "Live") does not have.
 */
function focusRing(page: Page): Promise<boolean> {
  return page.evaluate(() => {
    const el = document.activeElement;
    const other = [...document.querySelectorAll('nav[aria-label="Main"] button')].find((b) =>
      b.textContent?.trim().endsWith("Live"),
    );
    if (!el || el === document.body || !other || other === el) return false;
    const ring = (e: Element) => {
      const s = getComputedStyle(e);
      const outline = s.outlineStyle !== "none" && parseFloat(s.outlineWidth) > 0;
      return `${outline ? `${s.outlineStyle} ${s.outlineWidth} ${s.outlineColor}` : "none"} | ${s.boxShadow}`;
    };
    return ring(el) !== "none | none" && ring(el) !== ring(other);
  });
}
