// Per row: y = x * (mean(x^2) + eps)^-1/2 * (weight_offset + weight), or without the weight
// factor when has_weight is 0. One workgroup per row; x and y may be the same view.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, set = 0, binding = 2) buffer Y { float y[]; };
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
  for (uint c = tid; c < p.cols; c += 64u) {
    const float scale = p.has_weight != 0u ? p.weight_offset + weight[c] : 1.0;
    y[yb + c] = x[xb + c] * inv * scale;
  }
}
