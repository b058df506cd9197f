/**
 * Model discovery in the Models view, against the fake hub: a search lists the models Redwing
 * runs with their download size, memory and fit, greys the ones it cannot run with the reason,
 * and installs one from its result; the memory shown before the install is the figure the
 * installed model gets. One app instance for every check, and a screenshot of the view.
 */
import { readFile, readdir } from "node:fs/promises";
import { join } from "node:path";
import { expect, RESULTS, test } from "./fixtures.ts";
import { E2E_REPO, ROOT } from "./hub.ts";
import { gotoView } from "./ui.ts";

const MOE_REPO = "e2e-test/tiny-gemma4-moe-4bit";
const LLAMA_REPO = "e2e-test/tiny-llama";
const GGUF_REPO = "e2e-test/tiny-gemma3-gguf";
const GATED_REPO = "e2e-test/tiny-gemma4-gated";

test("search the hub: runnable models with size, memory and fit; why not the others; install one", async ({
  app,
  hub,
}) => {
  const moeDir = join(ROOT, "fixtures", "gemma4-moe", "mlx");
  const moe = new Map<string, Buffer>();
  for (const name of await readdir(moeDir)) moe.set(name, await readFile(join(moeDir, name)));
  hub.addRepo(MOE_REPO, moe, { info: { downloads: 300, cardData: { license: "apache-2.0" } } });
  hub.addRepo(
    LLAMA_REPO,
    new Map([
      ["config.json", Buffer.from('{"architectures":["LlamaForCausalLM"],"model_type":"llama"}')],
      ["model.safetensors", Buffer.alloc(64)],
    ]),
    { info: { downloads: 100 } },
  );
  hub.addRepo(GGUF_REPO, new Map([["tiny-Q4_K_M.gguf", Buffer.alloc(64)]]), {
    info: { downloads: 50 },
  });
  hub.addRepo(GATED_REPO, moe, { token: "hf_e2e_gated", info: { downloads: 10 } });

  const { page } = app;
  await gotoView(page, "Models");
  const search = page.getByRole("searchbox");
  await search.fill("tiny");
  const results = page.getByRole("list", { name: "Search results" });
  const card = (repo: string) => results.getByRole("listitem", { name: repo, exact: true });

  // Runnable: size, memory and fit; the Gemma 3 repository of the other specs is runnable too.
  await expect(card(MOE_REPO)).toContainText("MLX 4/8-bit");
  await expect(card(MOE_REPO)).toContainText("fits this machine");
  await expect(card(MOE_REPO)).toContainText("apache-2.0");
  await expect(card(E2E_REPO).getByRole("button", { name: "Install" })).toBeEnabled();
  // Not runnable: greyed, with the reason, and nothing to install.
  await expect(card(LLAMA_REPO)).toHaveAttribute("aria-disabled", "true");
  await expect(card(LLAMA_REPO)).toContainText("Llama architecture: not supported yet");
  await expect(card(GGUF_REPO)).toContainText("GGUF only: Redwing reads safetensors");
  await expect(card(GGUF_REPO).getByRole("button", { name: "Install" })).toHaveCount(0);
  await expect(card(GATED_REPO)).toContainText("needs HF_TOKEN");
  // Most downloaded first.
  await expect(results.getByRole("listitem").first()).toHaveAccessibleName(MOE_REPO);

  await page
    .getByRole("region", { name: "Search the hub" })
    .evaluate((el) => el.scrollIntoView({ block: "start" }));
  await page.screenshot({
    path: join(RESULTS, "screenshots", `${app.shell}-discover-1280x800.png`),
  });

  // The hub's errors are said plainly, and Retry searches again.
  const region = page.getByRole("region", { name: "Search the hub" });
  hub.faults.push({ on: "api", path: "search", action: { kind: "status", status: 429 }, times: 1 });
  await search.fill("tiny-gemma");
  await expect(region.getByRole("alert")).toContainText("is limiting requests (429");
  await expect(results).toHaveCount(0);
  await region.getByRole("button", { name: "Retry", exact: true }).click();
  await expect(card(E2E_REPO)).toBeVisible();
  await expect(region.getByRole("alert")).toHaveCount(0);

  // The figure before the install is the one the installed model gets.
  const found = await app.call("models.search", { query: E2E_REPO });
  const before = found.models.find((m) => m.repo === E2E_REPO)!;
  expect(before.status).toBe("runnable");
  expect(before.memoryBytes).toBeGreaterThan(0);

  await card(E2E_REPO).getByRole("button", { name: "Install" }).click();
  await expect(card(E2E_REPO)).toContainText("Installed", { timeout: 90_000 });
  const name = "e2e-test--tiny-gemma3";
  await expect(
    page.getByRole("region", { name: "Installed models" }).getByRole("article", { name }),
  ).toBeVisible();
  const installed = (await app.call("models.list")).find((m) => m.name === name)!;
  expect(installed.memoryEstimateBytes).toBe(before.memoryBytes);
  expect(installed.sizeBytes).toBeGreaterThan(0);
});
