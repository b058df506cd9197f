// The end of a Gemma 4 MoE layer's feed-forward, per row, in one dispatch instead of three to
// five (backend.h's moe_ffn_tail): ffn_tail.glsl's arithmetic (the experts' sum, the post-norms,
// the residual add and the layer scalar, and with has_next the next layer's input norm). One
// workgroup per row. m and y are left as they were (the separate ops overwrite m).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer M { float m[]; };
layout(std430, set = 0, binding = 1) readonly buffer E { float e[]; };
layout(std430, set = 0, binding = 2) buffer X { float x[]; };
layout(std430, set = 0, binding = 3) readonly buffer W1 { float w1[]; };
layout(std430, set = 0, binding = 4) readonly buffer W2 { float w2[]; };
layout(std430, set = 0, binding = 5) readonly buffer W3 { float w3[]; };
layout(std430, set = 0, binding = 6) readonly buffer RoutesIds { int ids[]; };
layout(std430, set = 0, binding = 7) readonly buffer RoutesWeights { float weights[]; };
layout(std430, set = 0, binding = 8) readonly buffer W4 { float w4[]; };
layout(std430, set = 0, binding = 9) writeonly buffer H { float h[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint m_offset;
  uint m_stride;
  uint e_offset;
  uint e_stride;
  uint x_offset;
  uint x_stride;
  float weight_offset;
  float eps;
  float layer_scalar;
  uint top_k;  // 0: e holds the experts' sum; else e's rows are the routed slots' products
  uint has_next;
  uint h_offset;
  uint h_stride;
} p;

#define FT_M(I) m[(I)]
#define FT_E(I) e[(I)]
#define FT_X(I) x[(I)]
#define FT_W1(I) w1[(I)]
#define FT_W2(I) w2[(I)]
#define FT_W3(I) w3[(I)]
#define FT_W4(I) w4[(I)]
#define FT_ID(I) ids[(I)]
#define FT_WEIGHT(I) weights[(I)]
#include "ffn_tail.glsl"

void main() {
  const uint r = linear_group();
  if (r >= p.rows) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  FfnTailRow q;
  q.cols = p.cols;
  q.mb = p.m_offset + r * p.m_stride;
  // With routes, the row's slots are the entries r * top_k + j of y.
  q.eb = p.e_offset + (p.top_k == 0u ? r : r * p.top_k) * p.e_stride;
  q.e_stride = p.e_stride;
  q.xb = p.x_offset + r * p.x_stride;
  q.first = r * p.top_k;
  q.top_k = p.top_k;
  q.weight_offset = p.weight_offset;
  q.eps = p.eps;
  q.layer_scalar = p.layer_scalar;
  float xn[NORM_HELD];
  const float sn = ffn_tail_residual(q, xn);
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    if (c < p.cols) x[q.xb + c] = xn[i];
  }
  if (p.has_next == 0u) return;  // uniform over the workgroup
  float hn[NORM_HELD];
  ffn_tail_next_norm(q, xn, sn, hn);
  const uint hb = p.h_offset + r * p.h_stride;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    if (c < p.cols) h[hb + c] = hn[i];
  }
}
