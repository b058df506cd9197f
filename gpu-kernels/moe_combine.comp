// out[t, c] = sum over token t's top_k routed slots, in ascending expert id, of
// weight * y[t * top_k + j, c], starting from zero: the same order of accumulation as the CPU's
// scatter of each expert's rows (experts ascending). One thread per (t, c).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 1) readonly buffer RoutesIds { int ids[]; };
layout(std430, set = 0, binding = 2) readonly buffer RoutesWeights { float weights[]; };
layout(std430, set = 0, binding = 3) buffer Out { float out_[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint top_k;
  uint y_offset;
  uint y_stride;
  uint out_offset;
  uint out_stride;
} p;

const uint MAX_TOP_K = 32u;

void main() {
  const uint i = linear_group() * 64u + gl_LocalInvocationID.x;
  if (i >= p.rows * p.cols) return;
  const uint t = i / p.cols;
  const uint c = i % p.cols;
  // Token t's slots sorted by expert id (insertion sort: top_k is small).
  uint order[MAX_TOP_K];
  for (uint j = 0u; j < p.top_k; ++j) {
    uint k = j;
    const int id = ids[t * p.top_k + j];
    while (k > 0u && ids[t * p.top_k + order[k - 1u]] > id) {
      order[k] = order[k - 1u];
      --k;
    }
    order[k] = j;
  }
  float acc = 0.0;
  for (uint j = 0u; j < p.top_k; ++j) {
    const uint slot = t * p.top_k + order[j];
    acc += weights[slot] * y[p.y_offset + slot * p.y_stride + c];
  }
  out_[p.out_offset + t * p.out_stride + c] = acc;
}
