/**
 * The renderer's state and its pure reducer: events from the main process and call results both
 * arrive here as actions. Pure so it can be unit-tested in Node without a DOM.
 *
 * Streaming: a reply's text arrives in `chat.delta` events that can race the `chat.send` answer
 * (events and calls travel on different channels in web mode). Deltas therefore accumulate in
 * `liveText` by message id whether or not the message is known yet, and a `chat.done` for a
 * message not yet in the current conversation waits in `finished` until the conversation arrives.
 * The current conversation's finished messages keep their object identity across deltas, so
 * memoized message components skip re-rendering while only the streaming one updates.
 */
import type {
  AppEvent,
  AppInfo,
  CatalogItem,
  Connection,
  Conversation,
  ConversationSummary,
  Download,
  EngineStatus,
  InstalledModel,
  LiveSample,
  Message,
  ServerStatus,
  Settings,
} from "../../../core/app/api.ts";

/** About two minutes at two samples a second. */
export const MAX_SAMPLES = 240;
/** Finished replies kept for conversations that have not arrived yet. */
const MAX_FINISHED = 20;

export type ConnectionState = "connecting" | "open" | "reconnecting" | "unauthorized";

export interface State {
  connection: ConnectionState;
  info: AppInfo | null;
  settings: Settings | null;
  /** Saved engine settings differ from the loaded ones. */
  reloadNeeded: boolean;
  catalog: CatalogItem[] | null;
  models: InstalledModel[] | null;
  /** In the order first seen. */
  downloads: Download[];
  engine: EngineStatus | null;
  conversations: ConversationSummary[] | null;
  current: Conversation | null;
  /** Text of replies being written, by message id. */
  liveText: Record<string, string>;
  /** `chat.done` messages whose conversation has not arrived yet, by message id. */
  finished: Record<string, Message>;
  /** Conversation id -> id of the reply being written in it. */
  replying: Record<string, string>;
  samples: LiveSample[];
  server: ServerStatus | null;
  /** Saved OpenAI-compatible endpoints with their models (never their keys). */
  connections: Connection[] | null;
  /**
   * "New chat" was pressed and its conversation is being created: nothing else (the start-up
   * load picking the most recent conversation) may make another one current meanwhile.
   */
  newChatPending: boolean;
  /** A search hit was opened: the message list scrolls to this message once it is shown. */
  jumpTo: string | null;
}

export const initialState: State = {
  connection: "connecting",
  info: null,
  settings: null,
  reloadNeeded: false,
  catalog: null,
  models: null,
  downloads: [],
  engine: null,
  conversations: null,
  current: null,
  liveText: {},
  finished: {},
  replying: {},
  samples: [],
  server: null,
  connections: null,
  newChatPending: false,
  jumpTo: null,
};

export type Action =
  | { type: "event"; event: AppEvent }
  | { type: "connection"; state: ConnectionState }
  | { type: "info"; info: AppInfo }
  | { type: "catalog"; catalog: CatalogItem[] }
  | { type: "downloads"; downloads: Download[] }
  | { type: "downloadDismissed"; taskId: string }
  /**
   * A conversation from a call. `select`: make it current (else only refresh it when current).
   * `reply`: the call started a reply (send, regenerate, edit).
   */
  | { type: "conversation"; conversation: Conversation; select?: boolean; reply?: boolean }
  | { type: "deselect" }
  /** "New chat" pressed: nothing is current until its conversation arrives (or fails). */
  | { type: "newChatStarted" }
  | { type: "newChatFailed" }
  | { type: "conversationDeleted"; id: string }
  | { type: "history"; samples: LiveSample[] }
  /** Scroll to a message (a search hit), or null once done. */
  | { type: "jumpTo"; messageId: string | null };

export function reduce(state: State, action: Action): State {
  switch (action.type) {
    case "event":
      return reduceEvent(state, action.event);
    case "connection":
      return state.connection === action.state ? state : { ...state, connection: action.state };
    case "info":
      return { ...state, info: action.info };
    case "catalog":
      return { ...state, catalog: action.catalog };
    case "downloads": {
      // A fresh list (start, reconnect): keep our order for the ones we know.
      let downloads = state.downloads.filter((d) =>
        action.downloads.some((n) => n.taskId === d.taskId),
      );
      for (const d of action.downloads) downloads = upsertDownload(downloads, d);
      return { ...state, downloads };
    }
    case "downloadDismissed":
      return { ...state, downloads: state.downloads.filter((d) => d.taskId !== action.taskId) };
    case "conversation": {
      const next = receiveConversation(state, action.conversation, !!action.select, !!action.reply);
      return action.select && next.newChatPending ? { ...next, newChatPending: false } : next;
    }
    case "deselect":
      return { ...state, current: null };
    case "newChatStarted":
      return { ...state, current: null, newChatPending: true };
    case "newChatFailed":
      return state.newChatPending ? { ...state, newChatPending: false } : state;
    case "conversationDeleted": {
      const conversations = state.conversations?.filter((c) => c.id !== action.id) ?? null;
      const current = state.current?.id === action.id ? null : state.current;
      const replying = { ...state.replying };
      delete replying[action.id];
      return { ...state, conversations, current, replying };
    }
    case "jumpTo":
      return state.jumpTo === action.messageId ? state : { ...state, jumpTo: action.messageId };
    case "history": {
      // History is oldest first; keep live samples that arrived after its newest one.
      const last = action.samples.at(-1)?.t ?? -Infinity;
      const newer = state.samples.filter((s) => s.t > last);
      return { ...state, samples: [...action.samples, ...newer].slice(-MAX_SAMPLES) };
    }
  }
}

