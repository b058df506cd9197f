/**
 * `redwing serve`'s flags become the server's options (toServerOptions): each flag parsed by the
 * real command reaches startServer under the server's name for it.
 */
import { Command } from "commander";
import { describe, expect, it } from "vitest";
import { EngineCrashError } from "../../core/engine/client.ts";
import { registerServeCommand, toServerOptions, type ServeOptions } from "./serve.ts";

/** The options the real `serve` command parses from `args` (its action replaced: no server). */
async function parseServe(args: string[]): Promise<ServeOptions> {
  const program = new Command().exitOverride();
  registerServeCommand(program);
  const serve = program.commands.find((c) => c.name() === "serve")!;
  let parsed: ServeOptions | undefined;
  serve.action((opts: ServeOptions) => {
    parsed = opts;
  });
  await program.parseAsync(["serve", ...args], { from: "user" });
  return parsed!;
}

describe("toServerOptions", () => {
  it("passes every server and engine flag on", async () => {
    const opts = await parseServe([
      "--host=127.0.0.2",
      "--port=9123",
      "--allow-remote",
      "--api-key=k",
      "--cors-origin=*",
      "--allow-host=box.lan",
      "--allow-host=box",
      "--allow-origin=http://localhost:3000",
      "--queue-limit=3",
      "--max-body=1M",
      "--model=m",
      "--max-context=512",
      "--threads=3",
      "--backend=vulkan",
      "--activations=int8",
      "--expert-cache-slots=5",
      "--memory-budget=1G",
      "--vram-budget=2G",
      "--gpu-misses=cpu",
      "--gpu-expert-copies=2",
    ]);
    const lines: string[] = [];
    const options = toServerOptions(opts, (line) => lines.push(line));
    expect(options).toMatchObject({
      host: "127.0.0.2",
      port: 9123,
      allowRemote: true,
      apiKey: "k",
      corsOrigin: "*",
      allowedHosts: ["box.lan", "box"],
      allowedOrigins: ["http://localhost:3000"],
      queueLimit: 3,
      bodyLimit: 1 << 20,
      model: "m",
      context: 512,
      threads: 3,
      backend: "vulkan",
      activations: "int8",
      expertCacheSlots: 5,
      memoryBudget: 1 << 30,
      vramBudget: 2 * (1 << 30),
      gpuMisses: "cpu",
      gpuExpertCopies: 2,
    });
    options.log!("GET /health 200");
    options.engine!.onCrash!(new EngineCrashError("gone", 1, null, ""));
    expect(lines).toEqual(["GET /health 200", "engine crashed, restarting: gone"]);
  });

  it("takes each of the engine's choices of where the GPU's misses run, and refuses others", async () => {
    for (const where of ["copy", "cpu", "split"]) {
      const opts = await parseServe([`--gpu-misses=${where}`, "--gpu-expert-copies=0"]);
      expect(toServerOptions(opts, () => {})).toMatchObject({
        gpuMisses: where,
        gpuExpertCopies: 0,
      });
    }
    // Left out, neither is sent: the engine's default applies.
    const plain = toServerOptions(await parseServe([]), () => {});
    expect(plain.gpuMisses).toBeUndefined();
    expect(plain.gpuExpertCopies).toBeUndefined();
    await expect(parseServe(["--gpu-misses=gpu"])).rejects.toThrow(
      /Allowed choices are copy, cpu, split/,
    );
    await expect(parseServe(["--gpu-expert-copies=-1"])).rejects.toThrow(/--gpu-expert-copies/);
  });

  it("logs no requests with --quiet", async () => {
    const options = toServerOptions(await parseServe(["--quiet"]), () => {});
    expect(options.log).toBeUndefined();
    expect(options.engine?.onCrash).toBeDefined();
  });
});
