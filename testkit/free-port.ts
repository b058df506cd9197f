/** Test helper: a loopback port to hand to a server under test. */
import { createServer } from "node:net";

/**
 * A port nothing listens on now on 127.0.0.1 (the OS picks it; closed again before use, so
 * another process could take it first: fine for tests, not for production).
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      const port = typeof address === "object" && address ? address.port : 0;
      probe.close(() => resolve(port));
    });
  });
}
