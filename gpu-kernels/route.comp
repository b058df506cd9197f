// Mixture-of-experts routing, one workgroup of 64 threads per token row (route.glsl says how).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, set = 0, binding = 1) readonly buffer ExpertScale { float per_expert_scale[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Ids { int ids[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Weights { float weights[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint experts;
  uint top_k;
  uint offset;
  uint stride;
} p;

const uint RT_THREADS = 64u;
uint row_base;
uint row_index;
#define RT_LOGIT(I) logits[row_base + (I)]
#define RT_SCALE(I) per_expert_scale[(I)]
#define RT_WRITE(J, ID, W)                   \
  {                                          \
    ids[row_index * p.top_k + (J)] = (ID);   \
    weights[row_index * p.top_k + (J)] = (W); \
  }
#include "route.glsl"

void main() {
  row_index = linear_group();
  if (row_index >= p.rows) return;  // uniform over the workgroup
  row_base = p.offset + row_index * p.stride;
  route_row(gl_LocalInvocationID.x, p.experts, p.top_k);
}
