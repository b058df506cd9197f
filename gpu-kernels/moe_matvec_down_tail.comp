// The routed experts' down product and the end of the feed-forward in one dispatch (a Gemma 4 MoE
// layer's decode): y = the down products of every routed slot (moe_matvec_down.comp), then the
// workgroup that finishes a token's slots last (an arrival counter per token counts the
// workgroups of its top_k slices) ends that token's feed-forward with ffn_tail.comp's arithmetic
// in its order (ffn_tail.glsl: the experts' sum from y, the post-norms, the residual add, the
// layer scalar, the next layer's input norm). As two dispatches the tail was one more dependent
// step per layer.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#define FFN_TAIL_PARAMS_ONLY
#include "ffn_tail.glsl"
#undef FFN_TAIL_PARAMS_ONLY
#define MOE_DOWN_Y_COHERENT
#define MOE_DOWN_EXTRA_PARAMS FfnTailParams tail;
#include "moe_matvec_down.glsl"

// Bindings 0-4 are the down product's (its ids are the routes' ids); the tail's own follow.
layout(std430, set = 0, binding = 5) readonly buffer M { float m[]; };
layout(std430, set = 0, binding = 6) buffer Residual { float x[]; };
layout(std430, set = 0, binding = 7) readonly buffer W1 { float w1[]; };
layout(std430, set = 0, binding = 8) readonly buffer W2 { float w2[]; };
layout(std430, set = 0, binding = 9) readonly buffer W3 { float w3[]; };
layout(std430, set = 0, binding = 10) readonly buffer RoutesWeights { float weights[]; };
layout(std430, set = 0, binding = 11) readonly buffer W4 { float w4[]; };
layout(std430, set = 0, binding = 12) writeonly buffer H { float h[]; };
// One arrival counter per token, 0 between dispatches: the last arrival resets it.
layout(std430, set = 0, binding = 13) coherent buffer Counters { uint counters[]; };
#include "arrival.glsl"
#define FT_E(I) y[(I)]
#include "ffn_tail.glsl"

void main() {
  moe_down_product();
  const uint token = gl_WorkGroupID.z / p.tail.top_k;
  const uint groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y * p.tail.top_k;
  if (!last_of_arrivals(token, groups)) return;  // uniform over the workgroup
  ffn_tail_row(p.tail, token);
}
