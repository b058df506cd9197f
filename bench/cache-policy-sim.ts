/**
 * Expert-cache simulation over routing traces: the hit rate of a per-layer cache of N expert
 * slots under an eviction policy, with the expert store's request semantics
 * (native/src/runtime/expert_store.cpp): a request is one token's top-k experts in one layer;
 * its experts are counted as used, the ones already cached are hits, each miss takes an empty
 * slot or evicts one not in the current request.
 *
 * Policies: "lfu" (fewest uses over the whole run, ties to the least recently used: the store's
 * default until now), "lru", "lrfu" (Lee et al., "LRFU: a spectrum of policies that subsumes
 * the least recently used and least frequently used policies", IEEE Trans. Computers 2001:
 * evict the smallest combined recency-frequency value, each past use weighted 2^(-age / h), age
 * in requests of that layer; h -> infinity is LFU, small h is LRU), and "belady" (evict the
 * expert used again farthest in the future: the offline optimum, an upper bound).
 */

/** Routing of one layer: one row per token, the k experts it used. */
export type LayerTrace = number[][];
/** layer -> rows. */
export type Trace = Map<number, LayerTrace>;

export type Policy =
  { kind: "lfu" } | { kind: "lru" } | { kind: "lrfu"; halfLife: number } | { kind: "belady" };

export function policyName(p: Policy): string {
  return p.kind === "lrfu" ? `lrfu(h=${p.halfLife})` : p.kind;
}

/** Parses `--record-routing` output: lines "layer e1 e2 ... ek". */
export function parseTrace(text: string, into: Trace = new Map()): Trace {
  for (const line of text.split("\n")) {
    const parts = line.trim().split(/\s+/);
    if (parts.length < 2 || parts[0] === "") continue;
    const [layer, ...experts] = parts.map(Number);
    if (!Number.isInteger(layer) || experts.some((e) => !Number.isInteger(e))) {
      throw new Error(`bad routing trace line: ${JSON.stringify(line)}`);
    }
    const rows = into.get(layer!) ?? [];
    rows.push(experts);
    into.set(layer!, rows);
  }
  return into;
}

/** A uniform trace of the same shape: each row k distinct experts drawn uniformly (seeded). */
export function uniformTrace(like: Trace, numExperts: number, seed = 1): Trace {
  let state = seed >>> 0 || 1;
  const next = (): number => {
    // xorshift32: deterministic and good enough to draw expert ids
    state ^= state << 13;
    state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5;
    state >>>= 0;
    return state / 2 ** 32;
  };
  const out: Trace = new Map();
  for (const [layer, rows] of like) {
    out.set(
      layer,
      rows.map((row) => {
        const picked = new Set<number>();
        while (picked.size < row.length) picked.add(Math.floor(next() * numExperts));
        return [...picked];
      }),
    );
  }
  return out;
}

export interface SimResult {
  hits: number;
  accesses: number;
}

/** Simulates one layer's cache of `slots` slots (slots >= k) under `policy`. */
export function simulateLayer(rows: LayerTrace, slots: number, policy: Policy): SimResult {
  const cached = new Set<number>();
  const uses = new Map<number, number>();
  const lastUse = new Map<number, number>();
  const crf = new Map<number, { value: number; at: number }>();
  let hits = 0;
  let accesses = 0;
  // Belady: for each row, when each of its experts is used next (row index, or Infinity).
  let nextUse: Map<number, number>[] = [];
  if (policy.kind === "belady") {
    nextUse = new Array<Map<number, number>>(rows.length);
    const seen = new Map<number, number>();
    for (let t = rows.length - 1; t >= 0; t--) {
      nextUse[t] = new Map(rows[t]!.map((e) => [e, seen.get(e) ?? Infinity]));
      for (const e of rows[t]!) seen.set(e, t);
    }
  }
  const crfNow = (e: number, t: number): number => {
    const c = crf.get(e);
    if (!c || policy.kind !== "lrfu") return 0;
    return c.value * 2 ** (-(t - c.at) / policy.halfLife);
  };
  const belady = new Map<number, number>(); // expert -> its next use, as of its last request
  for (let t = 0; t < rows.length; t++) {
    const row = rows[t]!;
    const request = new Set(row);
    for (const e of request) {
      uses.set(e, (uses.get(e) ?? 0) + 1);
      if (policy.kind === "lrfu") crf.set(e, { value: crfNow(e, t) + 1, at: t });
      if (policy.kind === "belady") belady.set(e, nextUse[t]!.get(e)!);
    }
    for (const e of request) {
      accesses++;
      if (cached.has(e)) {
        hits++;
      } else {
        if (cached.size >= slots) {
          let victim = -1;
          let worst: number[] = [];
          for (const c of cached) {
            if (request.has(c)) continue; // pinned by this request
            // Smaller key = evicted first; the last element breaks ties by recency.
            const key =
              policy.kind === "lfu"
                ? [uses.get(c)!, lastUse.get(c)!]
                : policy.kind === "lru"
                  ? [lastUse.get(c)!]
                  : policy.kind === "lrfu"
                    ? [crfNow(c, t), lastUse.get(c)!]
                    : [-belady.get(c)!, lastUse.get(c)!];
            if (victim < 0 || lessThan(key, worst)) {
              victim = c;
              worst = key;
            }
          }
          if (victim < 0) throw new Error(`slots (${slots}) < experts per request`);
          cached.delete(victim);
        }
        cached.add(e);
      }
    }
    for (const e of request) lastUse.set(e, t);
  }
  return { hits, accesses };
}

function lessThan(a: number[], b: number[]): boolean {
  for (let i = 0; i < a.length; i++) {
    if (a[i]! !== b[i]!) return a[i]! < b[i]!;
  }
  return false;
}

/** Hit rate over all layers of a trace. */
export function hitRate(trace: Trace, slots: number, policy: Policy): number {
  let hits = 0;
  let accesses = 0;
  for (const rows of trace.values()) {
    const r = simulateLayer(rows, slots, policy);
    hits += r.hits;
    accesses += r.accesses;
  }
  return accesses === 0 ? 0 : hits / accesses;
}
