// Attention, second pass: out[t, h] = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s over the
// splits of attention_partial.comp (M = max_s m_s): the exact softmax over all visible keys.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Partials { float partials[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Out { float out_values[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint n_heads;
  uint head_dim;
  uint splits;
  uint out_offset;
  uint out_stride;
} p;

void main() {
  const uint id = linear_group();  // t * n_heads + h
  if (id >= p.rows * p.n_heads) return;
  const uint d = p.head_dim;
  const uint t = id / p.n_heads;
  const uint h = id % p.n_heads;
  const uint base = id * p.splits * (d + 2u);
  float m = -3.402823466e38;
  for (uint s = 0u; s < p.splits; ++s) {
    if (partials[base + s * (d + 2u) + 1u] > 0.0) m = max(m, partials[base + s * (d + 2u)]);
  }
  float denominator = 0.0;
  for (uint s = 0u; s < p.splits; ++s) {
    const uint b = base + s * (d + 2u);
    if (partials[b + 1u] > 0.0) denominator += exp(partials[b] - m) * partials[b + 1u];
  }
  const float inv = 1.0 / denominator;
  for (uint j = gl_LocalInvocationID.x; j < d; j += 64u) {
    float o = 0.0;
    for (uint s = 0u; s < p.splits; ++s) {
      const uint b = base + s * (d + 2u);
      if (partials[b + 1u] > 0.0) o += exp(partials[b] - m) * partials[b + 2u + j];
    }
    out_values[p.out_offset + t * p.out_stride + h * d + j] = o * inv;
  }
}
