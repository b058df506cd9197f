// Attention, first pass: for query row t, head h and split s, the keys i in
// [s * split_len, (s + 1) * split_len) of the visible range (kv_visible in backend.h) give
//   m = max_i score_i, l = sum_i exp(score_i - m), o = sum_i exp(score_i - m) v_i
// with score_i = scale * q . k_i, written to partials[(t, h, s)] as [m, l, o[0..d)], and
// merged exactly into out[t, h] = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s (M = max_s m_s).
// Who merges (p.combine): 0, attention_combine.comp in a second dispatch; 1, the last workgroup
// of each (t, h) to finish, in this dispatch (a counter per (t, h) says which is last; with one
// split that workgroup writes out at once). Merging here saves a dispatch and the barrier before
// it on every layer's critical path (docs/gpu.md, "Eleventh round"); the arithmetic and its order
// are attention_combine's, so both give the same bits. The same kernel serves decode (one row,
// many splits over a long context) and prefill calls of fewer rows than
// AttentionSplit::tiled_min_rows (longer ones take attention_tiled.comp); no score matrix larger
// than one split is ever held.
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
// coherent: written by the steps before, which a chained dispatch waits for (chain.glsl).
layout(std430, set = 0, binding = 0) coherent readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) coherent readonly buffer KCache { uint k_cache[]; };
layout(std430, set = 0, binding = 2) coherent readonly buffer VCache { uint v_cache[]; };
// coherent: the last workgroup of a (t, h) reads what the others wrote in this dispatch.
layout(std430, set = 0, binding = 3) coherent buffer Partials { float partials[]; };
layout(std430, set = 0, binding = 4) coherent writeonly buffer Out { float out_values[]; };
// One arrival counter per (t, h), 0 between dispatches: the last arrival resets it.
layout(std430, set = 0, binding = 5) coherent buffer Counters { uint counters[]; };
#include "chain.glsl"
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
  uint combine;     // 1: merge in the last workgroup of each (t, h); 0: leave it to
                    // attention_combine.comp
  uint out_offset;  // out's element of (t = 0, h = 0, j = 0), with combine
  uint out_stride;  // between rows t of out
  CHAIN_PARAMS
} p;

const uint SPLIT = 256u;  // the most keys of one split (scores' size)
const uint MAX_HEAD_DIM = 512u;
shared float qs[MAX_HEAD_DIM];
shared float scores[SPLIT];
shared float reduce[256];  // THREADS at most
shared uint merges;  // 1: this workgroup is its (t, h)'s last to finish

#include "kv_read.glsl"

void attend(uint id);
void main() {
  chain_wait(p.chain_wait, p.chain_target);
  const uint id = linear_group();
  if (id < p.rows * p.n_heads * p.splits) attend(id);  // uniform over the workgroup
  chain_signal(p.chain_signal);
}

