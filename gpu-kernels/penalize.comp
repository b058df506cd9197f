// The sampler's repetition penalty on one row of logits: for each listed (distinct) id,
// l = l < 0 ? l * penalty : l / penalty, as runtime/sampler.cpp. One thread per id.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) buffer Logits { float logits[]; };
layout(std430, set = 0, binding = 1) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Params {
  uint count;
  uint offset;  // the row's first element
  float penalty;
} p;

void main() {
  const uint i = linear_group() * 64u + gl_LocalInvocationID.x;
  if (i >= p.count) return;
  const uint at = p.offset + uint(ids[i]);
  const float l = logits[at];
  logits[at] = l < 0.0 ? l * p.penalty : l / p.penalty;
}
