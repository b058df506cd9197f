// `node --import ./register-fake-electron.mjs main.mjs`: resolves `electron` to the fake
// (fake-electron.mjs) in this process. Test support only.
import { register } from "node:module";

const fakeUrl = new URL("./fake-electron.mjs", import.meta.url).href;
const hooks = `
export async function resolve(specifier, context, next) {
  if (specifier === "electron") return { url: ${JSON.stringify(fakeUrl)}, shortCircuit: true };
  return next(specifier, context);
}`;
register(`data:text/javascript,${encodeURIComponent(hooks)}`);