void attend(uint id) {
  const uint tid = gl_LocalInvocationID.x;
  const uint s = id % p.splits;
  const uint h = (id / p.splits) % p.n_heads;
  const uint t = id / (p.splits * p.n_heads);
  const uint d = p.head_dim;
  const uint kv_head = h / p.group;
  const uint pos = p.pos0 + t;
  const uint first = first_visible(pos);
  const uint n = pos - first + 1u;
  const uint i0 = s * p.split_len;
  const uint count = i0 < n ? min(p.split_len, n - i0) : 0u;
  const uint out_base = id * (d + 2u);

  for (uint j = tid; j < d; j += THREADS) qs[j] = q[p.q_offset + t * p.q_stride + h * d + j];

  // Scores: key i of a pass is handled by threads [i * PARTS, (i + 1) * PARTS).
  const uint part = tid % PARTS;
  for (uint i0k = 0u; i0k < count; i0k += THREADS / PARTS) {
    barrier();  // qs written; the previous pass's partial sums read
    const uint i = i0k + tid / PARTS;
    float dot_part = 0.0;
    if (i < count) {
      const uint key = first + i0 + i;
      const uint slot = p.ring != 0u ? key % p.capacity : key;
      const uint base = slot * p.width + kv_head * d;
      for (uint j0 = part; j0 < d; j0 += PARTS * UNROLL) {
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
          const uint j = j0 + u * PARTS;
          if (j < d) dot_part += qs[j] * cache_value(base + j, true);
        }
      }
    }
    reduce[tid] = dot_part;
    barrier();
    if (part == 0u && i < count) {
      float dot_qk = 0.0;
      for (uint k = 0u; k < PARTS; ++k) dot_qk += reduce[tid + k];
      scores[i] = dot_qk * p.scale;
    }
  }
  barrier();

  float local_max = -3.402823466e38;
  for (uint i = tid; i < count; i += THREADS) local_max = max(local_max, scores[i]);
  reduce[tid] = local_max;
  barrier();
  for (uint r = THREADS / 2u; r > 0u; r >>= 1u) {
    if (tid < r) reduce[tid] = max(reduce[tid], reduce[tid + r]);
    barrier();
  }
  const float m = reduce[0];
  barrier();
  float local_sum = 0.0;
  for (uint i = tid; i < count; i += THREADS) {
    const float e = exp(scores[i] - m);
    scores[i] = e;
    local_sum += e;
  }
  reduce[tid] = local_sum;
  barrier();
  for (uint r = THREADS / 2u; r > 0u; r >>= 1u) {
    if (tid < r) reduce[tid] += reduce[tid + r];
    barrier();
  }
  const float l = reduce[0];

  // With one split and the merge here, o / l is the output (the merge's arithmetic for one
  // split: exp(m - m) = 1).
  const bool alone = p.combine != 0u && p.splits == 1u;
  const uint out_base_t = p.out_offset + t * p.out_stride + h * d;
  for (uint j = tid; j < d; j += THREADS) {
    float o = 0.0;
    for (uint i1 = 0u; i1 < count; i1 += UNROLL) {
      [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
        const uint i = i1 + u;
        if (i < count) {
          const uint key = first + i0 + i;
          const uint slot = p.ring != 0u ? key % p.capacity : key;
          o += scores[i] * cache_value(slot * p.width + kv_head * d + j, false);
        }
      }
    }
    if (alone)
      out_values[out_base_t + j] = o * (1.0 / l);
    else
      partials[out_base + 2u + j] = o;
  }
  if (alone || p.combine == 0u) {
    if (tid == 0u && !alone) {
      partials[out_base] = count > 0u ? m : -3.402823466e38;
      partials[out_base + 1u] = l;
    }
    return;
  }
  if (tid == 0u) {
    partials[out_base] = count > 0u ? m : -3.402823466e38;
    partials[out_base + 1u] = l;
  }

  // Count this workgroup in: once every thread's partials are visible device-wide, one atomic;
  // the workgroup that brings the count to `splits` is the last and merges.
  const uint head_id = t * p.n_heads + h;
  memoryBarrierBuffer();
  barrier();
  if (tid == 0u) {
    const uint before = atomicAdd(counters[head_id], 1u);
    merges = before == p.splits - 1u ? 1u : 0u;
    // Every other arrival is in: 0 again for the next dispatch.
    if (merges != 0u) atomicExchange(counters[head_id], 0u);
  }
  barrier();
  if (merges == 0u) return;  // uniform over the workgroup
  memoryBarrierBuffer();  // the other workgroups' partials, as their atomics published them

  // attention_combine.comp's merge: the same expressions in the same order of accumulation, so
  // the same bits (a sum written differently, a rounded product then an add where the combine
  // has one fused multiply-add, changed greedy tokens on the H200). Its loads are spread over the
  // workgroup: each thread loads one split's m and l, the weights exp(m_s - M) and the l_s go
  // through shared memory (scores and reduce, free now), and each output element's UNROLL loads
  // are issued before any is used (a first version that read every split's m and l in every
  // thread, one dependent load after another, was 7% slower than two dispatches after 512
  // tokens). Per chunk of SPLIT splits.
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
  for (uint j = tid; j < d; j += THREADS) out_values[out_base_t + j] = qs[j] * inv;
}
