// Attention, first pass: for query row t, head h and split s, the keys i in
// [s * split_len, (s + 1) * split_len) of the visible range (kv_visible in backend.h) give
//   m = max_i score_i, l = sum_i exp(score_i - m), o = sum_i exp(score_i - m) v_i
// with score_i = scale * q . k_i, written to partials[(t, h, s)] as [m, l, o[0..d)].
// attention_combine.comp merges the splits exactly. The same kernels serve decode (one row,
// many splits over a long context) and prefill (many rows); no score matrix larger than one
// split is ever held.
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
layout(std430, set = 0, binding = 3) writeonly buffer Partials { float partials[]; };
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
} p;

const uint SPLIT = 256u;  // the most keys of one split (scores' size)
const uint MAX_HEAD_DIM = 512u;
shared float qs[MAX_HEAD_DIM];
shared float scores[SPLIT];
shared float reduce[256];  // THREADS at most

float cache_value(uint word_index_f32, bool is_k) {
  // Element e of the cache as float32 (f16 caches hold two halves per word).
  const uint e = word_index_f32;
  if (p.f16 != 0u) {
    const uint w = is_k ? k_cache[e >> 1u] : v_cache[e >> 1u];
    return unpackHalf2x16(w >> ((e & 1u) * 16u)).x;
  }
  return uintBitsToFloat(is_k ? k_cache[e] : v_cache[e]);
}

void main() {
  const uint id = linear_group();
  if (id >= p.rows * p.n_heads * p.splits) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint s = id % p.splits;
  const uint h = (id / p.splits) % p.n_heads;
  const uint t = id / (p.splits * p.n_heads);
  const uint d = p.head_dim;
  const uint kv_head = h / p.group;
  const uint pos = p.pos0 + t;
  const uint first = (p.window > 0u && pos >= p.window) ? pos - p.window + 1u : 0u;
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
    partials[out_base + 2u + j] = o;
  }
  if (tid == 0u) {
    partials[out_base] = count > 0u ? m : -3.402823466e38;
    partials[out_base + 1u] = l;
  }
}
