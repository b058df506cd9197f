// y[s, r] = sum_c W_e[r, c] x[s / x_div, c] for every routed slot s (token t's j-th expert is
// slot t * top_k + j) with e = ids[s] read from device memory: the decode product of the routed
// experts, all of a layer's experts stacked in one buffer (expert e's packed rows start at word
// e * packed_stride, its scales at e * scale_stride, its biases bias0 after its scales). The
// same body as qmatvec.comp (matvec.glsl: MV_ROWS rows per workgroup in teams of MV_LANES threads,
// x read from device memory, per word s * sum(x q) + b * sum(x)).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

// Threads per workgroup: 256, or fewer on a CPU device (matvec.glsl; docs/gpu.md).
layout(constant_id = 0) const uint THREADS = 256u;
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed[]; };
layout(std430, set = 0, binding = 1) readonly buffer ScalesBiases { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { vec4 x4[]; };  // (16-byte aligned binding)
layout(std430, set = 0, binding = 3) buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Params {
  uint rows;           // rows of one expert's matrix
  uint cols;
  uint bits;
  uint group_size;
  uint scale_type;
  uint packed_stride;  // words from one expert's packed rows to the next (a multiple of 4)
  uint scale_stride;   // scales from one expert's scales to the next
  uint bias0;          // scales from a scale to its bias
  uint x_offset;
  uint x_stride;
  uint x_div;          // slot s reads row s / x_div of x (top_k: every expert of a token)
  uint y_offset;
  uint y_stride;
  uint experts;        // ids outside [0, experts) contribute nothing
  uint geglu_half;     // 0, or x is the GeGLU of x's element i and i + geglu_half (see MV_X)
} p;

// Element i of x, and elements i..i+3 (one 16-byte load where i is a multiple of 4).
float x_at(uint i) { return x4[i >> 2u][i & 3u]; }
vec4 x_quad(uint i, bool aligned) {
  return aligned ? x4[i >> 2u] : vec4(x_at(i), x_at(i + 1u), x_at(i + 2u), x_at(i + 3u));
}
vec4 geglu4(vec4 a, vec4 b) {
  return vec4(gelu_tanh_mul(a.x, b.x), gelu_tanh_mul(a.y, b.y), gelu_tanh_mul(a.z, b.z),
              gelu_tanh_mul(a.w, b.w));
}
// With geglu_half, x's element i is gelu_tanh(x[i]) * x[i + geglu_half] (the experts' GeGLU
// fused into the down product's input: one dispatch less, and no hidden buffer).
#define MV_X4(I, AL) \
  (p.geglu_half != 0u ? geglu4(x_quad((I), AL), x_quad((I) + p.geglu_half, AL)) : x_quad((I), AL))
#define MV_SCALE(I) LOAD_SCALE(scales, (I), p.scale_type)
#define MV_BIAS(I) LOAD_SCALE(scales, p.bias0 + (I), p.scale_type)
#define MV_X_FACTOR(C) 1.0
#include "matvec.glsl"

void main() {
  const uint thread = mv_thread();
  const uint lane = thread % MV_LANES;
  const uint r0 = linear_group() * MV_ROWS + (thread / MV_LANES) * MV_RPT;  // the team's first row
  const uint s = gl_WorkGroupID.z;
  const int id = ids[s];
  const bool valid = id >= 0 && uint(id) < p.experts;
  const uint e = valid ? uint(id) : 0u;
  const uint rows_here = r0 < p.rows ? min(MV_RPT, p.rows - r0) : 0u;
  const uint row_words = p.cols * p.bits / 32u;
  const uint groups = p.cols / p.group_size;
  const uint xb = p.x_offset + (s / p.x_div) * p.x_stride;
  const bool aligned = (xb & 3u) == 0u && (p.geglu_half & 3u) == 0u;
  float acc[MV_MAX_RPT];
  float ss;
  // An id outside the bank reads nothing and writes zeros.
  mv_rows(e * p.packed_stride + r0 * row_words, e * p.scale_stride + r0 * groups, xb, aligned,
          p.cols, p.bits, p.group_size, lane, valid ? rows_here : 0u, acc, ss);
  float v[MV_MAX_RPT + 1u];
  [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i) v[i] = acc[i];
  mv_reduce(v, MV_RPT, thread, lane);
  if (lane == 0u) {
    [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i)
      if (i < rows_here) y[p.y_offset + s * p.y_stride + r0 + i] = v[i];
  }
}
