/**
 * Fetches everything the UI shows. Run at start and after the event stream reconnects (events
 * missed while it was down are not replayed). Both transports also push a snapshot when their
 * event channel opens; the calls are what they have in common.
 *
 * Events and call answers travel on different channels (web mode: server-sent events and HTTP),
 * so an answer can arrive after an event that is newer than it: the engine's "ready" before the
 * `engine.status` answered while it was still loading. Every change to the parts that events
 * carry (engine, models, settings, server, connections, conversations, downloads) is announced
 * by an event, so an answer is applied only when no event changed its part of the state since the
 * call was made; otherwise the event is at least as new and the answer is dropped.
 */
import type { AppError, ConversationSummary } from "../../../core/app/api.ts";
import type { RendererClient } from "../api/types.ts";
import type { Store } from "./context.tsx";
import type { State } from "./store.ts";

export async function loadAll(
  client: RendererClient,
  store: Store,
  onError: (error: AppError) => void,
): Promise<void> {
  const { dispatch, getState } = store;
  const failures: unknown[] = [];
  const conversationsBefore = getState().conversations;
  const settle = async <T>(p: Promise<T>, apply: (v: T) => void | Promise<void>) => {
    try {
      await apply(await p);
    } catch (e) {
      failures.push(e);
    }
  };
  /** Like settle, but the answer is dropped when an event changed `part` meanwhile. */
  const settleUnlessNewer = <T>(
    part: (s: State) => unknown,
    p: Promise<T>,
    apply: (v: T) => void | Promise<void>,
  ) => {
    const before = part(getState());
    return settle(p, (v) => (part(getState()) === before ? apply(v) : undefined));
  };
  await Promise.all([
    settle(client.call("app.info", {}), (info) => dispatch({ type: "info", info })),
    settleUnlessNewer(
      (s) => s.settings,
      client.call("settings.get", {}),
      (settings) =>
        dispatch({
          type: "event",
          event: { type: "settings", settings, reloadNeeded: getState().reloadNeeded },
        }),
    ),
    settleUnlessNewer(
      (s) => s.engine,
      client.call("engine.status", {}),
      (status) => dispatch({ type: "event", event: { type: "engine", status } }),
    ),
    settleUnlessNewer(
      (s) => s.models,
      client.call("models.list", {}),
      (models) => dispatch({ type: "event", event: { type: "models", models } }),
    ),
    settle(client.call("models.catalog", {}), (catalog) => dispatch({ type: "catalog", catalog })),
    settleUnlessNewer(
      (s) => s.downloads,
      client.call("models.downloads", {}),
      (downloads) => dispatch({ type: "downloads", downloads }),
    ),
    settleUnlessNewer(
      (s) => s.server,
      client.call("server.status", {}),
      (status) => dispatch({ type: "event", event: { type: "server", status } }),
    ),
    settle(client.call("live.history", {}), (samples) => dispatch({ type: "history", samples })),
    settleUnlessNewer(
      (s) => s.connections,
      client.call("connections.list", {}),
      (connections) => dispatch({ type: "event", event: { type: "connections", connections } }),
    ),
    settle(client.call("chat.list", {}), async (conversations) => {
      // A newer list from an event stays; the current conversation is still picked from this one.
      if (getState().conversations === conversationsBefore) {
        dispatch({ type: "event", event: { type: "conversations", conversations } });
      }
      // "New chat" pressed while starting: the new conversation becomes current, not the last one.
      if (getState().newChatPending) return;
      const current = getState().current;
      const id = current?.id ?? mostRecent(conversations)?.id;
      if (!id || !conversations.some((c) => c.id === id)) return;
      const conversation = await client.call("chat.get", { id });
      // The user may have picked another one meanwhile.
      const now = getState().current;
      if (getState().newChatPending) return;
      if (!now || now.id === id) dispatch({ type: "conversation", conversation, select: true });
    }),
  ]);
  const first = failures[0];
  if (first) {
    const error =
      typeof first === "object" && first && "error" in first
        ? (first as { error: AppError }).error
        : {
            code: "load_failed",
            message: `Could not load the app's state: ${String(first)}`,
            action: "retry" as const,
          };
    if (error.code !== "unauthorized") onError(error);
  }
}

export function mostRecent(list: ConversationSummary[]): ConversationSummary | undefined {
  let best: ConversationSummary | undefined;
  for (const c of list) if (!best || c.updatedAt > best.updatedAt) best = c;
  return best;
}
