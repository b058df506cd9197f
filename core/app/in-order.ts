/**
 * Announces readings that take a while (the model list plans every model with the engine; the
 * conversation list reads the disk) without letting an older reading follow a newer one. Two
 * readings can overlap, and the older one can finish last: the model list read while the
 * start-up load was still running (its plan needed a service of its own) could finish after the
 * one made when the model was ready, and the model then showed as not loaded.
 */
export function inOrderAnnouncer<T>(
  read: () => Promise<T>,
  announce: (value: T) => void,
  onError: (error: unknown) => void,
): () => void {
  let started = 0;
  let announced = 0;
  return () => {
    const mine = ++started;
    read().then(
      (value) => {
        // A reading started later has been announced already: this one is older news.
        if (mine < announced) return;
        announced = mine;
        announce(value);
      },
      (error: unknown) => onError(error),
    );
  };
}
