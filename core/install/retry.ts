/**
 * Retries with exponential backoff and full jitter, honouring `Retry-After`. Used for every
 * request the installer makes: hub API calls, whole small files and tensor ranges.
 */

export interface RetryPolicy {
  /** Attempts in all, the first included (default 6). */
  attempts: number;
  /** Backoff before retry n (1-based) is random in [0, min(maxDelayMs, baseDelayMs * 2^(n-1))]. */
  baseDelayMs: number;
  maxDelayMs: number;
  /** Longest `Retry-After` honoured; a longer one fails the request with its message. */
  maxRetryAfterMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = {
  attempts: 6,
  baseDelayMs: 1000,
  maxDelayMs: 30_000,
  maxRetryAfterMs: 120_000,
};

/** A failure worth retrying (network error, 5xx, 429, a short body, a stall). */
export class RetryableError extends Error {
  constructor(
    message: string,
    /** Delay the server asked for (Retry-After), in ms. */
    readonly retryAfterMs: number | null = null,
    /** Errno-style code of a network failure (ECONNREFUSED, ...), for the final message. */
    readonly code: string | null = null,
  ) {
    super(message);
    this.name = "RetryableError";
  }
}

/**
 * Parses a Retry-After header: delay-seconds or an HTTP date. Returns ms (never negative) or
 * null when absent or unreadable.
 */
export function parseRetryAfter(value: string | null, now: number = Date.now()): number | null {
  if (value === null) return null;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const date = Date.parse(text);
  if (Number.isNaN(date)) return null;
  return Math.max(0, date - now);
}

/** The delay before retry `n` (1-based): Retry-After when given, else jittered backoff. */
export function retryDelay(
  policy: RetryPolicy,
  n: number,
  retryAfterMs: number | null,
  random: () => number = Math.random,
): number {
  if (retryAfterMs !== null) return retryAfterMs;
  const cap = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (n - 1));
  return Math.floor(random() * cap);
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export interface RetryInfo {
  attempt: number;
  delayMs: number;
  error: RetryableError;
}

/**
 * Runs `fn` until it succeeds, throws something other than a RetryableError, or has failed
 * `policy.attempts` times (then the last RetryableError is thrown).
 */
export async function withRetry<T>(
  fn: (attempt: number) => Promise<T>,
  policy: RetryPolicy,
  signal?: AbortSignal,
  onRetry?: (info: RetryInfo) => void,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn(attempt);
    } catch (error) {
      if (!(error instanceof RetryableError) || signal?.aborted) throw error;
      if (attempt >= policy.attempts) throw error;
      if (error.retryAfterMs !== null && error.retryAfterMs > policy.maxRetryAfterMs) throw error;
      const delayMs = retryDelay(policy, attempt, error.retryAfterMs);
      onRetry?.({ attempt, delayMs, error });
      await sleep(delayMs, signal);
    }
  }
}
