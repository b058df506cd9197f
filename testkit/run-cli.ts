import { vi } from "vitest";
import { main } from "../cli/main.ts";

/** Runs the CLI in-process (in a vitest test) and captures what it prints. */
export async function runCli(
  ...args: string[]
): Promise<{ code: number; out: string; err: string }> {
  let out = "";
  let err = "";
  vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => {
    out += String(chunk);
    return true;
  });
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => {
    err += String(chunk);
    return true;
  });
  try {
    const code = await main(["node", "redwing", ...args]);
    return { code, out, err };
  } finally {
    vi.restoreAllMocks();
  }
}
