// dst[rows[i]] += weights[i] * src[i] in order of i: one thread per column walks every i, so
// rows picked twice accumulate in the same order as on the CPU.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(std430, set = 0, binding = 1) readonly buffer Rows { int rows[]; };
layout(std430, set = 0, binding = 2) readonly buffer Weights { float weights[]; };
layout(std430, set = 0, binding = 3) buffer Dst { float dst[]; };
layout(push_constant) uniform Params {
  uint count;
  uint cols;
  uint src_offset;
  uint src_stride;
  uint dst_offset;
  uint dst_stride;
} p;

void main() {
  const uint c = linear_group() * 64u + gl_LocalInvocationID.x;
  if (c >= p.cols) return;
  for (uint i = 0u; i < p.count; ++i) {
    const uint d = p.dst_offset + uint(rows[i]) * p.dst_stride + c;
    dst[d] += weights[i] * src[p.src_offset + i * p.src_stride + c];
  }
}