function reduceEvent(state: State, event: AppEvent): State {
  switch (event.type) {
    case "settings":
      return { ...state, settings: event.settings, reloadNeeded: event.reloadNeeded };
    case "models":
      return { ...state, models: event.models };
    case "download":
      return { ...state, downloads: upsertDownload(state.downloads, event.download) };
    case "engine":
      return { ...state, engine: event.status, reloadNeeded: event.status.reloadNeeded };
    case "conversations":
      return { ...state, conversations: event.conversations };
    case "server":
      return { ...state, server: event.status };
    case "connections":
      return { ...state, connections: event.connections };
    case "live": {
      const samples = state.samples.length >= MAX_SAMPLES ? state.samples.slice(1) : state.samples;
      return { ...state, samples: [...samples, event.sample] };
    }
    case "chat.delta": {
      const liveText = {
        ...state.liveText,
        [event.messageId]: (state.liveText[event.messageId] ?? "") + event.text,
      };
      const replying =
        state.replying[event.conversationId] === event.messageId
          ? state.replying
          : { ...state.replying, [event.conversationId]: event.messageId };
      return { ...state, liveText, replying };
    }
    case "chat.done": {
      const { message, conversationId } = event;
      const liveText = { ...state.liveText };
      delete liveText[message.id];
      const replying = { ...state.replying };
      if (replying[conversationId] === message.id) delete replying[conversationId];
      const current = state.current;
      if (current && current.messages.some((m) => m.id === message.id)) {
        const messages = current.messages.map((m) => (m.id === message.id ? message : m));
        return { ...state, liveText, replying, current: { ...current, messages } };
      }
      // Not here yet (the call's answer is still on its way): keep it for when it comes.
      const keys = Object.keys(state.finished);
      const finished: Record<string, Message> = {};
      for (const k of keys.slice(Math.max(0, keys.length - (MAX_FINISHED - 1)))) {
        finished[k] = state.finished[k]!;
      }
      finished[message.id] = message;
      return { ...state, liveText, replying, finished };
    }
  }
}

function upsertDownload(list: Download[], d: Download): Download[] {
  const i = list.findIndex((x) => x.taskId === d.taskId);
  if (i < 0) {
    // A new download of a name replaces that name's finished card (as the main process does).
    const finished = (x: Download) =>
      x.name === d.name && (x.state === "done" || x.state === "cancelled" || x.state === "failed");
    return [...list.filter((x) => !finished(x)), d];
  }
  const next = list.slice();
  next[i] = d;
  return next;
}

function receiveConversation(
  state: State,
  incoming: Conversation,
  select: boolean,
  reply: boolean,
): State {
  if (!select && state.current?.id !== incoming.id) return state;
  let finished = state.finished;
  let liveText = state.liveText;
  let replying = state.replying;
  const previous = state.current?.id === incoming.id ? state.current : null;
  const messages = incoming.messages.map((m) => {
    const done = finished[m.id];
    if (done) {
      if (finished === state.finished) finished = { ...finished };
      delete finished[m.id];
      return done;
    }
    // Keep the old object when nothing changed so memoized rows do not re-render.
    const old = previous?.messages.find((p) => p.id === m.id);
    if (old && sameMessage(old, m)) return old;
    return m;
  });
  const last = messages.at(-1);
  if (last && last.role === "assistant" && !last.finishReason) {
    // A reply in progress: deltas may have arrived already; otherwise start from what is saved.
    if (liveText[last.id] === undefined) liveText = { ...liveText, [last.id]: last.content };
    if (reply && replying[incoming.id] !== last.id) {
      replying = { ...replying, [incoming.id]: last.id };
    }
  } else if (reply && replying[incoming.id]) {
    // The reply finished before the call's answer arrived.
    replying = { ...replying };
    delete replying[incoming.id];
  }
  return { ...state, current: { ...incoming, messages }, finished, liveText, replying };
}

function sameMessage(a: Message, b: Message): boolean {
  return (
    a.content === b.content &&
    a.finishReason === b.finishReason &&
    a.stats?.line === b.stats?.line &&
    a.error?.message === b.error?.message &&
    a.versionIndex === b.versionIndex &&
    a.otherVersions?.length === b.otherVersions?.length
  );
}

/** The text to show for a message: the streamed text while it is being written. */
export function messageText(state: Pick<State, "liveText">, m: Message): string {
  if (m.role === "assistant" && !m.finishReason) return state.liveText[m.id] ?? m.content;
  return m.content;
}

/** Whether the current conversation has a reply being written. */
export function isReplying(state: State): boolean {
  const c = state.current;
  if (!c) return false;
  const id = state.replying[c.id];
  // Deltas can come before the call's answer: replying until that message is known finished.
  if (id) return !c.messages.some((m) => m.id === id && m.finishReason);
  // Opened while a reply (started elsewhere) is running: trust the engine.
  const last = c.messages.at(-1);
  return (
    state.engine?.state === "generating" &&
    !!last &&
    last.role === "assistant" &&
    !last.finishReason &&
    state.liveText[last.id] !== undefined
  );
}
