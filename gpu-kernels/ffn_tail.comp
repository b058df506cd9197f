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

const uint NORM_HELD = 16u;
const uint MAX_TOP_K = 32u;
shared vec2 partial[256];  // THREADS at most
shared uint order[MAX_TOP_K];  // the row's slots by ascending expert id

// The workgroup's sums of v.x and v.y (every thread gets them).
vec2 workgroup_sum(vec2 v) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();  // the previous reduction's readers are done
  partial[tid] = v;
  barrier();
  for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  return partial[0];
}

void main() {
  const uint r = linear_group();
  if (r >= p.rows) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint last = p.cols - 1u;
  const uint mb = p.m_offset + r * p.m_stride;
  const uint eb = p.e_offset + r * p.e_stride;
  const uint xb = p.x_offset + r * p.x_stride;
  float hm[NORM_HELD];
  float he[NORM_HELD];
  vec2 ss = vec2(0.0);
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    const float a = m[mb + min(c, last)];  // clamped, not guarded: the loads issue together
    hm[i] = c < p.cols ? a : 0.0;
  }
  if (p.top_k == 0u) {
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
      const uint c = tid + i * THREADS;
      const float b = e[eb + min(c, last)];
      he[i] = c < p.cols ? b : 0.0;
    }
  } else {
    // The slots in ascending expert id, ties in slot order (moe_combine.comp's insertion sort):
    // slot j's rank is the number of slots before it in that order.
    const uint first = r * p.top_k;
    if (tid < p.top_k) {
      const int id = ids[first + tid];
      uint rank = 0u;
      for (uint j = 0u; j < p.top_k; ++j) {
        const int other = ids[first + j];
        rank += (other < id || (other == id && j < tid)) ? 1u : 0u;
      }
      order[rank] = tid;
    }
    barrier();
    // moe_combine's sum per column: from zero, acc += weight * y, slots in that order.
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) he[i] = 0.0;
    for (uint j = 0u; j < p.top_k; ++j) {
      const uint slot = first + order[j];
      const float wgt = weights[slot];
      const uint yb = p.e_offset + slot * p.e_stride;
      [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i)
        he[i] += wgt * e[yb + min(tid + i * THREADS, last)];
    }
    [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i)
      he[i] = tid + i * THREADS < p.cols ? he[i] : 0.0;
  }
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) ss += vec2(hm[i] * hm[i], he[i] * he[i]);
  const vec2 sums = workgroup_sum(ss);
  const float inv_m = inv_rms(sums.x, p.cols, p.eps);
  const float inv_e = inv_rms(sums.y, p.cols, p.eps);
  float t[NORM_HELD];
  float st = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = min(tid + i * THREADS, last);
    const float a = hm[i] * inv_m * (p.weight_offset + w1[c]);
    const float b = he[i] * inv_e * (p.weight_offset + w2[c]);
    t[i] = tid + i * THREADS < p.cols ? a + b : 0.0;
    st += t[i] * t[i];
  }
  const float inv_t = inv_rms(workgroup_sum(vec2(st, 0.0)).x, p.cols, p.eps);
  float xo[NORM_HELD];
  float w3c[NORM_HELD];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = min(tid + i * THREADS, last);
    xo[i] = x[xb + c];
    w3c[i] = w3[c];
  }
  float xn[NORM_HELD];
  float sn = 0.0;
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const float v = t[i] * inv_t * (p.weight_offset + w3c[i]);
    // (x + v) * layer_scalar, as add then scale (a scalar of 1 is exact).
    xn[i] = tid + i * THREADS < p.cols ? (xo[i] + v) * p.layer_scalar : 0.0;
    sn += xn[i] * xn[i];
  }
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    if (c < p.cols) x[xb + c] = xn[i];
  }
  if (p.has_next == 0u) return;  // uniform over the workgroup
  // The next layer's input norm of the new x (rms_norm.comp's sum: the thread's held columns in
  // order, then the same tree).
  const float inv_n = inv_rms(workgroup_sum(vec2(sn, 0.0)).x, p.cols, p.eps);
  const uint hb = p.h_offset + r * p.h_stride;
  float w4c[NORM_HELD];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) w4c[i] = w4[min(tid + i * THREADS, last)];
  [[unroll]] for (uint i = 0u; i < NORM_HELD; ++i) {
    const uint c = tid + i * THREADS;
    if (c < p.cols) h[hb + c] = xn[i] * inv_n * (p.weight_offset + w4c[i]);
  }
}
