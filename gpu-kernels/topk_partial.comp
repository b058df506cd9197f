// Sampling, first pass: each workgroup takes `chunk` logits of one row and writes its k largest
// (descending; ties: lower id), its max, the sum of exp(l - max) over its logits, and whether any
// logit is inf or NaN. topk_merge.comp combines the workgroups. Output per workgroup g, as words
// from g * (2k + 3): k ids (-1 past the chunk's end), k logits, max, sum, non-finite count.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Partial { uint partial[]; };
layout(push_constant) uniform Params {
  uint n;       // logits in the row
  uint offset;  // the row's first element
  uint k;       // at most MAX_K
  uint chunk;   // logits per workgroup
} p;

const uint MAX_K = 64u;
const float LOWEST = -3.402823466e38;
shared float sv[256];  // THREADS at most
shared int si[256];  // THREADS at most
shared uint sflag[256];  // THREADS at most

// a before b in the sampler's order: larger logit first, lower id on ties.
bool before(float va, int ia, float vb, int ib) {
  return ib < 0 || (ia >= 0 && (va > vb || (va == vb && ia < ib)));
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint g = linear_group();
  const uint begin = g * p.chunk;
  const uint end = min(p.n, begin + p.chunk);
  const uint out0 = g * (2u * p.k + 3u);

  // Max and non-finite flag.
  float m = LOWEST;
  uint bad = 0u;
  for (uint i = begin + tid; i < end; i += THREADS) {
    const float v = logits[p.offset + i];
    if (isnan(v) || isinf(v)) bad = 1u;
    else m = max(m, v);
  }
  sv[tid] = m;
  sflag[tid] = bad;
  barrier();
  for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) {
      sv[tid] = max(sv[tid], sv[tid + s]);
      sflag[tid] |= sflag[tid + s];
    }
    barrier();
  }
  const float gmax = sv[0];
  const uint gbad = sflag[0];
  barrier();

  // Sum of exp(l - max).
  float sum = 0.0;
  for (uint i = begin + tid; i < end; i += THREADS) sum += exp(logits[p.offset + i] - gmax);
  sv[tid] = sum;
  barrier();
  for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) sv[tid] += sv[tid + s];
    barrier();
  }
  if (tid == 0u) {
    partial[out0 + 2u * p.k] = floatBitsToUint(gmax);
    partial[out0 + 2u * p.k + 1u] = floatBitsToUint(sv[0]);
    partial[out0 + 2u * p.k + 2u] = gbad;
  }
  barrier();

  // The k largest by repeated scans: each pick is the best strictly after the previous one.
  float prev_v = 3.402823466e38;
  int prev_i = -1;
  for (uint j = 0u; j < p.k; ++j) {
    float bv = 0.0;
    int bi = -1;
    for (uint i = begin + tid; i < end; i += THREADS) {
      const float v = logits[p.offset + i];
      const bool after = v < prev_v || (v == prev_v && int(i) > prev_i);
      if (after && before(v, int(i), bv, bi)) {
        bv = v;
        bi = int(i);
      }
    }
    sv[tid] = bv;
    si[tid] = bi;
    barrier();
    for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
      if (tid < s && before(sv[tid + s], si[tid + s], sv[tid], si[tid])) {
        sv[tid] = sv[tid + s];
        si[tid] = si[tid + s];
      }
      barrier();
    }
    prev_v = sv[0];
    prev_i = si[0];
    if (tid == 0u) {
      partial[out0 + j] = uint(prev_i);
      partial[out0 + p.k + j] = floatBitsToUint(prev_v);
    }
    barrier();
    if (prev_i < 0) prev_v = LOWEST;  // nothing left: later picks stay empty
  }
}
