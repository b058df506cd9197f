/**
 * The preload of the app's window: exposes `window.redwingBridge` and nothing else. It runs
 * sandboxed (only `require("electron")` works there), so scripts/build-electron.mjs bundles it
 * to CommonJS with its one import, the channel names, inlined.
 *
 * The bridge hands the renderer functions, never ipcRenderer itself: the page can make calls and
 * read events, and main validates every call (sender, method, params) anyway.
 */
import { contextBridge, ipcRenderer } from "electron";
import { CALL_CHANNEL, EVENT_CHANNEL, SUBSCRIBE_CHANNEL } from "./channels.ts";

type Listener = (event: unknown) => void;

const listeners = new Set<Listener>();

ipcRenderer.on(EVENT_CHANNEL, (_event, appEvent: unknown) => {
  for (const listener of [...listeners]) {
    try {
      listener(appEvent);
    } catch (error) {
      // One broken listener must not starve the others.
      console.error("redwing event listener failed:", error);
    }
  }
});

contextBridge.exposeInMainWorld(
  "redwingBridge",
  Object.freeze({
    shell: "electron",
    call(method: string, params: unknown): Promise<unknown> {
      if (typeof method !== "string")
        return Promise.reject(new TypeError("method must be a string"));
      return ipcRenderer.invoke(CALL_CHANNEL, method, params);
    },
    onEvent(callback: Listener): () => void {
      if (typeof callback !== "function") throw new TypeError("onEvent needs a function");
      listeners.add(callback);
      // The first listener asks main for the current state (web mode's stream starts with it).
      if (listeners.size === 1) ipcRenderer.send(SUBSCRIBE_CHANNEL);
      return () => {
        listeners.delete(callback);
      };
    },
  }),
);
