// Y[t, row0 + r] = sum_c W[r, c] X[t, c] for many tokens (prefill): a tile of 64 weight rows by
// 32 tokens per workgroup, stepping through the columns 64 at a time. Each step the workgroup
// dequantizes the 64 x 64 weight block into shared memory (s * q + b, as the CPU's qmatmul and
// MLX's qmm; adjacent threads read adjacent words) and stages the 32 tokens' inputs; then each
// thread multiplies its weight row with the 32 tokens. Every weight word is read once per 32
// tokens. The portable path: no cooperative matrices.
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
const uint TILE_TOKENS = 32u;
const uint SLAB = 64u;  // columns per step: a multiple of 32 (every per_word, every group start)
shared float ws[TILE_ROWS][SLAB + 1u];  // +1: threads read down a column without bank conflicts
shared float xs[TILE_TOKENS][SLAB];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r0 = gl_WorkGroupID.x * TILE_ROWS;
  const uint t0 = gl_WorkGroupID.y * TILE_TOKENS;
  const uint per_word = 32u / p.bits;
  const uint mask = (1u << p.bits) - 1u;
  const uint words = p.cols / per_word;
  const uint groups = p.cols / p.group_size;
  const uint slab_words = SLAB / per_word;
  float acc[TILE_TOKENS];
  for (uint j = 0u; j < TILE_TOKENS; ++j) acc[j] = 0.0;

  for (uint c0 = 0u; c0 < p.cols; c0 += SLAB) {
    const uint width = min(SLAB, p.cols - c0);  // cols is a multiple of 32
    barrier();
    for (uint i = tid; i < TILE_ROWS * slab_words; i += 64u) {
      const uint rr = i / slab_words;
      const uint wi = i % slab_words;
      const uint r = r0 + rr;
      const uint c = wi * per_word;
      if (r < p.rows && c < width) {
        const uint word = packed_words[r * words + (c0 + c) / per_word];
        const uint si = p.scale0 + r * groups + (c0 + c) / p.group_size;
        const float s = LOAD_SCALE(scales, si, p.scale_type);
        const float b = LOAD_SCALE(biases, si, p.scale_type);
        for (uint k = 0u; k < per_word; ++k)
          ws[rr][c + k] = s * float((word >> (k * p.bits)) & mask) + b;
      } else {
        for (uint k = 0u; k < per_word; ++k) ws[rr][c + k] = 0.0;
      }
    }
    for (uint i = tid; i < TILE_TOKENS * SLAB; i += 64u) {
      const uint j = i / SLAB;
      const uint c = i % SLAB;
      const uint t = t0 + j;
      xs[j][c] = (t < p.tokens && c < width) ? x[p.x_offset + t * p.x_stride + c0 + c] : 0.0;
    }
    barrier();
    for (uint c = 0u; c < width; ++c) {
      const float w = ws[tid][c];
      for (uint j = 0u; j < TILE_TOKENS; ++j) acc[j] += w * xs[j][c];
    }
  }
  const uint r = r0 + tid;
  if (r < p.rows) {
    for (uint j = 0u; j < TILE_TOKENS; ++j) {
      const uint t = t0 + j;
      if (t < p.tokens) y[p.y_offset + t * p.y_stride + r] = acc[j];
    }
  }
}
