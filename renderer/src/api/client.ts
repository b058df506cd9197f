/**
 * Picks the transport: the Electron preload's bridge when present, else HTTP + server-sent events
 * (web mode). A dev build opened with `?mock` uses an in-memory fake backend instead; production
 * builds drop that branch (and the mock module) entirely.
 */
import { createElectronClient } from "./electron.ts";
import { createHttpClient, takeToken } from "./http.ts";
import type { RendererClient } from "./types.ts";

export async function createClient(): Promise<RendererClient> {
  if (import.meta.env.DEV && new URLSearchParams(window.location.search).has("mock")) {
    const { createMockClient } = await import("./mock.ts");
    return createMockClient();
  }
  if (window.redwingBridge) return createElectronClient(window.redwingBridge);
  return createHttpClient(takeToken());
}
