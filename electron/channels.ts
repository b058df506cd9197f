/** IPC channel names shared by main and the preload (the preload bundles this file in). */
export const CALL_CHANNEL = "redwing:call";
export const EVENT_CHANNEL = "redwing:event";
/** Sent by the preload when the renderer's first event listener subscribes. */
export const SUBSCRIBE_CHANNEL = "redwing:subscribe";
