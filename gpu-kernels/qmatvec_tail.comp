// One of the next layer's q/k/v decode products that also ends the previous layer's feed-forward
// (REDWING_GPU_FFN_TAIL=next, docs/gpu.md "Twenty-eighth round"): instead of reading its input h
// (the next layer's input norm of the new residual) from memory, every workgroup computes
// ffn_tail.glsl's tail for the row and stages h itself, so that the tail is no dependent step of
// its own (ffn_tail.comp is one workgroup, a serial ~17 us a layer on an H100). The staged h has
// ffn_tail.comp's bits, so y has those of the two dispatches.
//
// The residual is read by every workgroup and rewritten, so no workgroup may write it before all
// have read it: one workgroup (p.writer, its dispatch's first) writes h and parks the new
// residual in the counters buffer after the arrival counter; the last workgroup to arrive, over
// all the products of the batch (their dispatches share counter 0 and p.arrivals), copies it into
// the residual. One token (the looping grid, at most MV_CHUNK columns).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#define QMATVEC_EXTRA_PARAMS \
  uint m_offset;             \
  uint e_offset;             \
  uint e_stride;             \
  uint res_offset;           \
  uint h_offset;             \
  float layer_scalar;        \
  uint arrivals;             \
  uint writer;
void tail_stage(uint t);
#define QMATVEC_STAGE(T) tail_stage(T)
#include "qmatvec.glsl"

// Binding 3 (qmatvec's x) is the dense MLP's output m, binding 5 (the folded norm's weight; no
// norm is folded) the next layer's input norm's weight. p.norm_offset and p.norm_eps are the
// tail's weight offset and epsilon, p.top_k its routes per row (0: binding 6 holds the sum).
layout(std430, set = 0, binding = 6) readonly buffer E { float e[]; };
layout(std430, set = 0, binding = 7) buffer Res { float res[]; };
layout(std430, set = 0, binding = 8) readonly buffer W1 { float w1[]; };
layout(std430, set = 0, binding = 9) readonly buffer W2 { float w2[]; };
layout(std430, set = 0, binding = 10) readonly buffer W3 { float w3[]; };
layout(std430, set = 0, binding = 11) readonly buffer RoutesIds { int ids[]; };
layout(std430, set = 0, binding = 12) readonly buffer RoutesWeights { float weights[]; };
layout(std430, set = 0, binding = 13) writeonly buffer H { float h[]; };
// Word 0: the batch's arrival counter (0 between dispatches); words 1 on: the new residual.
layout(std430, set = 0, binding = 14) coherent buffer Counters { uint counters[]; };
#include "arrival.glsl"

#define FT_M(I) x[(I)]
#define FT_E(I) e[(I)]
#define FT_X(I) res[(I)]
#define FT_W1(I) w1[(I)]
#define FT_W2(I) w2[(I)]
#define FT_W3(I) w3[(I)]
#define FT_W4(I) norm_weight[(I)]
#define FT_ID(I) ids[(I)]
#define FT_WEIGHT(I) weights[(I)]
#include "ffn_tail.glsl"

const uint TAIL_PARKED = 1u;  // the counters buffer's first word of the parked residual

void tail_stage(uint t) {
  const uint tid = gl_LocalInvocationID.x;
  FfnTailRow q;
  q.cols = p.cols;
  q.mb = p.m_offset;
  q.eb = p.e_offset;
  q.e_stride = p.e_stride;
  q.xb = p.res_offset;
  q.first = 0u;
  q.top_k = p.top_k;
  q.weight_offset = p.norm_offset;
  q.eps = p.norm_eps;
  q.layer_scalar = p.layer_scalar;
  float xn[NORM_HELD];
  const float sn = ffn_tail_residual(q, xn);
  float hn[NORM_HELD];
  ffn_tail_next_norm(q, xn, sn, hn);
  barrier();  // mv_stage's: earlier readers of mv_x4 are done
  const bool writes = p.writer != 0u && linear_group() == 0u;  // uniform over the workgroup
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    if (c < p.cols) {
      mv_x_set(mv_slot(c), hn[i]);
      if (writes) {
        h[p.h_offset + c] = hn[i];
        counters[TAIL_PARKED + c] = floatBitsToUint(xn[i]);
      }
    }
  }
  barrier();
}

void main() {
  qmatvec_blocks(p.loop_groups);
  if (!last_of_arrivals(0u, p.arrivals)) return;  // uniform over the workgroup
  // Every workgroup has read the old residual; the writer's parked row is visible here.
  for (uint c = gl_LocalInvocationID.x; c < p.cols; c += THREADS)
    res[p.res_offset + c] = uintBitsToFloat(counters[TAIL_PARKED + c]);
}
