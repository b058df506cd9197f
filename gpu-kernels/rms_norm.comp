// Per row: y = x * (mean(x^2) + eps)^-1/2 * (weight_offset + weight), or without the weight
// factor when has_weight is 0. Fused variants, one dispatch instead of two or three:
// - has_weight 2: y = (x * (mean(x^2) + eps)^-1/2 * weight) * col_scale (a weightless norm then
//   mul_cols: Gemma 4's router input);
// - accumulate: y = (y + the norm) * acc_scale (a post-norm, the residual add after it and
//   Gemma 4's layer scalar);
// - pair: also y2 = x * (mean(x^2) + eps)^-1/2 * (weight_offset + weight2) (two norms of one row,
//   its mean square computed once);
// - then_pair (with accumulate, a row held in registers): then y3 and y4 = the pair's two norms
//   (weight3, weight4) of y's new row, as a second dispatch with pair would compute them (Gemma
//   4's post-attention norm and residual add, then its feed-forward's two pre-norms).
// One workgroup per row; x and y may be the same view unless accumulating.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, set = 0, binding = 2) buffer Y { float y[]; };
layout(std430, set = 0, binding = 3) readonly buffer Weight2 { float weight2[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Y2 { float y2[]; };
layout(std430, set = 0, binding = 5) readonly buffer Weight3 { float weight3[]; };
layout(std430, set = 0, binding = 6) writeonly buffer Y3 { float y3[]; };
layout(std430, set = 0, binding = 7) readonly buffer Weight4 { float weight4[]; };
layout(std430, set = 0, binding = 8) writeonly buffer Y4 { float y4[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint x_offset;
  uint x_stride;
  uint y_offset;
  uint y_stride;
  uint has_weight;
  float weight_offset;
  float eps;
  uint accumulate;
  float acc_scale;
  uint pair;
  uint y2_offset;
  uint y2_stride;
  float col_scale;
  uint then_pair;
  uint y3_offset;
  uint y3_stride;
  uint y4_offset;
  uint y4_stride;
} p;

// THREADS threads per row (256 on a GPU, fewer on a CPU device: docs/gpu.md); each holds up
// to NORM_HELD of its columns in registers between the two passes (on a GPU all of a row of up
// to 4,096 columns, so x is read once), and issues those loads
// back to back: a row is a few memory latencies, not one per 64 columns as with a loop of
// dependent loads. Wider rows read the rest again in the second pass.
layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
const uint NORM_THREADS = THREADS;
const uint NORM_HELD = 16u;
shared float partial[256];  // NORM_THREADS at most (a shared array's size must be a literal)

// y's new value from x's value xc, the norm's factor, the weight's value wc and y's old value
// yc (used when accumulating).
float norm_out(float xc, float inv, float wc, float yc) {
  const float scale = p.has_weight == 1u ? p.weight_offset + wc : 1.0;
  const float v = p.has_weight == 2u ? (xc * inv * wc) * p.col_scale : xc * inv * scale;
  // (y + v) * acc_scale, as the add and scale ops after a separate norm compute it (a scale of
  // 1 is exact).
  return p.accumulate != 0u ? (yc + v) * p.acc_scale : v;
}

void main() {
  const uint r = linear_group();
  if (r >= p.rows) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint xb = p.x_offset + r * p.x_stride;
  const uint last = p.cols - 1u;
  float held[NORM_HELD];
  float ss = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * NORM_THREADS;
    const float v = x[xb + min(c, last)];  // clamped, not guarded: the loads issue together
    held[i] = c < p.cols ? v : 0.0;
  }
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) ss += held[i] * held[i];
  for (uint c = tid + NORM_HELD * NORM_THREADS; c < p.cols; c += NORM_THREADS)
    ss += x[xb + c] * x[xb + c];
  partial[tid] = ss;
  barrier();
  for (uint s = NORM_THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  const float inv = inv_rms(partial[0], p.cols, p.eps);
  const uint yb = p.y_offset + r * p.y_stride;
  const uint y2b = p.y2_offset + r * p.y2_stride;
  // The held columns: every load first (weights, y), then the stores, so that the loads are
  // not serialized behind stores the compiler must assume may alias them.
  float w1[NORM_HELD];
  float w2[NORM_HELD];
  float yo[NORM_HELD];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = min(tid + i * NORM_THREADS, last);
    w1[i] = p.has_weight != 0u ? weight[c] : 0.0;
    w2[i] = p.pair != 0u ? weight2[c] : 0.0;
    yo[i] = p.accumulate != 0u ? y[yb + c] : 0.0;
  }
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * NORM_THREADS;
    if (c < p.cols) {
      const float xc = held[i];
      if (p.pair != 0u) y2[y2b + c] = xc * inv * (p.weight_offset + w2[i]);
      held[i] = norm_out(xc, inv, w1[i], yo[i]);  // then_pair's input
      y[yb + c] = held[i];
    }
  }
  if (p.then_pair != 0u) {  // uniform; the host asks for it only where the row is held
    // The pair's pass over y's new row, in the first pass's order of sums.
    float ss2 = 0.0;
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) ss2 += held[i] * held[i];
    barrier();  // every thread has read partial[0]
    partial[tid] = ss2;
    barrier();
    for (uint s = NORM_THREADS / 2u; s > 0u; s >>= 1u) {
      if (tid < s) partial[tid] += partial[tid + s];
      barrier();
    }
    const float inv2 = inv_rms(partial[0], p.cols, p.eps);
    const uint y3b = p.y3_offset + r * p.y3_stride;
    const uint y4b = p.y4_offset + r * p.y4_stride;
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
      const uint c = min(tid + i * NORM_THREADS, last);
      w1[i] = weight3[c];
      w2[i] = weight4[c];
    }
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
      const uint c = tid + i * NORM_THREADS;
      if (c < p.cols) {
        y4[y4b + c] = held[i] * inv2 * (p.weight_offset + w2[i]);
        y3[y3b + c] = held[i] * inv2 * (p.weight_offset + w1[i]);
      }
    }
  }
  for (uint c = tid + NORM_HELD * NORM_THREADS; c < p.cols; c += NORM_THREADS) {
    const float xc = x[xb + c];  // read before y is written: y may be x
    if (p.pair != 0u) y2[y2b + c] = xc * inv * (p.weight_offset + weight2[c]);
    y[yb + c] = norm_out(xc, inv, p.has_weight != 0u ? weight[c] : 0.0,
                         p.accumulate != 0u ? y[yb + c] : 0.0);
  }
}
