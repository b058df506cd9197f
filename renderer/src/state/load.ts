/**
 * Fetches everything the UI shows. Run at start and after the event stream reconnects (events
 * missed while it was down are not replayed). Web mode also pushes a snapshot on connect; the
 * Electron bridge does not, so the calls are what both transports have in common.
 */
import type { AppError, ConversationSummary } from "../../../core/app/api.ts";
import type { RendererClient } from "../api/types.ts";
import type { Store } from "./context.tsx";

export async function loadAll(
  client: RendererClient,
  store: Store,
  onError: (error: AppError) => void,
): Promise<void> {
  const { dispatch, getState } = store;
  const failures: unknown[] = [];
  const settle = async <T>(p: Promise<T>, apply: (v: T) => void | Promise<void>) => {
    try {
      await apply(await p);
    } catch (e) {
      failures.push(e);
    }
  };
  await Promise.all([
    settle(client.call("app.info", {}), (info) => dispatch({ type: "info", info })),
    settle(client.call("settings.get", {}), (settings) =>
      dispatch({
        type: "event",
        event: { type: "settings", settings, reloadNeeded: getState().reloadNeeded },
      }),
    ),
    settle(client.call("engine.status", {}), (status) =>
      dispatch({ type: "event", event: { type: "engine", status } }),
    ),
    settle(client.call("models.list", {}), (models) =>
      dispatch({ type: "event", event: { type: "models", models } }),
    ),
    settle(client.call("models.catalog", {}), (catalog) => dispatch({ type: "catalog", catalog })),
    settle(client.call("models.downloads", {}), (downloads) =>
      dispatch({ type: "downloads", downloads }),
    ),
    settle(client.call("server.status", {}), (status) =>
      dispatch({ type: "event", event: { type: "server", status } }),
    ),
    settle(client.call("live.history", {}), (samples) => dispatch({ type: "history", samples })),
    settle(client.call("connections.list", {}), (connections) =>
      dispatch({ type: "event", event: { type: "connections", connections } }),
    ),
    settle(client.call("chat.list", {}), async (conversations) => {
      dispatch({ type: "event", event: { type: "conversations", conversations } });
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
