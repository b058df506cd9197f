// Attention, first pass: for query row t, head h and split s, the keys i in
// [s * split_len, (s + 1) * split_len) of the visible range (kv_visible in backend.h) give
//   m = max_i score_i, l = sum_i exp(score_i - m), o = sum_i exp(score_i - m) v_i
// with score_i = scale * q . k_i, written to partials[(t, h, s)] as [m, l, o[0..d)], and
// merged exactly into out[t, h] = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s (M = max_s m_s).
// Who merges (p.combine): 0, attention_combine.comp in a second dispatch; 1, the last workgroup
// of each (t, head group) to finish, in this dispatch (a counter per (t, head group) says which is
// last; with one split that workgroup writes out at once). Merging here saves a dispatch and the barrier before
// it on every layer's critical path (docs/gpu.md, "Eleventh round"); the arithmetic and its order
// are attention_combine's, so both give the same bits. The same kernel serves decode (one row,
// many splits over a long context) and prefill calls of fewer rows than
// AttentionSplit::tiled_min_rows (longer ones take attention_tiled.comp); no score matrix larger
// than one split is ever held.
//
// A workgroup scores p.heads_per_group query heads of one KV head (1 to MAX_GROUP; the host
// picks a divisor of p.group): each key and value element is loaded once for all of them. Each
// head's arithmetic, and its order, is the one-head workgroup's, so any p.heads_per_group gives
// the same bits.
//
// With p.fresh (decode of one row, Backend::attention_from_input), q, k and v come raw from
// their products: each workgroup norms and rotates its heads' queries itself, and the workgroups
// of the split that holds the current position norm and rotate its key and norm its value (as
// qmatvec_heads.comp's last workgroups would, with its arithmetic in its order), round them as the
// cache stores them and read them from shared memory instead of the cache; one of them stores
// them in the cache for later tokens. So the products need no per-head epilogue and a layer one
// dependent step less, with the same bits.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

