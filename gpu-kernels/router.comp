// A MoE layer's router in one dispatch: the router's decode product (qmatvec.comp: logits = W x,
// with the router's input norm folded in), then the workgroup that finishes a token's product
// last routes that token (route.glsl, route.comp's arithmetic) into the routes buffer. Routing
// in a dispatch of its own was one more dependent step per MoE layer.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#define QMATVEC_Y_COHERENT
#include "qmatvec.glsl"

layout(std430, set = 0, binding = 6) readonly buffer ExpertScale { float per_expert_scale[]; };
layout(std430, set = 0, binding = 7) writeonly buffer Ids { int ids[]; };
layout(std430, set = 0, binding = 8) writeonly buffer Weights { float weights[]; };
// One arrival counter per token, 0 between dispatches: the last arrival resets it.
layout(std430, set = 0, binding = 9) coherent buffer Counters { uint counters[]; };

const uint RT_THREADS = THREADS;
uint token;
#define RT_LOGIT(I) y[p.y_offset + token * p.y_stride + (I)]
#define RT_SCALE(I) per_expert_scale[(I)]
#define RT_WRITE(J, ID, W)                  \
  {                                         \
    ids[token * p.top_k + (J)] = (ID);      \
    weights[token * p.top_k + (J)] = (W);   \
  }
#include "route.glsl"
#include "arrival.glsl"

void main() {
  // The product over one workgroup per block, or the looping grid (qmatvec.comp's choice): the
  // arrival below counts the workgroups either way.
  if (p.loop_groups == 0u)
    qmatvec_product();
  else
    qmatvec_blocks(p.loop_groups);
  token = gl_WorkGroupID.z;
  // The workgroup that finishes the token's product last routes it.
  if (!last_to_arrive(token)) return;  // uniform over the workgroup
  route_row(gl_LocalInvocationID.x, p.rows, p.top_k);
}
