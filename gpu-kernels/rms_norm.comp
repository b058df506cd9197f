// Per row: y = x * (mean(x^2) + eps)^-1/2 * (weight_offset + weight), or without the weight
// factor when has_weight is 0. Fused variants, one dispatch instead of two or three:
// - has_weight 2: y = (x * (mean(x^2) + eps)^-1/2 * weight) * col_scale (a weightless norm then
//   mul_cols: Gemma 4's router input);
// - accumulate: y = (y + the norm) * acc_scale (a post-norm, the residual add after it and
//   Gemma 4's layer scalar);
// - pair: also y2 = x * (mean(x^2) + eps)^-1/2 * (weight_offset + weight2) (two norms of one row,
//   its mean square computed once).
// One workgroup per row; x and y may be the same view unless accumulating.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, set = 0, binding = 2) buffer Y { float y[]; };
layout(std430, set = 0, binding = 3) readonly buffer Weight2 { float weight2[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Y2 { float y2[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint x_offset;
  uint x_stride;
  uint y_offset;
  uint y_stride;
  uint has_weight;
  float weight_offset;
  float eps;
  uint accumulate;
  float acc_scale;
  uint pair;
  uint y2_offset;
  uint y2_stride;
  float col_scale;
} p;

shared float partial[64];

void main() {
  const uint r = linear_group();
  if (r >= p.rows) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint xb = p.x_offset + r * p.x_stride;
  float ss = 0.0;
  for (uint c = tid; c < p.cols; c += 64u) ss += x[xb + c] * x[xb + c];
  partial[tid] = ss;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1u) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  const float inv = 1.0 / sqrt(partial[0] / float(p.cols) + p.eps);
  const uint yb = p.y_offset + r * p.y_stride;
  const uint y2b = p.y2_offset + r * p.y2_stride;
  for (uint c = tid; c < p.cols; c += 64u) {
    const float scale = p.has_weight == 1u ? p.weight_offset + weight[c] : 1.0;
    const float xc = x[xb + c];  // read once: y may be x
    if (p.pair != 0u) y2[y2b + c] = xc * inv * (p.weight_offset + weight2[c]);
    const float v = p.has_weight == 2u ? (xc * inv * weight[c]) * p.col_scale : xc * inv * scale;
    // (y + v) * acc_scale, as the add and scale ops after a separate norm compute it (a scale
    // of 1 is exact).
    y[yb + c] = p.accumulate != 0u ? (y[yb + c] + v) * p.acc_scale : v;
  }
}
