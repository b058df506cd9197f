import { InvalidArgumentError, type Command } from "commander";
import {
  checkUiHost,
  DEFAULT_UI_HOST,
  DEFAULT_UI_PORT,
  startWebServer,
} from "../../core/app/web.ts";
import { dataDir } from "../../core/paths.ts";

interface UiOptions {
  host: string;
  port: number;
  /** commander's `--no-open`: false when given. */
  open: boolean;
}

/** Longest wait for the controller to close (engine stopped, downloads paused) on Ctrl-C. */
const CLOSE_TIMEOUT_MS = 10_000;

function portArg(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value.trim()) || n > 65535) {
    throw new InvalidArgumentError("expected a port from 0 to 65535 (0: any free port)");
  }
  return n;
}

/** Whether a browser can be shown here: Linux without a display (ssh, CI, a container) cannot. */
export function canOpenBrowser(
  env: Record<string, string | undefined> = process.env,
  platform: NodeJS.Platform = process.platform,
): boolean {
  if (env.BROWSER === "none") return false;
  if (platform === "darwin" || platform === "win32") return true;
  return Boolean(env.DISPLAY || env.WAYLAND_DISPLAY || env.BROWSER);
}

/** Opens `url` in the default browser; never throws (the printed address is the fallback). */
async function openBrowser(url: string, log: (line: string) => void): Promise<void> {
  try {
    const { default: open } = await import("open");
    const child = await open(url);
    child.on("error", (e) =>
      log(`could not open a browser (${e.message}); open the address above`),
    );
    child.unref();
  } catch (error) {
    log(`could not open a browser (${(error as Error).message}); open the address above`);
  }
}

/** `redwing ui`: the app in a browser (web mode), on loopback, until Ctrl-C. */
export function registerUiCommand(program: Command): void {
  program
    .command("ui")
    .description(
      "Open the Redwing app in a browser (web mode): serves the UI on this machine only, " +
        "behind a random per-launch token in the printed address",
    )
    .option(
      "--host <address>",
      "loopback address to bind (127.0.0.1, ::1 or localhost)",
      DEFAULT_UI_HOST,
    )
    .option(
      "--port <n>",
      "port (default 0: any free port; the address printed has the port and the token)",
      portArg,
      DEFAULT_UI_PORT,
    )
    .option("--no-open", "do not open a browser, only print the address")
    .action(async (opts: UiOptions) => {
      const log = (line: string): void => void process.stderr.write(`redwing ui: ${line}\n`);
      checkUiHost(opts.host); // before anything starts
      // Installed first and kept until the process exits: while a listener of ours is there, the
      // engine client leaves signals to us (else it kills the engine and re-raises at once), and
      // a Ctrl-C during start-up still closes everything cleanly once started. Repeated signals
      // are ignored: the settings store's exit hook (when-exit) re-raises the first one at once,
      // and closing is bounded by CLOSE_TIMEOUT_MS anyway.
      const stopRequested = new Promise<void>((resolve) => {
        const stop = (): void => resolve();
        process.on("SIGINT", stop);
        process.on("SIGTERM", stop);
      });
      // Loaded here, not at the top: the controller pulls in the engine, installer and server,
      // which other commands do not need.
      const { createAppController } = await import("../../core/app/controller.ts");
      const controller = await createAppController({ shell: "web", dataDir: dataDir() });
      let server: Awaited<ReturnType<typeof startWebServer>>;
      try {
        server = await startWebServer({
          backend: controller,
          host: opts.host,
          port: opts.port,
          log,
        });
      } catch (error) {
        await controller.close();
        throw error;
      }
      // Exactly one line on stdout: scripts and the e2e tests parse it.
      process.stdout.write(`Redwing UI: ${server.url}\n`);
      if (!opts.open) {
        // asked not to
      } else if (canOpenBrowser()) {
        await openBrowser(server.url, log);
      } else {
        log("no display to open a browser on: open the address above (Ctrl-C stops)");
      }
      await stopRequested;
      log("shutting down");
      const timer = setTimeout(() => {
        log(`still closing after ${CLOSE_TIMEOUT_MS / 1000} s; quitting anyway`);
        process.exit(1);
      }, CLOSE_TIMEOUT_MS);
      timer.unref();
      await server.close();
      await controller.close();
      clearTimeout(timer);
      // Anything a library left open (a watcher, a keep-alive socket) must not keep us up.
      setTimeout(
        () => process.exit(typeof process.exitCode === "number" ? process.exitCode : 0),
        2000,
      ).unref();
    });
}
