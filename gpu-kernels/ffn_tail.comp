// The end of a Gemma 4 MoE layer's feed-forward, per row, in one dispatch instead of three to
// five (backend.h's moe_ffn_tail):
//   e = sum over the row's top_k routed slots, in ascending expert id, of weight * y[slot]
//                                                (only with top_k > 0: moe_combine.comp's sum;
//                                                 with top_k = 0, e is read as it is)
//   t = rms_norm(m, w1) + rms_norm(e, w2)        (the dense MLP's and the experts' post-norms)
//   x = (x + rms_norm(t, w3)) * layer_scalar     (the feed-forward's post-norm, the residual add
//                                                 and the layer scalar)
//   h = rms_norm(x, w4)                          (only with has_next: the next layer's input
//                                                 norm)
// with each norm x * (mean(x^2) + eps)^-1/2 * (weight_offset + w), the arithmetic of rms_norm.comp
// in the order of the separate ops (moe_combine, rms_norm, add_rms_norm, add_rms_norm, rms_norm),
// so the result equals theirs up to the reductions' order. One workgroup per row; the row is held
// in registers (NORM_HELD columns per thread: up to 4,096 columns with 256 threads; the host runs
// the separate ops on wider rows). m and y are left as they were (the separate ops overwrite m).
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
#define FT_E(I) e[(I)]
#include "ffn_tail.glsl"
layout(push_constant) uniform Params { FfnTailParams tail; } p;

void main() {
  const uint r = linear_group();
  if (r >= p.tail.rows) return;  // uniform over the workgroup
  ffn_tail_row(p.tail, r);
}
