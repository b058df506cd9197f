import type { Command } from "commander";
import { DEMO_LABEL } from "../../core/demo/demo.ts";
import { ENGINE_DEFAULTS, SERVER_DEFAULTS } from "../../core/defaults.ts";
import type { EngineFlags } from "../../core/generation/settings.ts";
import { startServer, type ServerOptions } from "../../core/server/server.ts";
import { addEngineOptions, intArg, parseByteSize } from "./chat.ts";

/** The flags of `redwing serve`: its own, and the engine's (addEngineOptions). */
export interface ServeOptions extends EngineFlags {
  host: string;
  port: number;
  allowRemote?: boolean;
  apiKey?: string;
  corsOrigin?: string;
  allowHost: string[];
  allowOrigin: string[];
  queueLimit: number;
  maxBody: number;
  model?: string;
  maxContext: number;
  quiet?: boolean;
}

/**
 * The server's options for these flags: the engine's and those named alike pass as they are (as
 * `chat` passes its flags to the engine's load request); `log` prints the server's lines.
 */
export function toServerOptions(opts: ServeOptions, log: (line: string) => void): ServerOptions {
  const { allowHost, allowOrigin, maxBody, maxContext, quiet, ...same } = opts;
  return {
    ...same,
    apiKey: opts.apiKey ?? (process.env.REDWING_API_KEY || undefined),
    allowedHosts: allowHost,
    allowedOrigins: allowOrigin,
    bodyLimit: maxBody,
    context: maxContext,
    log: quiet ? undefined : log,
    engine: { onCrash: (e) => log(`engine crashed, restarting: ${e.message}`) },
  };
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/** `redwing serve`: the OpenAI-compatible HTTP server (core/server). */
export function registerServeCommand(program: Command): void {
  const serve = program
    .command("serve")
    .description("Serve a model over an OpenAI-compatible HTTP API (loopback by default)")
    .option(
      "--model <name-or-dir>",
      "installed model name or model directory (default: the demo model)",
    )
    .option("--host <address>", "address to bind", SERVER_DEFAULTS.host)
    .option("--port <n>", "port (0: any free port)", intArg(0, 65535), SERVER_DEFAULTS.port)
    .option("--allow-remote", "allow binding to a non-loopback address (needs an API key)")
    .option("--api-key <key>", "require this Bearer key on every request (or REDWING_API_KEY)")
    .option("--cors-origin <origin>", "allow browser requests from this origin ('*': any)")
    .option(
      "--allow-host <name>",
      "on loopback, also answer requests whose Host header is this name (repeatable)",
      collect,
      [],
    )
    .option(
      "--allow-origin <origin>",
      "on loopback, also answer browser requests from this origin (repeatable)",
      collect,
      [],
    )
    .option(
      "--queue-limit <n>",
      "requests that may wait for the engine; more get 429",
      intArg(0),
      SERVER_DEFAULTS.queueLimit,
    )
    .option(
      "--max-body <size>",
      "largest request body, e.g. 4M",
      parseByteSize,
      SERVER_DEFAULTS.bodyLimitBytes,
    )
    .option(
      "--max-context <n>",
      "context size in tokens (prompt plus output)",
      intArg(1),
      ENGINE_DEFAULTS.context,
    );
  addEngineOptions(serve)
    .option("--quiet", "do not log requests")
    .action(async (opts: ServeOptions) => {
      const log = (line: string): void => void process.stderr.write(`redwing: ${line}\n`);
      const server = await startServer(toServerOptions(opts, log));
      if (server.modelId === "demo") log(`using the ${DEMO_LABEL}`);
      log(`serving "${server.modelId}" at ${server.url}/v1 (Ctrl-C stops)`);
      await new Promise<void>((resolve) => {
        const stop = (): void => {
          process.removeListener("SIGINT", stop);
          process.removeListener("SIGTERM", stop);
          resolve();
        };
        process.on("SIGINT", stop);
        process.on("SIGTERM", stop);
      });
      log("shutting down");
      await server.close();
    });
}
