// Attention's output product and what follows it in one dispatch (a Gemma 4 MoE layer): y = W x
// (qmatvec.comp), then the workgroup that finishes a token's product last computes
// acc = (acc + rms_norm(y, post_weight)) * acc_scale (the post-norm and the residual add), then
// y1 and y2 = the two norms of acc's new row (weight1, weight2: the feed-forward's pre-norms),
// with rms_norm.comp's arithmetic in its order (accumulate, then then_pair). As separate
// dispatches these were one more dependent step per layer. The host uses it where a row fits in
// the workgroup's registers (NORM_HELD columns per thread).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#define QMATVEC_Y_COHERENT
#define QMATVEC_EXTRA_PARAMS \
  float weight_offset;       \
  float eps;                 \
  float acc_scale;           \
  uint acc_offset;           \
  uint acc_stride;           \
  uint y1_offset;            \
  uint y1_stride;            \
  uint y2_offset;            \
  uint y2_stride;
#include "qmatvec.glsl"

// Binding 5 (qmatvec's folded-norm weight, unused here: no norm is folded) is the post-norm's.
layout(std430, set = 0, binding = 6) buffer Acc { float acc[]; };
layout(std430, set = 0, binding = 7) readonly buffer Weight1 { float weight1[]; };
layout(std430, set = 0, binding = 8) writeonly buffer Y1 { float y1[]; };
layout(std430, set = 0, binding = 9) readonly buffer Weight2 { float weight2[]; };
layout(std430, set = 0, binding = 10) writeonly buffer Y2 { float y2[]; };
// One arrival counter per token, 0 between dispatches: the last arrival resets it.
layout(std430, set = 0, binding = 11) coherent buffer Counters { uint counters[]; };
#include "arrival.glsl"

const uint NORM_HELD = 16u;  // rms_norm.comp's
void main() {
  // The product over one workgroup per block, or the looping grid (qmatvec.comp's choice): the
  // arrival below counts the workgroups either way.
  if (p.loop_groups == 0u)
    qmatvec_product();
  else
    qmatvec_blocks(p.loop_groups);
  const uint t = gl_WorkGroupID.z;
  if (!last_to_arrive(t)) return;  // uniform over the workgroup

  const uint tid = gl_LocalInvocationID.x;
  const uint cols = p.rows;  // y's row: every row of the product
  const uint last = cols - 1u;
  const uint yb = p.y_offset + t * p.y_stride;
  const uint ab = p.acc_offset + t * p.acc_stride;
  // Every load of the epilogue issued at once: the product's row, the residual and the three
  // norm weights (they come from memory: a round trip each when loaded as needed; the o_norms
  // op 18.2-18.6 -> 17.5 us on the H200, docs/gpu.md "Twenty-seventh round").
  float held[NORM_HELD];
  float w[NORM_HELD];
  float a[NORM_HELD];
  float w1[NORM_HELD];
  float w2[NORM_HELD];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = min(tid + i * THREADS, last);
    held[i] = y[yb + c];
    w[i] = norm_weight[c];
    a[i] = acc[ab + c];
    w1[i] = weight1[c];
    w2[i] = weight2[c];
  }
  float ss = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    held[i] = tid + i * THREADS < cols ? held[i] : 0.0;
    ss += held[i] * held[i];
  }
  const float inv = inv_rms(mv_workgroup_sum(ss), cols, p.eps);
  float ss2 = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    // (acc + v) * acc_scale, v = y * inv * (offset + w): rms_norm.comp's norm_out.
    const float v = held[i] * inv * (p.weight_offset + w[i]);
    held[i] = c < cols ? (a[i] + v) * p.acc_scale : 0.0;
    if (c < cols) acc[ab + c] = held[i];
  }
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) ss2 += held[i] * held[i];
  const float inv2 = inv_rms(mv_workgroup_sum(ss2), cols, p.eps);
  const uint y1b = p.y1_offset + t * p.y1_stride;
  const uint y2b = p.y2_offset + t * p.y2_stride;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    if (c < cols) {
      y2[y2b + c] = held[i] * inv2 * (p.weight_offset + w2[i]);
      y1[y1b + c] = held[i] * inv2 * (p.weight_offset + w1[i]);
    }
  }
}
