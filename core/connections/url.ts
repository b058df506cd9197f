/**
 * The base URL of an OpenAI-compatible endpoint, as OpenAI's own clients take it: the address the
 * API's paths (`/models`, `/chat/completions`) hang off, usually ending in `/v1`
 * (`http://gpu-box:8000/v1` for vLLM, `http://127.0.0.1:8080/v1` for llama.cpp's server or
 * `redwing serve`). A bare `http://host:port` gets `/v1` added, since every server named in
 * docs/remote.md serves the API there.
 */
import { isIP } from "node:net";
import { UserError } from "../errors.ts";

export interface CheckedUrl {
  /** Normalized: no trailing slash, no query or fragment. */
  url: string;
  /** Why this URL is risky (an API key in clear over plain http), or null. */
  warning: string | null;
}

/** 127.0.0.0/8, ::1 and localhost: traffic that never leaves this machine. */
export function isLoopbackHost(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, "").toLowerCase();
  if (host === "localhost" || host.endsWith(".localhost")) return true;
  if (isIP(host) === 4) return host.startsWith("127.");
  if (isIP(host) === 6) return host === "::1" || host === "0:0:0:0:0:0:0:1";
  return false;
}

/**
 * Checks and normalizes a base URL: http or https only, a host, no credentials in the URL
 * (they would be logged and shown; the API key has its own field). `hasKey` says whether an API
 * key will be sent to it: over plain http to another machine the key travels in clear, which
 * the warning says (it is allowed: a trusted LAN, or a VPN, is the user's call).
 */
export function checkBaseUrl(input: string, hasKey: boolean): CheckedUrl {
  const text = input.trim();
  let parsed: URL;
  try {
    parsed = new URL(text);
  } catch {
    throw new UserError(
      `"${text}" is not a URL: give the server's address, e.g. http://127.0.0.1:8000/v1`,
      "bad_url",
    );
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new UserError(
      `${parsed.protocol.replace(/:$/, "")} URLs are not supported: use http:// or https://`,
      "bad_url",
    );
  }
  if (parsed.hostname === "") throw new UserError(`"${text}" has no host name`, "bad_url");
  if (parsed.username !== "" || parsed.password !== "") {
    throw new UserError(
      "put the API key in its own field, not in the URL (a URL is shown and logged)",
      "bad_url",
    );
  }
  let path = parsed.pathname.replace(/\/+$/, "");
  if (path === "") path = "/v1";
  const url = `${parsed.protocol}//${parsed.host}${path}`;
  const warning =
    parsed.protocol === "http:" && !isLoopbackHost(parsed.hostname)
      ? hasKey
        ? `The API key would be sent in clear over http to ${parsed.host}: anyone on the network path can read it. Use https, or an SSH tunnel to a loopback address (docs/remote.md).`
        : `The conversation goes in clear over http to ${parsed.host}. Use https, or an SSH tunnel, unless the network is trusted (docs/remote.md).`
      : null;
  return { url, warning };
}
