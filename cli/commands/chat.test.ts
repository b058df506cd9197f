import { execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { nativeBuildDir } from "../../core/native.ts";
import { parseByteSize } from "./chat.ts";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const BIN = join(ROOT, "bin", "redwing");
const haveEngine = existsSync(join(nativeBuildDir(), "redwing-engine"));

let home: string;
beforeAll(async () => {
  home = await mkdtemp(join(tmpdir(), "redwing-chat-"));
});
afterAll(async () => {
  await rm(home, { recursive: true, force: true });
});

interface Run {
  code: number;
  out: string;
  err: string;
}

/** Runs the real `bin/redwing` with a private REDWING_HOME. */
async function redwing(...args: string[]): Promise<Run> {
  try {
    const { stdout, stderr } = await promisify(execFile)(BIN, args, {
      env: { ...process.env, REDWING_HOME: home },
      maxBuffer: 16 * 1024 * 1024,
    });
    return { code: 0, out: stdout, err: stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    return {
      code: typeof e.code === "number" ? e.code : 1,
      out: e.stdout ?? "",
      err: e.stderr ?? "",
    };
  }
}

const STATS_RE = /^\d+\.\d t\/s, TTFT: \d+\.\dms \(\d+\.\d t\/s, (\d+) tokens\), (\d+) tokens/m;

describe.skipIf(!haveEngine)("redwing complete / chat / models (real binary, demo model)", () => {
  it("creates the demo model on first use and completes 16 tokens with statistics", async () => {
    const r = await redwing("complete", "--prompt", "The", "--max-new", "16", "--temperature", "0");
    expect(r.err).toMatch(/creating the built-in demo model/);
    expect(r.err).toMatch(/tiny demo model trained on public-domain text/);
    expect(r.code).toBe(0);
    expect(r.out.trim().length).toBeGreaterThan(0);
    const m = STATS_RE.exec(r.err);
    expect(m, r.err).not.toBeNull();
    expect(m![1]).toBe("2"); // <bos> The
    expect(m![2]).toBe("16");
  });

  it("gives the same text for the same seed (another seed, other text), and --json reports the tokens", async () => {
    const args = [
      "complete",
      "--prompt",
      "Once upon a time",
      "--max-new",
      "12",
      "--temperature",
      "1.5",
    ];
    const a = await redwing(...args, "--seed", "11", "--json");
    const b = await redwing(...args, "--seed", "11", "--json");
    expect(a.code).toBe(0);
    const ja = JSON.parse(a.out) as { text: string; tokens: number[]; finish_reason: string };
    const jb = JSON.parse(b.out) as { text: string; tokens: number[] };
    expect(ja.tokens).toHaveLength(12);
    expect(ja.finish_reason).toBe("length");
    expect(jb.tokens).toEqual(ja.tokens);
    expect(jb.text).toBe(ja.text);
    const c = await redwing(...args, "--seed", "12", "--json");
    expect((JSON.parse(c.out) as { tokens: number[] }).tokens).not.toEqual(ja.tokens);
    expect(a.err).toBe(""); // --json: nothing on stderr
  });

  it("--quiet prints only the text, and a stop string cuts it", async () => {
    const base = ["complete", "--prompt", "Hello", "--max-new", "8", "--temperature", "0"];
    const full = await redwing(...base, "--quiet");
    expect(full.err).toBe("");
    expect(full.out.length).toBeGreaterThan(2);
    const stop = full.out.slice(2, 4);
    const cut = await redwing(...base, "--quiet", "--stop", stop);
    expect(cut.out).toBe(full.out.slice(0, full.out.indexOf(stop)));
  });

  it("chats from a messages file with --system", async () => {
    const file = join(home, "messages.json");
    await writeFile(file, JSON.stringify([{ role: "user", content: "Hi there" }]));
    const r = await redwing(
      "chat",
      "--messages-file",
      file,
      "--system",
      "Be brief.",
      "--max-new",
      "4",
      "--json",
    );
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out) as { tokens: number[]; prompt_tokens: number };
    // <bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi there<turn|>\n<|turn>model\n...
    expect(j.prompt_tokens).toBeGreaterThan(10);
    expect(j.tokens.length).toBeLessThanOrEqual(4);
    await writeFile(file, JSON.stringify([{ role: "robot", content: "x" }]));
    const bad = await redwing("chat", "--messages-file", file);
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/message 0 has role "robot"/);
  });

  it("chats interactively on a terminal: turns, /reset, /exit (one loop for local and remote)", async () => {
    // A pseudo-terminal from util-linux's `script` (in every Debian): chat wants a TTY.
    const command = `${BIN} chat --max-new 6 --temperature 0 --system 'Be brief.'`;
    const child = spawn("script", ["-q", "-e", "-c", command, "/dev/null"], {
      env: { ...process.env, REDWING_HOME: home },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
    const promptTokens = () =>
      out
        .split(/\r?\n/)
        .map((line) => STATS_RE.exec(line.replace(/\r/g, "")))
        .filter((m) => m !== null)
        .map((m) => Number(m[1]));
    // readline drops a line typed before it asks again, so each turn waits for the next prompt.
    const prompts = () => out.split("> ").length - 1;
    const turn = async (text: string, replies: number) => {
      const asked = prompts();
      child.stdin.write(`${text}\r`);
      for (let i = 0; i < 300 && (promptTokens().length < replies || prompts() <= asked); i++)
        await sleep(100);
      expect(promptTokens().length, out).toBe(replies);
    };
    for (let i = 0; i < 300 && prompts() === 0; i++) await sleep(100);
    await turn("Hello", 1);
    await turn("And then?", 2); // sees the first turn: a longer prompt
    await turn("/reset", 2);
    await turn("Hello", 3); // starts over: the first turn's prompt again
    child.stdin.write("/exit\r");
    expect(await exited).toBe(0);
    const [first, second, afterReset] = promptTokens();
    expect(second).toBeGreaterThan(first! + 6);
    expect(afterReset).toBe(first);
  });

  it("lists the demo model with size and memory estimate", async () => {
    const r = await redwing("models");
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/^demo\s+\d+\.\d MiB\s+~\d+\.\d MiB\s+gemma4 MoE -- tiny demo model/m);
  });

  it("names a missing model and rejects bad options", async () => {
    const r = await redwing("complete", "--prompt", "x", "--model", "nope");
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/no model named "nope"/);
    const t = await redwing("complete", "--prompt", "x", "--top-p", "2");
    expect(t.code).not.toBe(0);
    expect(t.err).toMatch(/--top-p/);
    const g = await redwing("complete", "--prompt", "x", "--gpu-misses", "gpu");
    expect(g.code).not.toBe(0);
    expect(g.err).toMatch(/--gpu-misses/);
    expect(g.err).toMatch(/Allowed choices are copy, cpu, split/);
    const c = await redwing("complete", "--prompt", "x", "--gpu-expert-copies", "-1");
    expect(c.code).not.toBe(0);
    expect(c.err).toMatch(/--gpu-expert-copies/);
  });

  it("runs with the RAM tier's misses on the CPU (--gpu-misses cpu) where there is no tier", async () => {
    // The CPU backend has no GPU slots, so the option changes nothing: the same greedy text.
    const args = ["complete", "--prompt", "Hello", "--max-new", "8", "--temperature", "0"];
    const plain = await redwing(...args, "--quiet");
    const hybrid = await redwing(
      ...args,
      "--quiet",
      "--gpu-misses",
      "cpu",
      "--gpu-expert-copies",
      "2",
    );
    expect(plain.code).toBe(0);
    expect(hybrid.code).toBe(0);
    expect(hybrid.out).toBe(plain.out);
    // Likewise the misses split between the GPU and the CPU (the engine's default mode).
    const split = await redwing(
      ...args,
      "--quiet",
      "--gpu-misses",
      "split",
      "--gpu-expert-copies",
      "2",
    );
    expect(split.err).toBe("");
    expect(split.code).toBe(0);
    expect(split.out).toBe(plain.out);
  });
});

describe("parseByteSize", () => {
  it("reads sizes with binary units", () => {
    expect(parseByteSize("8G")).toBe(8 * 1024 ** 3);
    expect(parseByteSize("512MiB")).toBe(512 * 1024 ** 2);
    expect(parseByteSize("1.5k")).toBe(1536);
    expect(parseByteSize("100")).toBe(100);
    expect(() => parseByteSize("lots")).toThrow(/size such as/);
  });
});
