// y[s, r] = sum_c W_e[r, c] x'[s / x_div, c] for every routed slot s with e = ids[s] read from
// device memory: the routed experts' down product, whose input x' is the experts' GeGLU
// (gelu_tanh(x[c]) * x[c + geglu_half]) of the gate/up product's output, computed per load. The
// same stacked bank and push constants as moe_matvec.comp (its gate/up product), another body:
// matvec_teams.glsl (MV_ROWS rows per workgroup in teams of MV_LANES threads, x read from device
// memory, per word s * sum(x q) + b * sum(x)); docs/gpu.md's eighth round says why.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

// Threads per workgroup: 256, or fewer on a CPU device (docs/gpu.md).
layout(constant_id = 0) const uint THREADS = 256u;
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed[]; };
layout(std430, set = 0, binding = 1) readonly buffer ScalesBiases { uint scales[]; };
// coherent: written by the steps before, which a chained dispatch waits for (chain.glsl).
layout(std430, set = 0, binding = 2) coherent readonly buffer X { vec4 x4[]; };  // 16-byte aligned
layout(std430, set = 0, binding = 3) coherent buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) coherent readonly buffer Ids { int ids[]; };
#include "chain.glsl"
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
  uint x_div;          // slot s reads row s / x_div of x
  uint y_offset;
  uint y_stride;
  uint experts;        // ids outside [0, experts) contribute nothing
  uint geglu_half;     // 0 (x as is), or x' is the GeGLU of x's element i and i + geglu_half
  CHAIN_PARAMS
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
#define MV_X4(I, AL) \
  (p.geglu_half != 0u ? geglu4(x_quad((I), AL), x_quad((I) + p.geglu_half, AL)) : x_quad((I), AL))
#define MV_SCALE(I) LOAD_SCALE(scales, (I), p.scale_type)
#define MV_BIAS(I) LOAD_SCALE(scales, p.bias0 + (I), p.scale_type)
#include "matvec_teams.glsl"

void main() {
  chain_wait(p.chain_wait, p.chain_target);
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
  float v[MV_MAX_RPT];
  // An id outside the bank reads nothing and writes zeros.
  mv_rows(e * p.packed_stride + r0 * row_words, e * p.scale_stride + r0 * groups, xb, aligned,
          p.cols, p.bits, p.group_size, lane, valid ? rows_here : 0u, v);
  mv_reduce(v, thread, lane);
  if (lane == 0u) {
    [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i)
      if (i < rows_here) y[p.y_offset + s * p.y_stride + r0 + i] = v[i];
  }
  chain_signal(p.chain_signal);
}
