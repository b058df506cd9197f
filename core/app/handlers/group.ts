/**
 * Handler types for the app controller: one async function per API method, taking the parsed
 * params and answering the method's result. Each module in this folder builds the group of
 * methods under one prefix from the shared AppContext; index.ts joins the groups.
 */
import type { z } from "zod";
import type { API, Method, Result } from "../api.ts";

export type Handler<M extends Method> = (
  params: z.infer<(typeof API)[M]["params"]>,
) => Promise<Result<M>>;

/** A handler for every method of the API. */
export type Handlers = { [M in Method]: Handler<M> };

/** The handlers of the methods named `<prefix>.<name>`. */
export type HandlerGroup<Prefix extends string> = {
  [M in Method as M extends `${Prefix}.${string}` ? M : never]: Handler<M>;
};