// THREADS threads (256 on a GPU, fewer on a CPU device: docs/gpu.md). Each score is the sum
// of PARTS threads' partial dot products (interleaved elements, 8 independent loads per step), and each output element's sum over keys loads 8 keys
// per step: loops of one dependent load per key or element left a large GPU waiting on memory
// latency (tens of microseconds per call).
layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
const uint PARTS = 8u;
const uint UNROLL = 8u;
layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer KCache { uint k_cache[]; };
layout(std430, set = 0, binding = 2) readonly buffer VCache { uint v_cache[]; };
// coherent: the last workgroup of a (t, head group) reads what the others wrote in this dispatch.
layout(std430, set = 0, binding = 3) coherent buffer Partials { float partials[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Out { float out_values[]; };
// One arrival counter per (t, head group), 0 between dispatches: the last arrival resets it.
layout(std430, set = 0, binding = 5) coherent buffer Counters { uint counters[]; };
// p.fresh: the head norms' weights (bound where p.q_has_weight / p.k_has_weight), the RoPE table
// of the row (cos at [j], sin at [half + j]), the raw key and value rows, and the caches again,
// written (the current position's key and value only: no workgroup of this dispatch reads them
// from the cache).
layout(std430, set = 0, binding = 6) readonly buffer QNorm { float q_norm_weight[]; };
layout(std430, set = 0, binding = 7) readonly buffer KNorm { float k_norm_weight[]; };
layout(std430, set = 0, binding = 8) readonly buffer Table { float cos_sin[]; };
layout(std430, set = 0, binding = 9) readonly buffer KRaw { float k_raw[]; };
layout(std430, set = 0, binding = 10) readonly buffer VRaw { float v_raw[]; };
layout(std430, set = 0, binding = 11) writeonly buffer KStore { uint k_store[]; };
layout(std430, set = 0, binding = 12) writeonly buffer VStore { uint v_store[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint n_heads;
  uint group;  // query heads per KV head
  uint head_dim;
  uint width;  // kv_heads * head_dim
  uint q_offset;
  uint q_stride;
  uint pos0;
  uint capacity;
  uint ring;
  uint window;  // 0: full attention
  uint f16;
  uint splits;
  float scale;
  uint split_len;  // keys per split, at most SPLIT (the host picks fewer for few rows: more
                   // workgroups on a short decode context)
  uint combine;     // 1: merge in the last workgroup of each (t, head group); 0: leave it to
                    // attention_combine.comp
  uint out_offset;  // out's element of (t = 0, h = 0, j = 0), with combine
  uint out_stride;  // between rows t of out
  uint heads_per_group;  // query heads a workgroup scores, 1 to MAX_GROUP, dividing group
  uint fresh;            // 1: q, k and v raw from their products (one row; the header says how)
  uint q_has_weight;
  uint k_has_weight;
  float weight_offset;
  float eps;
  uint v_norm;   // the values normed without a weight
  uint also_v;   // the values are the keys' raw product (v_raw unused)
  uint k_offset;  // the raw key row's first element in k_raw (the KV heads side by side)
  uint v_offset;
} p;

const uint SPLIT = 256u;  // the most keys of one split (scores' size)
const uint MAX_HEAD_DIM = 512u;
const uint MAX_GROUP = 4u;  // query heads of one workgroup; heads x head_dim <= MAX_QUERY
const uint MAX_QUERY = 1024u;
shared float qs[MAX_QUERY];             // head g's query at [g * d, (g + 1) * d)
shared float scores[MAX_GROUP * SPLIT];  // head g's at [g * SPLIT, ...)
shared float reduce[MAX_GROUP * 256];    // head g's at [g * THREADS, ...); THREADS <= 256
shared uint merges;  // 1: this workgroup is its (t, head group)'s last to finish
// p.fresh: the current position's key and value, rounded as the cache holds them.
shared float cur_k[MAX_HEAD_DIM];
shared float cur_v[MAX_HEAD_DIM];

#include "kv_read.glsl"

// The merge of head head_id's (a row's head among all rows' heads) splits into its output, which
// starts at out_values[out_base]: attention_combine.comp's merge, the same expressions in the same
// order of accumulation, so the same bits (a sum written differently, a rounded product then an
// add where the combine has one fused multiply-add, changed greedy tokens on the H200). Its loads
// are spread over the workgroup: each thread loads one split's m and l, the weights
// exp(m_s - M) and the l_s go through shared memory (scores and reduce, free now), and each
// output element's UNROLL loads are issued before any is used (a first version that read every
// split's m and l in every thread, one dependent load after another, was 7% slower than two
// dispatches after 512 tokens). Per chunk of SPLIT splits.
void merge_head(uint head_id, uint out_base) {
  const uint tid = gl_LocalInvocationID.x;
  const uint d = p.head_dim;
  const uint base = head_id * p.splits * (d + 2u);
  float local_m = -3.402823466e38;
  for (uint s2 = tid; s2 < p.splits; s2 += THREADS) {
    if (partials[base + s2 * (d + 2u) + 1u] > 0.0)
      local_m = max(local_m, partials[base + s2 * (d + 2u)]);
  }
  reduce[tid] = local_m;
  barrier();
  for (uint r = THREADS / 2u; r > 0u; r >>= 1u) {
    if (tid < r) reduce[tid] = max(reduce[tid], reduce[tid + r]);
    barrier();
  }
  const float mm = reduce[0];  // max is exact in any order
  float denominator = 0.0;    // thread 0's, in ascending split order
  for (uint j = tid; j < d; j += THREADS) qs[j] = 0.0;  // the output's sums (qs is free now)
  for (uint c0 = 0u; c0 < p.splits; c0 += SPLIT) {
    const uint n_chunk = min(SPLIT, p.splits - c0);
    barrier();  // the previous chunk's weights and terms are used; M read from reduce[0]
    for (uint i = tid; i < n_chunk; i += THREADS) {
      const uint b = base + (c0 + i) * (d + 2u);
      const float l_s = partials[b + 1u];
      // A split without keys (l = 0) adds nothing: weight 0 on its zero sums, as the combine
      // skips it.
      const float weight = l_s > 0.0 ? exp(partials[b] - mm) : 0.0;
      scores[i] = weight;
      reduce[i] = l_s;
    }
    barrier();
    if (tid == 0u) {
      // The combine's expression, so that a compiler contracts it the same way (one fma).
      for (uint i = 0u; i < n_chunk; ++i)
        if (reduce[i] > 0.0) denominator += scores[i] * reduce[i];
    }
    for (uint j = tid; j < d; j += THREADS) {
      float o = qs[j];
      for (uint i1 = 0u; i1 < n_chunk; i1 += UNROLL) {
        float values[UNROLL];
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
          const uint i = min(i1 + u, n_chunk - 1u);
          values[u] = partials[base + (c0 + i) * (d + 2u) + 2u + j];
        }
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
          if (i1 + u < n_chunk && scores[i1 + u] > 0.0) o += scores[i1 + u] * values[u];
        }
      }
      qs[j] = o;
    }
  }
  if (tid == 0u) reduce[0] = denominator;
  barrier();
  const float inv = 1.0 / reduce[0];
  for (uint j = tid; j < d; j += THREADS) out_values[out_base + j] = qs[j] * inv;
}

// Sums reduce[g * THREADS + i] over i into reduce[g * THREADS] for each g < count: trees side by
// side, each matvec.glsl's mv_workgroup_sum tree (the same order). Every thread must call it
// after writing its values (barriers inside).
void sum_trees(uint count) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();
  for (uint r = THREADS / 2u; r > 0u; r >>= 1u) {
    if (tid < r)
      for (uint g = 0u; g < count; ++g) reduce[g * THREADS + tid] += reduce[g * THREADS + tid + r];
    barrier();
  }
}

