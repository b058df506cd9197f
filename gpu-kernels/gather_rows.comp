// dst[i] = src[rows[i]], one thread per element.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(std430, set = 0, binding = 1) readonly buffer Rows { int rows[]; };
layout(std430, set = 0, binding = 2) buffer Dst { float dst[]; };
layout(push_constant) uniform Params {
  uint count;
  uint cols;
  uint src_offset;
  uint src_stride;
  uint dst_offset;
  uint dst_stride;
} p;

void main() {
  const uint idx = linear_group() * 64u + gl_LocalInvocationID.x;
  if (idx >= p.count * p.cols) return;
  const uint i = idx / p.cols;
  const uint c = idx % p.cols;
  dst[p.dst_offset + i * p.dst_stride + c] = src[p.src_offset + uint(rows[i]) * p.src_stride + c];
}
