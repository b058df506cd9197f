/**
 * The store React reads: one mutable holder of the reducer's state with useSyncExternalStore, so
 * a component re-renders only when the slice it selects changes (a streaming delta re-renders the
 * chat, not the Models view). Selectors must return stored references or primitives.
 */
import { createContext, useContext, useSyncExternalStore } from "react";
import type { AppError, Conversation } from "../../../core/app/api.ts";
import type { RendererClient } from "../api/types.ts";
import { initialState, reduce, type Action, type State } from "./store.ts";

export class Store {
  private state: State = initialState;
  private readonly listeners = new Set<() => void>();

  getState = (): State => this.state;

  dispatch = (action: Action): void => {
    const next = reduce(this.state, action);
    if (next === this.state) return;
    this.state = next;
    for (const l of this.listeners) l();
  };

  subscribe = (listener: () => void): (() => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };
}

export type View = "models" | "chat" | "tuning" | "live" | "server" | "connections";

export interface AppActions {
  client: RendererClient;
  store: Store;
  navigate(view: View, focusId?: string): void;
  /** Shows a call error as a dismissible toast; `retry` repeats what failed. */
  notify(error: AppError, retry?: () => void): void;
  /** Runs a call and turns a failure into a toast (with Retry). Resolves to undefined on failure. */
  run<T>(what: () => Promise<T>): Promise<T | undefined>;
  /**
   * Starts a new conversation and makes it current. Until it exists nothing is current, and a
   * message sent meanwhile waits for it (`pendingNewChat`) instead of going to the previous one.
   */
  newChat(): Promise<Conversation | undefined>;
  /** The conversation "New chat" is creating, while it is being created. */
  pendingNewChat(): Promise<Conversation | undefined> | null;
}

export const ActionsContext = createContext<AppActions | null>(null);

export function useActions(): AppActions {
  const actions = useContext(ActionsContext);
  if (!actions) throw new Error("useActions outside the app");
  return actions;
}

export function useAppState<T>(selector: (s: State) => T): T {
  const { store } = useActions();
  return useSyncExternalStore(store.subscribe, () => selector(store.getState()));
}
