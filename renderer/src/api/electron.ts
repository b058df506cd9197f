/**
 * The Electron transport: the preload script exposes `window.redwingBridge` (contextBridge), whose
 * `call` goes through ipcRenderer.invoke and answers a CallOutcome, and whose `onEvent` delivers
 * the main process's events. Everything crossing the bridge is validated again here.
 */
import { AppCallError, type AppEvent, type Method } from "../../../core/app/api.ts";
import type { RendererClient } from "./types.ts";
import { appError, checkResult, parseEvent, toCallError } from "./validate.ts";

export interface RedwingBridge {
  readonly shell: "electron";
  call(method: string, params: unknown): Promise<unknown>;
  onEvent(callback: (event: unknown) => void): () => void;
}

declare global {
  interface Window {
    redwingBridge?: RedwingBridge;
  }
}

export function createElectronClient(bridge: RedwingBridge): RendererClient {
  return {
    shell: "electron",
    async call(method, params) {
      let outcome: unknown;
      try {
        outcome = await bridge.call(method, params ?? {});
      } catch (e) {
        throw new AppCallError(
          appError(
            "ipc_failed",
            `The app's main process did not answer ${method}: ${e instanceof Error ? e.message : String(e)}`,
            "retry",
          ),
        );
      }
      if (typeof outcome === "object" && outcome !== null && "ok" in outcome) {
        if (outcome.ok === true && "result" in outcome) {
          return checkResult(method as Method, outcome.result) as never;
        }
        if (outcome.ok === false && "error" in outcome) {
          throw toCallError(outcome.error, `${method} failed`);
        }
      }
      throw toCallError(null, `The app's main process answered ${method} in an unknown form`);
    },
    subscribe(listener: (event: AppEvent) => void) {
      return bridge.onEvent((raw) => {
        const event = parseEvent(raw);
        if (event) listener(event);
      });
    },
    onConnection(listener) {
      // IPC is in-process: it is up as long as the window exists.
      listener("open");
      return () => {};
    },
  };
}
