// Y[t, row0 + r] = sum_c W[r, c] X[t, c] for many tokens (prefill): a tile of 64 weight rows by
// 8 tokens per workgroup. Each thread owns one weight row, dequantizes s * q + b (as the CPU's
// qmatmul and MLX's qmm) and multiplies it with the 8 tokens' inputs, which the workgroup stages
// through shared memory 64 columns at a time; each weight word is read once per 8 tokens.
// The portable path: no cooperative matrices.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed_words[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Biases { uint biases[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 4) buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint bits;
  uint group_size;
  uint scale_type;
  uint scale0;
  uint x_offset;
  uint x_stride;
  uint y_offset;
  uint y_stride;
  uint tokens;
} p;

const uint TILE_ROWS = 64u;
const uint TILE_TOKENS = 8u;
const uint SLAB = 64u;  // columns staged per step (a multiple of 32, so of every per_word)
shared float xs[TILE_TOKENS][SLAB];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r = gl_WorkGroupID.x * TILE_ROWS + tid;
  const uint t0 = gl_WorkGroupID.y * TILE_TOKENS;
  const uint per_word = 32u / p.bits;
  const uint mask = (1u << p.bits) - 1u;
  const uint words = p.cols / per_word;
  const uint groups = p.cols / p.group_size;
  float acc[TILE_TOKENS];
  for (uint j = 0u; j < TILE_TOKENS; ++j) acc[j] = 0.0;

  for (uint c0 = 0u; c0 < p.cols; c0 += SLAB) {
    const uint width = min(SLAB, p.cols - c0);
    barrier();
    for (uint i = tid; i < TILE_TOKENS * SLAB; i += 64u) {
      const uint j = i / SLAB;
      const uint c = i % SLAB;
      const uint t = t0 + j;
      xs[j][c] = (t < p.tokens && c < width) ? x[p.x_offset + t * p.x_stride + c0 + c] : 0.0;
    }
    barrier();
    if (r < p.rows) {
      for (uint cw = 0u; cw < width; cw += per_word) {
        const uint word = packed_words[r * words + (c0 + cw) / per_word];
        const uint si = p.scale0 + r * groups + (c0 + cw) / p.group_size;
        const float s = LOAD_SCALE(scales, si, p.scale_type);
        const float b = LOAD_SCALE(biases, si, p.scale_type);
        for (uint k = 0u; k < per_word; ++k) {
          const float w = s * float((word >> (k * p.bits)) & mask) + b;
          for (uint j = 0u; j < TILE_TOKENS; ++j) acc[j] += w * xs[j][cw + k];
        }
      }
    }
  }
  if (r < p.rows) {
    for (uint j = 0u; j < TILE_TOKENS; ++j) {
      const uint t = t0 + j;
      if (t < p.tokens) y[p.y_offset + t * p.y_stride + r] = acc[j];
    }
  }
}
