/**
 * Test helper: calls to an app controller (core/app) as a shell makes them: params parsed with
 * the API's schemas first (a call the shells would refuse fails the test), results checked
 * against them.
 */
import {
  API,
  parseCall,
  type AppBackend,
  type AppError,
  type Method,
  type Params,
  type Result,
} from "../core/app/api.ts";
import { toAppError } from "../core/app/errors.ts";

export interface AppCalls {
  call<M extends Method>(method: M, params?: Params<M>): Promise<Result<M>>;
  /** The call's AppError; fails when the call succeeds. */
  callError<M extends Method>(method: M, params?: Params<M>): Promise<AppError>;
}

/** Calls to the app `app()` answers (read per call: tests create it in beforeAll). */
export function appCalls(app: () => AppBackend): AppCalls {
  async function call<M extends Method>(method: M, params?: Params<M>): Promise<Result<M>> {
    const parsed = parseCall(method, params ?? {});
    if (!parsed.ok) throw new Error(`bad call in the test: ${parsed.error.message}`);
    const result = await app().call(method, parsed.params as never);
    return API[method].result.parse(result) as Result<M>;
  }
  async function callError<M extends Method>(method: M, params?: Params<M>): Promise<AppError> {
    try {
      await call(method, params);
    } catch (error) {
      return toAppError(error);
    }
    throw new Error(`${method} was expected to fail`);
  }
  return { call, callError };
}
