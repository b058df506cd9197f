/**
 * Test helper: a second Redwing as a remote OpenAI-compatible endpoint, `bin/redwing serve` in its
 * own process (so a test can stop it, restart it on the same port, or kill it mid-reply), on
 * the demo model, in the given REDWING_HOME.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

export interface RemoteServe {
  /** The API's base URL, `http://127.0.0.1:<port>/v1`. */
  url: string;
  port: number;
  child: ChildProcess;
  /** Everything it wrote to stderr. */
  log(): string;
  /** SIGTERM (a clean stop) or SIGKILL (a crash); resolves once it has exited. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/** Starts `redwing serve --port <port, default any free one> ...args`; resolves once it serves. */
export async function startRemoteServe(
  home: string,
  options: { port?: number; args?: string[]; timeoutMs?: number } = {},
): Promise<RemoteServe> {
  const child = spawn(
    process.execPath,
    [
      join(ROOT, "bin", "redwing"),
      "serve",
      "--port",
      String(options.port ?? 0),
      "--max-context",
      "512",
      ...(options.args ?? []),
    ],
    { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, REDWING_HOME: home } },
  );
  let stderr = "";
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`redwing serve did not start in time:\n${stderr}`));
    }, options.timeoutMs ?? 60_000);
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (text: string) => {
      stderr += text;
      const m = /serving "[^"]*" at (http:\/\/\S+\/v1)/.exec(stderr);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`redwing serve exited (${code}) before serving:\n${stderr}`));
    });
  });
  return {
    url,
    port: Number(new URL(url).port),
    child,
    log: () => stderr,
    async stop(signal = "SIGTERM") {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      await exited;
    },
  };
}
