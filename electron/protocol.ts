/**
 * The `app://redwing/` protocol handler (registered by main.ts with `protocol.handle`): serves
 * the built renderer (renderer/dist) read-only, with the CSP and the other security headers on
 * every response. Pure apart from the file reader it is given, so it is tested in plain Node.
 */
import { readFile as fsReadFile } from "node:fs/promises";
import {
  RESPONSE_HEADERS,
  contentTypeFor,
  isAppUrl,
  resolveAppFile,
  withCspMeta,
} from "./security.ts";

export type ReadFile = (path: string) => Promise<Uint8Array>;

function plain(status: number, text: string): Response {
  return new Response(text, {
    status,
    headers: { ...RESPONSE_HEADERS, "Content-Type": "text/plain; charset=utf-8" },
  });
}

/** A handler for `protocol.handle(APP_SCHEME, ...)` serving files under `root`. */
export function createAppProtocolHandler(
  root: string,
  readFile: ReadFile = fsReadFile,
): (request: Request) => Promise<Response> {
  return async (request) => {
    if (request.method !== "GET" && request.method !== "HEAD") {
      return plain(405, "method not allowed");
    }
    if (!isAppUrl(request.url)) return plain(403, "forbidden");
    const file = resolveAppFile(root, request.url);
    if (file === null) return plain(403, "forbidden");
    let body: Uint8Array;
    try {
      body = await readFile(file);
    } catch {
      return plain(404, "not found");
    }
    const type = contentTypeFor(file);
    const payload: Uint8Array | string = type.startsWith("text/html")
      ? withCspMeta(Buffer.from(body).toString("utf8"))
      : body;
    return new Response(request.method === "HEAD" ? null : (payload as BodyInit), {
      status: 200,
      headers: { ...RESPONSE_HEADERS, "Content-Type": type, "Cache-Control": "no-cache" },
    });
  };
}