// p.fresh: a head norm's weight factor (qmatvec_heads.comp's weight_factor).
float q_weight(uint c) { return p.q_has_weight != 0u ? p.weight_offset + q_norm_weight[c] : 1.0; }
float k_weight(uint c) { return p.k_has_weight != 0u ? p.weight_offset + k_norm_weight[c] : 1.0; }

// x as the cache holds it: an IEEE half's value (kv_store.comp's rounding) or x itself.
float as_stored(float x) { return p.f16 != 0u ? unpackHalf2x16(f32_to_f16_bits(x)).x : x; }

// p.fresh: the queries in qs normed per head and rotated in place, and where `current` (this
// workgroup's split holds the current position) the key and value of that position into cur_k
// and cur_v, rounded as stored, and by one workgroup of the KV head into the caches. Each sum of
// squares is matvec.glsl's mv_workgroup_sum tree (several side by side), and every expression is
// qmatvec_heads.comp's, in its order: the same bits as the products' per-head epilogues.
void fresh_inputs(uint hg, uint h0, uint kv_head, uint d, uint pos, bool current) {
  const uint tid = gl_LocalInvocationID.x;
  const uint half_d = d / 2u;
  barrier();  // qs written
  for (uint g = 0u; g < hg; ++g) {
    float ss = 0.0;
    for (uint c = tid; c < d; c += THREADS) ss += qs[g * d + c] * qs[g * d + c];
    reduce[g * THREADS + tid] = ss;
  }
  sum_trees(hg);
  for (uint g = 0u; g < hg; ++g) {
    const float inv = inv_rms(reduce[g * THREADS], d, p.eps);
    for (uint j = tid; j < half_d; j += THREADS) {  // each thread owns its pairs
      const float a = qs[g * d + j] * inv * q_weight(j);
      const float b = qs[g * d + j + half_d] * inv * q_weight(j + half_d);
      const vec2 r = rotate_pair(a, b, cos_sin[j], cos_sin[half_d + j]);
      qs[g * d + j] = r.x;
      qs[g * d + j + half_d] = r.y;
    }
  }
  if (!current) return;  // uniform over the workgroup

  const uint kb = p.k_offset + kv_head * d;
  const uint vb = p.v_offset + kv_head * d;
  const bool v_own = p.also_v == 0u;  // a value row of its own, else the key's raw row
  barrier();  // the queries' sums read
  float ssk = 0.0;
  float ssv = 0.0;
  for (uint c = tid; c < d; c += THREADS) {
    ssk += k_raw[kb + c] * k_raw[kb + c];
    if (v_own) ssv += v_raw[vb + c] * v_raw[vb + c];
  }
  reduce[tid] = ssk;
  reduce[THREADS + tid] = ssv;
  sum_trees(2u);
  const float inv_k = inv_rms(reduce[0], d, p.eps);
  float inv_v = inv_k;  // a raw key row's norm is its value's too
  if (v_own) inv_v = p.v_norm != 0u ? inv_rms(reduce[THREADS], d, p.eps) : 1.0;
  for (uint j = tid; j < half_d; j += THREADS) {
    const float a = k_raw[kb + j] * inv_k * k_weight(j);
    const float b = k_raw[kb + j + half_d] * inv_k * k_weight(j + half_d);
    const vec2 r = rotate_pair(a, b, cos_sin[j], cos_sin[half_d + j]);
    cur_k[j] = as_stored(r.x);
    cur_k[j + half_d] = as_stored(r.y);
  }
  for (uint j = tid; j < d; j += THREADS) {
    const float raw = v_own ? v_raw[vb + j] : k_raw[kb + j];
    cur_v[j] = as_stored(p.v_norm != 0u ? raw * inv_v : raw);
  }
  barrier();
  if (h0 % p.group != 0u) return;  // the KV head's first head group stores them
  const uint slot = p.ring != 0u ? pos % p.capacity : pos;
  const uint e0 = slot * p.width + kv_head * d;  // the head's first element in a cache
  if (p.f16 != 0u) {
    for (uint i = tid; i < half_d; i += THREADS) {
      k_store[e0 / 2u + i] = f16_pair_bits(cur_k[2u * i], cur_k[2u * i + 1u]);
      v_store[e0 / 2u + i] = f16_pair_bits(cur_v[2u * i], cur_v[2u * i + 1u]);
    }
  } else {
    for (uint j = tid; j < d; j += THREADS) {
      k_store[e0 + j] = floatBitsToUint(cur_k[j]);
      v_store[e0 + j] = floatBitsToUint(cur_v[j]);
    }
  }
}

