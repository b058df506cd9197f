/**
 * An error whose message is meant for the person running Redwing: it says what went wrong
 * and, where there is one, what to do next. The CLI prints it without a stack trace.
 */
export class UserError extends Error {
  constructor(
    message: string,
    /** A short machine-readable code, stable across releases (e.g. "manifest_missing"). */
    readonly code: string = "user_error",
  ) {
    super(message);
    this.name = "UserError";
  }
}
