// Half-split (NeoX) rotary embedding in place: for row t, head h and pair j < head_dim / 2,
// (v[j], v[j + half]) <- (v[j] c - v[j + half] s, v[j + half] c + v[j] s), with c and s read
// from a [rows, 2 * half] table the host computes exactly as the CPU backend does (cos, sin of
// position * inv_freq in float32), so both backends rotate by the same bits.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Table { float cos_sin[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint n_heads;
  uint half_dim;
  uint x_offset;
  uint x_stride;
} p;

void main() {
  const uint idx = linear_group() * 64u + gl_LocalInvocationID.x;
  if (idx >= p.rows * p.n_heads * p.half_dim) return;
  const uint j = idx % p.half_dim;
  const uint h = (idx / p.half_dim) % p.n_heads;
  const uint t = idx / (p.half_dim * p.n_heads);
  const uint base = p.x_offset + t * p.x_stride + h * 2u * p.half_dim;
  const uint angle = t * 2u * p.half_dim + j;  // cos at [angle], sin at [angle + half_dim]
  const vec2 r = rotate_pair(x[base + j], x[base + j + p.half_dim], cos_sin[angle],
                             cos_sin[angle + p.half_dim]);
  x[base + j] = r.x;
  x[base + j + p.half_dim] = r.y;
}
