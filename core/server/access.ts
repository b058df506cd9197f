/**
 * Who may call the server: the binding rules checked before it starts, and the hook run on every
 * request before routing (Host and Origin checks on loopback against DNS rebinding and cross-site
 * posts, CORS, the API key). docs/security.md describes the threat model.
 */
import { timingSafeEqual } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import { SERVER_DEFAULTS } from "../defaults.ts";
import { UserError } from "../errors.ts";
import { ApiError } from "./errors.ts";

/** The access settings of ServerOptions. */
export interface AccessOptions {
  host?: string;
  allowRemote?: boolean;
  apiKey?: string;
  corsOrigin?: string;
  allowedHosts?: string[];
  allowedOrigins?: string[];
}

const LOOPBACK = new Set(["127.0.0.1", "::1", "localhost"]);

export function isLoopbackHost(host: string): boolean {
  return LOOPBACK.has(host) || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** Checks the binding rules before anything starts; UserErrors say which flag is missing. */
export function checkBinding(options: AccessOptions): void {
  const host = options.host ?? SERVER_DEFAULTS.host;
  if (isLoopbackHost(host)) return;
  if (!options.allowRemote) {
    throw new UserError(
      `binding to ${host} exposes the server beyond this machine; pass --allow-remote (with --api-key) to do so`,
      "remote_not_allowed",
    );
  }
  if (!options.apiKey) {
    throw new UserError(
      `binding to ${host} needs an API key: pass --api-key or set REDWING_API_KEY`,
      "api_key_required",
    );
  }
}

const LOOPBACK_NAMES = new Set(["localhost", "127.0.0.1", "[::1]"]);

/**
 * Whether a Host header names this server: a loopback name at its port, or one the user allowed
 * (with or without a port). Case-insensitive, as DNS names are.
 */
export function hostAllowed(header: string | undefined, port: number, allowed: string[]): boolean {
  if (header === undefined) return false;
  const value = header.trim().toLowerCase();
  const m = /^(\[[0-9a-f:.]+\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(value);
  if (!m) return false;
  const name = m[1]!;
  const samePort = m[2] === undefined ? port === 80 : Number(m[2]) === port;
  if (LOOPBACK_NAMES.has(name) && samePort) return true;
  return allowed.some((a) => {
    const want = a.trim().toLowerCase();
    return want === value || (want === name && samePort);
  });
}

/** Whether a browser Origin may call: none (not a browser), this server's own, or one allowed. */
export function originAllowed(
  origin: string | undefined,
  port: number,
  allowed: string[],
): boolean {
  if (origin === undefined) return true;
  const value = origin.trim().toLowerCase().replace(/\/$/, "");
  if (allowed.some((a) => a.trim().toLowerCase().replace(/\/$/, "") === value)) return true;
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return false;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return false;
  if (url.origin !== value) return false; // a path, credentials or an odd spelling
  const urlPort = url.port === "" ? (url.protocol === "https:" ? 443 : 80) : Number(url.port);
  return LOOPBACK_NAMES.has(url.hostname) && urlPort === port;
}

function sameSecret(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * The onRequest hook: answers (and so ends) a request that may not go on, else returns
 * undefined. `port()` is the port the server listens on (known once listening).
 */
export function accessHook(
  options: AccessOptions,
  port: () => number,
): (request: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply | undefined> {
  const host = options.host ?? SERVER_DEFAULTS.host;
  const onLoopback = isLoopbackHost(host);
  // The address it is bound to names it too (127.0.0.2, say).
  const allowedHosts = [...(options.allowedHosts ?? []), host.includes(":") ? `[${host}]` : host];
  const allowedOrigins = [
    ...(options.allowedOrigins ?? []),
    ...(options.corsOrigin && options.corsOrigin !== "*" ? [options.corsOrigin] : []),
  ];
  return async (request, reply) => {
    const listeningPort = port();
    // On loopback the server has no key by default: a web page must not reach it by giving a
    // hostname of its own the address 127.0.0.1 (DNS rebinding) or by posting cross-site.
    if (onLoopback) {
      const hostHeader = request.headers.host;
      if (!hostAllowed(hostHeader, listeningPort, allowedHosts)) {
        void reply
          .code(421)
          .send(
            new ApiError(
              421,
              `this server answers only requests for localhost:${listeningPort} or 127.0.0.1:${listeningPort}, not for host "${hostHeader ?? ""}" (start it with --allow-host ${(hostHeader ?? "NAME").split(":")[0]} to allow that name)`,
              "invalid_request_error",
              "host_not_allowed",
            ).body(),
          );
        return reply;
      }
      const origin = request.headers.origin;
      if (options.corsOrigin !== "*" && !originAllowed(origin, listeningPort, allowedOrigins)) {
        void reply
          .code(403)
          .send(
            new ApiError(
              403,
              `requests from the web page at ${origin} are not allowed (start the server with --allow-origin ${origin} to allow it)`,
              "permission_error",
              "origin_not_allowed",
            ).body(),
          );
        return reply;
      }
    }
    const cors = options.corsOrigin;
    if (cors) {
      const origin = request.headers.origin;
      if (cors === "*" || origin === cors) {
        void reply.header("access-control-allow-origin", cors === "*" ? "*" : cors);
        void reply.header("vary", "Origin");
      }
      if (request.method === "OPTIONS") {
        void reply
          .header("access-control-allow-methods", "GET, POST, OPTIONS")
          .header("access-control-allow-headers", "authorization, content-type")
          .header("access-control-max-age", "600")
          .code(204)
          .send();
        return reply;
      }
    }
    if (options.apiKey) {
      const auth = request.headers.authorization ?? "";
      const m = /^Bearer\s+(.+)$/i.exec(auth);
      if (!m || !sameSecret(m[1]!.trim(), options.apiKey)) {
        void reply
          .code(401)
          .send(
            new ApiError(
              401,
              "missing or wrong API key (send Authorization: Bearer <key>)",
              "authentication_error",
              "invalid_api_key",
            ).body(),
          );
        return reply;
      }
    }
    return undefined;
  };
}
