// The q/k norm and the rotary embedding of attention in one pass, in place: for row t and head
// h, v = x[t, h] * (mean(x[t, h]^2) + eps)^-1/2 * (weight_offset + weight) (no weight factor
// when has_weight is 0), then each pair j < head_dim / 2 rotated as rope.comp does,
// (v[j], v[j + half]) <- (v[j] c - v[j + half] s, v[j + half] c + v[j] s), with c and s from the
// host's [rows, 2 * half] table. The same arithmetic as rms_norm.comp then rope.comp, one
// dispatch instead of two. One workgroup per (row, head).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, set = 0, binding = 2) readonly buffer Table { float cos_sin[]; };
layout(push_constant) uniform Params {
  uint rows;  // rows * n_heads workgroups
  uint n_heads;
  uint half_dim;
  uint x_offset;
  uint x_stride;
  uint has_weight;
  float weight_offset;
  float eps;
} p;

shared float partial[256];  // THREADS at most

float weight_factor(uint c) { return p.has_weight != 0u ? p.weight_offset + weight[c] : 1.0; }

void main() {
  const uint g = linear_group();
  if (g >= p.rows * p.n_heads) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint t = g / p.n_heads;
  const uint h = g % p.n_heads;
  const uint d = 2u * p.half_dim;
  const uint base = p.x_offset + t * p.x_stride + h * d;
  float ss = 0.0;
  for (uint c = tid; c < d; c += THREADS) ss += x[base + c] * x[base + c];
  partial[tid] = ss;
  barrier();
  for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  const float inv = inv_rms(partial[0], d, p.eps);
  for (uint j = tid; j < p.half_dim; j += THREADS) {
    const float a = x[base + j] * inv * weight_factor(j);
    const float b = x[base + j + p.half_dim] * inv * weight_factor(j + p.half_dim);
    const vec2 r = rotate_pair(a, b, cos_sin[t * d + j], cos_sin[t * d + p.half_dim + j]);
    x[base + j] = r.x;
    x[base + j + p.half_dim] = r.y;
  }
}
