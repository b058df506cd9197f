// Sampling, second pass (one workgroup): the k largest of all the workgroups' candidates of
// topk_partial.comp (descending; ties: lower id), the row's max, the sum of exp(l - max) over the
// row (each workgroup's sum rescaled from its own max), and the non-finite count. Output words:
// k ids (-1 where the row has fewer), k logits, max, sum, non-finite count.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Partial { uint partial[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Result { uint result[]; };
layout(push_constant) uniform Params {
  uint groups;
  uint k;
} p;

const float LOWEST = -3.402823466e38;
shared float sv[256];  // THREADS at most
shared int si[256];  // THREADS at most
shared uint sflag[256];  // THREADS at most

bool before(float va, int ia, float vb, int ib) {
  return ib < 0 || (ia >= 0 && (va > vb || (va == vb && ia < ib)));
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint stride = 2u * p.k + 3u;
  float m = LOWEST;
  uint bad = 0u;
  for (uint g = tid; g < p.groups; g += THREADS) {
    m = max(m, uintBitsToFloat(partial[g * stride + 2u * p.k]));
    bad |= partial[g * stride + 2u * p.k + 2u] != 0u ? 1u : 0u;
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
  float sum = 0.0;
  for (uint g = tid; g < p.groups; g += THREADS) {
    const float gsum = uintBitsToFloat(partial[g * stride + 2u * p.k + 1u]);
    if (gsum > 0.0) sum += gsum * exp(uintBitsToFloat(partial[g * stride + 2u * p.k]) - gmax);
  }
  sv[tid] = sum;
  barrier();
  for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) sv[tid] += sv[tid + s];
    barrier();
  }
  if (tid == 0u) {
    result[2u * p.k] = floatBitsToUint(gmax);
    result[2u * p.k + 1u] = floatBitsToUint(sv[0]);
    result[2u * p.k + 2u] = gbad;
  }
  barrier();

  const uint candidates = p.groups * p.k;
  float prev_v = 3.402823466e38;
  int prev_i = -1;
  for (uint j = 0u; j < p.k; ++j) {
    float bv = 0.0;
    int bi = -1;
    for (uint c = tid; c < candidates; c += THREADS) {
      const uint g = c / p.k;
      const uint q = c % p.k;
      const int i = int(partial[g * stride + q]);
      if (i < 0) continue;
      const float v = uintBitsToFloat(partial[g * stride + p.k + q]);
      const bool after = v < prev_v || (v == prev_v && i > prev_i);
      if (after && before(v, i, bv, bi)) {
        bv = v;
        bi = i;
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
      result[j] = uint(prev_i);
      result[p.k + j] = floatBitsToUint(prev_v);
    }
    barrier();
    if (prev_i < 0) prev_v = LOWEST;
  }
}
