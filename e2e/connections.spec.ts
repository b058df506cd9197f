/**
 * Connections (issue 20): a second Redwing (`redwing serve` in its own process) added as an
 * OpenAI-compatible endpoint in the Connections view, its model picked in Chat, a reply that
 * streams with the statistics line measured on this side, then the plain error (with Retry) once
 * that server is stopped. The Connections view and the chat are saved to
e2e/results/connections.png and connections-chat.png.
 */
import { join } from "node:path";
import { startRemoteServe } from "../testkit/remote-serve.ts";
import { expect, RESULTS, test } from "./fixtures.ts";
import { gotoView, lastReply, send, STATS_LINE, waitReply } from "./ui.ts";

test("a second redwing serve: add it, chat with its model, and a clear error once it stops", async ({
  app,
}) => {
  const { page } = app;
  // Its own home: one engine process per model directory.
  const remote = await startRemoteServe(join(app.home, "remote"));
  try {
    await app.call("settings.update", { sampling: { maxNewTokens: 8 } });

    await gotoView(page, "Connections");
    const form = page.getByRole("form", { name: "Add a connection" });
    await form.getByRole("textbox", { name: "Name" }).fill("Second Redwing");
    await form.getByRole("textbox", { name: "Base URL" }).fill(remote.url);
    await form.getByRole("button", { name: "Add connection" }).click();
    const card = page.getByRole("listitem", { name: "Second Redwing" });
    await expect(card.getByTestId("connection-models")).toHaveText("demo");
    await expect(card).toContainText("no API key");
    await page.screenshot({ path: join(RESULTS, "connections.png") });

    await gotoView(page, "Chat");
    const [connection] = await app.call("connections.list");
    await page.getByTestId("model-picker").selectOption(`remote:${connection!.id}|demo`);
    await expect(page.getByRole("heading", { level: 1, name: "Chat" })).toBeVisible();
    await send(page, "Hello");
    const line = await waitReply(page);
    expect(line).toMatch(STATS_LINE);
    expect(line).toContain("(server's count)");
    await expect(lastReply(page)).toContainText("demo (Second Redwing)");
    await page.screenshot({ path: join(RESULTS, "connections-chat.png") });

    await remote.stop();
    await send(page, "Are you still there?");
    const alert = lastReply(page).getByRole("alert");
    await expect(alert).toContainText(
      `Could not connect to ${remote.url}: the connection was refused. Is the server running at ${remote.url}?`,
    );
    await expect(alert.getByRole("button", { name: "Retry" })).toBeVisible();
  } finally {
    await remote.stop("SIGKILL");
  }
});
