// out[i, c] = scale * W[ids[i], c] (dequantized), for the ids that fall in this chunk of W's
// rows [row0, row0 + rows); the bindings start at the chunk's first row.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed_words[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Biases { uint biases[]; };
layout(std430, set = 0, binding = 3) readonly buffer Ids { int ids[]; };
layout(std430, set = 0, binding = 4) buffer Out { float out_values[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint bits;
  uint group_size;
  uint scale_type;
  uint scale0;
  uint out_offset;
  uint out_stride;
  uint count;  // ids
  uint row0;
  float scale;
} p;

void main() {
  const uint idx = linear_group() * 64u + gl_LocalInvocationID.x;
  if (idx >= p.count * p.cols) return;
  const uint i = idx / p.cols;
  const uint c = idx % p.cols;
  const int id = ids[i];
  if (id < int(p.row0) || id >= int(p.row0 + p.rows)) return;
  const uint r = uint(id) - p.row0;
  const uint per_word = 32u / p.bits;
  const uint words = p.cols / per_word;
  const uint word = packed_words[r * words + c / per_word];
  const uint q = (word >> ((c % per_word) * p.bits)) & ((1u << p.bits) - 1u);
  const uint si = p.scale0 + r * (p.cols / p.group_size) + c / p.group_size;
  const float v = LOAD_SCALE(scales, si, p.scale_type) * float(q) + LOAD_SCALE(biases, si, p.scale_type);
  out_values[p.out_offset + i * p.out_stride + c] = v * p.scale;
}
