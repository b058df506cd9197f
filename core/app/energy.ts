/**
 * Power readings for the live panel, where the machine exposes them:
 *
 * - Linux powercap / RAPL: `/sys/class/powercap/intel-rapl:<n>/energy_uj`, a cumulative energy
 *   counter per CPU package (AMD packages appear under the same driver name). Power is the
 *   difference of two readings over the time between them; the counter wraps at
 *   `max_energy_range_uj`. Since Linux 5.10 these files are readable by root only, so most
 *   desktop sessions get no reading (the panel then hides energy).
 * - NVIDIA GPUs: `nvidia-smi --query-gpu=power.draw` (NVML underneath), only when the tool is
 *   installed.
 *
 * Every reader answers null when it has nothing, never throws.
 */
import { execFile } from "node:child_process";
import { accessSync, constants, readdirSync, readFileSync } from "node:fs";
import { delimiter, join } from "node:path";

export interface PowerMeter {
  /** Which source this is ("rapl", "nvidia-smi"). */
  readonly source: string;
  /** Watts since the previous call (the first call primes the counters: null). */
  read(): Promise<number | null>;
}

interface Domain {
  energyPath: string;
  maxRange: number;
  last: number | null;
}

/** Microjoules between two readings of a counter that wraps after `maxRange`. */
export function energyDelta(previous: number, current: number, maxRange: number): number {
  if (current >= previous) return current - previous;
  // Wrapped: up to the end of the range, then from zero.
  return maxRange - previous + current;
}

function readNumber(path: string): number | null {
  try {
    const n = Number(readFileSync(path, "utf8").trim());
    return Number.isFinite(n) ? n : null;
  } catch {
    return null;
  }
}

/**
 * Package power from RAPL under `root` (default /sys/class/powercap). Only the top-level
 * `intel-rapl:<n>` domains are summed: their `intel-rapl:<n>:<m>` subdomains (cores, uncore,
 * DRAM) are parts of the package and would be counted twice. Null when none is readable.
 */
export function raplMeter(
  root = "/sys/class/powercap",
  now: () => number = () => performance.now(),
): PowerMeter | null {
  let names: string[];
  try {
    names = readdirSync(root).filter((n) => /^intel-rapl:\d+$/.test(n));
  } catch {
    return null;
  }
  const domains: Domain[] = [];
  for (const name of names.sort()) {
    const energyPath = join(root, name, "energy_uj");
    if (readNumber(energyPath) === null) continue; // not readable (root only)
    const maxRange = readNumber(join(root, name, "max_energy_range_uj")) ?? 2 ** 32;
    domains.push({ energyPath, maxRange, last: null });
  }
  if (domains.length === 0) return null;
  let lastT: number | null = null;
  return {
    source: "rapl",
    async read() {
      const t = now();
      let microjoules = 0;
      let primed = lastT !== null;
      for (const d of domains) {
        const e = readNumber(d.energyPath);
        if (e === null) return null;
        if (d.last === null) primed = false;
        else microjoules += energyDelta(d.last, e, d.maxRange);
        d.last = e;
      }
      const dt = lastT === null ? 0 : (t - lastT) / 1000;
      lastT = t;
      if (!primed || dt <= 0) return null;
      return microjoules / 1e6 / dt;
    },
  };
}

/** `nvidia-smi` on PATH, or null. */
export function findOnPath(name: string, env: Record<string, string | undefined>): string | null {
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    if (!dir) continue;
    const path = join(dir, name);
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {
      // not here
    }
  }
  return null;
}

/** The sum of `power.draw` over the GPUs nvidia-smi lists, in watts. */
export function parseNvidiaSmiPower(stdout: string): number | null {
  let sum = 0;
  let any = false;
  for (const line of stdout.split("\n")) {
    const n = Number(line.trim());
    if (line.trim() !== "" && Number.isFinite(n)) {
      sum += n;
      any = true;
    }
  }
  return any ? sum : null;
}

export function nvidiaSmiMeter(
  env: Record<string, string | undefined> = process.env,
): PowerMeter | null {
  const binary = findOnPath("nvidia-smi", env);
  if (!binary) return null;
  return {
    source: "nvidia-smi",
    read: () =>
      new Promise((resolve) => {
        execFile(
          binary,
          ["--query-gpu=power.draw", "--format=csv,noheader,nounits"],
          { timeout: 2000 },
          (error, stdout) => resolve(error ? null : parseNvidiaSmiPower(stdout)),
        );
      }),
  };
}

/** The first source this machine offers (RAPL for the CPU engine, else the GPU), or null. */
export function defaultPowerMeter(
  env: Record<string, string | undefined> = process.env,
): PowerMeter | null {
  if (process.platform === "linux") {
    const rapl = raplMeter();
    if (rapl) return rapl;
  }
  return nvidiaSmiMeter(env);
}

/** Joules per generated token: power over the decode rate, while generating. */
export function joulesPerToken(
  watts: number | null,
  tokensPerSecond: number | null,
): number | null {
  if (watts === null || tokensPerSecond === null || tokensPerSecond <= 0) return null;
  return watts / tokensPerSecond;
}
