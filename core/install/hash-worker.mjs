// Worker thread of core/install/hasher.ts: keeps resumable SHA-256 / SHA-1 states (hash-wasm)
// for the whole-file checks so that hashing runs beside the downloads instead of blocking
// them. Plain JavaScript so that it loads without a TypeScript loader.
import { parentPort } from "node:worker_threads";
import { createSHA1, createSHA256 } from "hash-wasm";

const hashers = new Map();

// Messages are handled one after another: an update must not overtake the init before it.
let chain = Promise.resolve();
parentPort.on("message", (m) => {
  chain = chain.then(() => handle(m));
});

async function handle(m) {
  try {
    if (m.op === "init") {
      const h = m.algo === "sha1" ? await createSHA1() : await createSHA256();
      if (m.state) h.load(m.state);
      else {
        h.init();
        if (m.prefix) h.update(m.prefix);
      }
      hashers.set(m.key, h);
      parentPort.postMessage({ id: m.id });
    } else if (m.op === "update") {
      const data = new Uint8Array(m.data, m.offset, m.length);
      const states = m.keys.map((key) => {
        const h = hashers.get(key);
        h.update(data);
        return h.save();
      });
      parentPort.postMessage({ id: m.id, states });
    } else if (m.op === "digest") {
      parentPort.postMessage({ id: m.id, hex: hashers.get(m.key).digest("hex") });
    }
  } catch (error) {
    parentPort.postMessage({ id: m.id, error: String(error) });
  }
}
