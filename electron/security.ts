/**
 * The Electron shell's security policy as pure functions (no Electron import), so that every
 * decision main.ts makes is unit-tested in plain Node: which URLs the window may load, navigate
 * to or open outside, which IPC senders are trusted, which permissions are granted, and the
 * Content-Security-Policy the renderer runs under.
 *
 * The renderer is served from a custom privileged scheme, `app://redwing/`, rather than file://:
 * it gives the page a real, unique origin (file:// pages share one opaque origin with every
 * local file), lets the protocol handler confine requests to renderer/dist and attach the CSP
 * header to every response, and keeps file:// free of any extra privileges.
 */
import { isAbsolute, relative, resolve, sep } from "node:path";
import { CONTENT_SECURITY_POLICY } from "../core/app/csp.ts";

export const APP_SCHEME = "app";
export const APP_HOST = "redwing";
export const APP_ORIGIN = `${APP_SCHEME}://${APP_HOST}`;
/** What the window loads. */
export const APP_INDEX_URL = `${APP_ORIGIN}/index.html`;

export { CONTENT_SECURITY_POLICY };

/** Headers sent with every response of the app protocol. */
export const RESPONSE_HEADERS: Readonly<Record<string, string>> = {
  "Content-Security-Policy": CONTENT_SECURITY_POLICY,
  "X-Content-Type-Options": "nosniff",
  "Referrer-Policy": "no-referrer",
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Resource-Policy": "same-origin",
};

function parse(url: string | null | undefined): URL | null {
  if (typeof url !== "string" || url.length === 0 || url.length > 8192) return null;
  try {
    return new URL(url);
  } catch {
    return null;
  }
}

/** True for a URL of the app itself (`app://redwing/...`, no credentials, no port). */
export function isAppUrl(url: string | null | undefined): boolean {
  const u = parse(url);
  return (
    u !== null &&
    u.protocol === `${APP_SCHEME}:` &&
    u.hostname === APP_HOST &&
    u.port === "" &&
    u.username === "" &&
    u.password === ""
  );
}

/**
 * Whether the window may navigate to `url`: only within the app (the single page changes views
 * by itself; a reload stays on the app's origin). Everything else is denied and, when
 * `isSafeExternalUrl`, opened in the user's browser instead.
 */
export function isAllowedNavigation(url: string): boolean {
  return isAppUrl(url);
}

/**
 * Whether a link may be handed to the operating system (`shell.openExternal`): http(s) only, with
 * a host and without embedded credentials. file:, smb:, custom schemes and javascript: are never
 * handed out (they can launch programs).
 */
export function isSafeExternalUrl(url: string): boolean {
  const u = parse(url);
  return (
    u !== null &&
    (u.protocol === "https:" || u.protocol === "http:") &&
    u.hostname !== "" &&
    u.username === "" &&
    u.password === ""
  );
}

/**
 * Whether an IPC message comes from the app's own page. main.ts passes the URL of the sending
 * frame only when that frame is the main frame of the app's window (else null), so subframes,
 * other windows and pages that navigated away are refused.
 */
export function isTrustedSender(senderUrl: string | null | undefined): boolean {
  return isAppUrl(senderUrl);
}

/**
 * Permission requests and checks (camera, notifications, geolocation, ...): all denied except
 * writing sanitized text to the clipboard, which the Copy buttons need, and only for the app.
 */
export function isPermissionAllowed(
  permission: string,
  requestingUrl: string | null | undefined,
): boolean {
  return permission === "clipboard-sanitized-write" && isAppUrl(requestingUrl);
}

/**
 * Requests the app's session lets through: the app's own scheme, inline data/blob URLs and the
 * developer tools. Network requests (http, https, ws, wss) and file:// are cancelled, so a
 * compromised renderer cannot reach the network or read local files even if the CSP failed.
 */
export function isAllowedRequest(url: string): boolean {
  const u = parse(url);
  if (u === null) return false;
  if (u.protocol === `${APP_SCHEME}:`) return isAppUrl(url);
  return u.protocol === "data:" || u.protocol === "blob:" || u.protocol === "devtools:";
}

/**
 * Maps an app URL to a file under `root` (renderer/dist): null for another origin, an encoded
 * NUL or backslash, or a path that escapes `root` (`..`, encoded or not). `/` serves index.html.
 */
export function resolveAppFile(root: string, url: string): string | null {
  if (!isAppUrl(url)) return null;
  const u = new URL(url);
  let pathname: string;
  try {
    pathname = decodeURIComponent(u.pathname);
  } catch {
    return null;
  }
  if (pathname.includes("\0") || pathname.includes("\\")) return null;
  if (pathname === "" || pathname.endsWith("/")) pathname += "index.html";
  const base = resolve(root);
  const file = resolve(base, `.${pathname.startsWith("/") ? "" : "/"}${pathname}`);
  const rel = relative(base, file);
  if (rel === "" || rel === ".." || rel.startsWith(`..${sep}`) || isAbsolute(rel)) return null;
  return file;
}

const MIME: Readonly<Record<string, string>> = {
  html: "text/html; charset=utf-8",
  js: "text/javascript; charset=utf-8",
  mjs: "text/javascript; charset=utf-8",
  css: "text/css; charset=utf-8",
  json: "application/json; charset=utf-8",
  map: "application/json; charset=utf-8",
  svg: "image/svg+xml",
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  ico: "image/x-icon",
  woff: "font/woff",
  woff2: "font/woff2",
  ttf: "font/ttf",
  txt: "text/plain; charset=utf-8",
  wasm: "application/wasm",
};

/** The Content-Type of a served file (with nosniff, an unknown type is never executed). */
export function contentTypeFor(file: string): string {
  const dot = file.lastIndexOf(".");
  const ext = dot < 0 ? "" : file.slice(dot + 1).toLowerCase();
  return MIME[ext] ?? "application/octet-stream";
}

/**
 * Adds the CSP as a `<meta>` to an HTML page that has none: the header already applies, the meta
 * keeps the policy if the page is ever opened another way (devtools "save as", file://).
 */
export function withCspMeta(html: string): string {
  if (/<meta[^>]+http-equiv=["']?content-security-policy/i.test(html)) return html;
  const meta = `<meta http-equiv="Content-Security-Policy" content="${CONTENT_SECURITY_POLICY}">`;
  const head = /<head[^>]*>/i.exec(html);
  if (!head) return `${meta}${html}`;
  const at = head.index + head[0].length;
  return `${html.slice(0, at)}${meta}${html.slice(at)}`;
}