void main() {
  const uint id = linear_group();
  const uint hg = p.heads_per_group;
  const uint head_groups = p.n_heads / hg;
  if (id >= p.rows * head_groups * p.splits) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint s = id % p.splits;
  const uint h0 = ((id / p.splits) % head_groups) * hg;  // this workgroup's first query head
  const uint t = id / (p.splits * head_groups);
  const uint d = p.head_dim;
  const uint kv_head = h0 / p.group;
  const uint pos = p.pos0 + t;
  const uint first = first_visible(pos);
  const uint n = pos - first + 1u;
  const uint i0 = s * p.split_len;
  const uint count = i0 < n ? min(p.split_len, n - i0) : 0u;

  for (uint j = tid; j < hg * d; j += THREADS) qs[j] = q[p.q_offset + t * p.q_stride + h0 * d + j];
  // p.fresh: this split holds the current position (the last visible key) where it ends at n.
  const bool current = p.fresh != 0u && count > 0u && i0 + count == n;
  if (p.fresh != 0u) fresh_inputs(hg, h0, kv_head, d, pos, current);  // uniform

  // Scores: key i of a pass is handled by threads [i * PARTS, (i + 1) * PARTS), each loading its
  // elements of the key once for every head.
  const uint part = tid % PARTS;
  for (uint i0k = 0u; i0k < count; i0k += THREADS / PARTS) {
    barrier();  // qs written; the previous pass's partial sums read
    const uint i = i0k + tid / PARTS;
    float dot_part[MAX_GROUP];
    [[unroll]] for (uint g = 0u; g < MAX_GROUP; ++g) dot_part[g] = 0.0;
    if (i < count) {
      const uint key = first + i0 + i;
      const uint slot = p.ring != 0u ? key % p.capacity : key;
      const uint base = slot * p.width + kv_head * d;
      for (uint j0 = part; j0 < d; j0 += PARTS * UNROLL) {
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
          const uint j = j0 + u * PARTS;
          if (j < d) {
            const float k_j = current && key == pos ? cur_k[j] : cache_value(base + j, true);
            [[unroll]] for (uint g = 0u; g < MAX_GROUP; ++g)
              if (g < hg) dot_part[g] += qs[g * d + j] * k_j;
          }
        }
      }
    }
    [[unroll]] for (uint g = 0u; g < MAX_GROUP; ++g)
      if (g < hg) reduce[g * THREADS + tid] = dot_part[g];
    barrier();
    if (part == 0u && i < count) {
      for (uint g = 0u; g < hg; ++g) {
        float dot_qk = 0.0;
        for (uint k = 0u; k < PARTS; ++k) dot_qk += reduce[g * THREADS + tid + k];
        scores[g * SPLIT + i] = dot_qk * p.scale;
      }
    }
  }
  barrier();

  // Each head's max and sum of exponentials: one tree per head, the heads' trees side by side.
  for (uint g = 0u; g < hg; ++g) {
    float local_max = -3.402823466e38;
    for (uint i = tid; i < count; i += THREADS) local_max = max(local_max, scores[g * SPLIT + i]);
    reduce[g * THREADS + tid] = local_max;
  }
  barrier();
  for (uint r = THREADS / 2u; r > 0u; r >>= 1u) {
    if (tid < r)
      for (uint g = 0u; g < hg; ++g)
        reduce[g * THREADS + tid] = max(reduce[g * THREADS + tid], reduce[g * THREADS + tid + r]);
    barrier();
  }
  float m[MAX_GROUP];
  [[unroll]] for (uint g = 0u; g < MAX_GROUP; ++g) m[g] = g < hg ? reduce[g * THREADS] : 0.0;
  barrier();
  for (uint g = 0u; g < hg; ++g) {
    float local_sum = 0.0;
    for (uint i = tid; i < count; i += THREADS) {
      const float e = exp(scores[g * SPLIT + i] - m[g]);
      scores[g * SPLIT + i] = e;
      local_sum += e;
    }
    reduce[g * THREADS + tid] = local_sum;
  }
  sum_trees(hg);
  float l[MAX_GROUP];
  [[unroll]] for (uint g = 0u; g < MAX_GROUP; ++g) l[g] = g < hg ? reduce[g * THREADS] : 0.0;

  // With one split and the merge here, o / l is the output (the merge's arithmetic for one
  // split: exp(m - m) = 1).
  const bool alone = p.combine != 0u && p.splits == 1u;
  const uint row_head0 = t * p.n_heads + h0;  // (t, h0)'s index among all rows' heads
  for (uint j = tid; j < d; j += THREADS) {
    float o[MAX_GROUP];
    [[unroll]] for (uint g = 0u; g < MAX_GROUP; ++g) o[g] = 0.0;
    for (uint i1 = 0u; i1 < count; i1 += UNROLL) {
      [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
        const uint i = i1 + u;
        if (i < count) {
          const uint key = first + i0 + i;
          const uint slot = p.ring != 0u ? key % p.capacity : key;
          const float v_j = current && key == pos
                                ? cur_v[j]
                                : cache_value(slot * p.width + kv_head * d + j, false);
          [[unroll]] for (uint g = 0u; g < MAX_GROUP; ++g)
            if (g < hg) o[g] += scores[g * SPLIT + i] * v_j;
        }
      }
    }
    [[unroll]] for (uint g = 0u; g < MAX_GROUP; ++g) {
      if (g >= hg) break;
      if (alone)
        out_values[p.out_offset + t * p.out_stride + (h0 + g) * d + j] = o[g] * (1.0 / l[g]);
      else
        partials[((row_head0 + g) * p.splits + s) * (d + 2u) + 2u + j] = o[g];
    }
  }
  if (tid == 0u && !alone) {
    for (uint g = 0u; g < hg; ++g) {
      const uint out_base = ((row_head0 + g) * p.splits + s) * (d + 2u);
      partials[out_base] = count > 0u ? m[g] : -3.402823466e38;
      partials[out_base + 1u] = l[g];
    }
  }
  if (alone || p.combine == 0u) return;

  // Count this workgroup in: once every thread's partials are visible device-wide, one atomic;
  // the workgroup that brings the count to `splits` is the last and merges its heads.
  const uint group_id = id / p.splits;  // (t, head group)
  memoryBarrierBuffer();
  barrier();
  if (tid == 0u) {
    const uint before = atomicAdd(counters[group_id], 1u);
    merges = before == p.splits - 1u ? 1u : 0u;
    // Every other arrival is in: 0 again for the next dispatch.
    if (merges != 0u) atomicExchange(counters[group_id], 0u);
  }
  barrier();
  if (merges == 0u) return;  // uniform over the workgroup
  memoryBarrierBuffer();  // the other workgroups' partials, as their atomics published them

  for (uint g = 0u; g < hg; ++g) {
    barrier();  // the previous head's output written from qs
    merge_head(row_head0 + g, p.out_offset + t * p.out_stride + (h0 + g) * d);
  }
}
