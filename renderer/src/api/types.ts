import type { AppClient } from "../../../core/app/api.ts";
import type { ConnectionState } from "../state/store.ts";

/** An AppClient plus what the UI needs to know about the transport carrying it. */
export interface RendererClient extends AppClient {
  readonly shell: "electron" | "web" | "mock";
  /** The event channel's state (always "open" over Electron IPC); called at once with the current one. */
  onConnection(listener: (state: ConnectionState) => void): () => void;
}
