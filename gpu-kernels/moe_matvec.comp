// y[s, r] = sum_c W_e[r, c] x[s / x_div, c] for every routed slot s (token t's j-th expert is
// slot t * top_k + j) with e = ids[s] read from device memory: the decode product of the routed
// experts, all of a layer's experts stacked in one buffer (expert e's packed rows start at word
// e * packed_stride, its scales at e * scale_stride, its biases bias0 after its scales). The
// same body as qmatvec.comp (matvec.glsl: 8 rows per workgroup, THREADS / 8 threads per row, per group
// s * sum(x q) + b * sum(x)).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

// Threads per workgroup: 256, or fewer on a CPU device (matvec.glsl; docs/gpu.md).
layout(constant_id = 0) const uint THREADS = 256u;
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uvec4 packed4[]; };
layout(std430, set = 0, binding = 1) readonly buffer ScalesBiases { uint scales[]; };
// coherent: written by the steps before, which a chained dispatch waits for (chain.glsl).
layout(std430, set = 0, binding = 2) coherent readonly buffer X { float x[]; };
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
  uint x_div;          // slot s reads row s / x_div of x (top_k: every expert of a token)
  uint y_offset;
  uint y_stride;
  uint experts;        // ids outside [0, experts) contribute nothing
  uint geglu_half;     // 0, or x is the GeGLU of x's element i and i + geglu_half (see MV_X)
  uint loop_groups;    // 0: a workgroup per block of rows; else that many per slot, each staging
                       // x once and looping over blocks (rows of at most MV_CHUNK columns)
  CHAIN_PARAMS
} p;

// With geglu_half, x's element i is gelu_tanh(x[i]) * x[i + geglu_half] (the experts' GeGLU
// fused into the down product's input: one dispatch less, and no hidden buffer).
#define MV_X(I) (p.geglu_half != 0u ? gelu_tanh_mul(x[(I)], x[(I) + p.geglu_half]) : x[(I)])
#define MV_SCALE(I) LOAD_SCALE(scales, (I), p.scale_type)
#define MV_BIAS(I) LOAD_SCALE(scales, p.bias0 + (I), p.scale_type)
#define MV_X_FACTOR(C) 1.0
#include "matvec.glsl"

void products();
void main() {
  chain_wait(p.chain_wait, p.chain_target);  // the ids come from the step before
  products();
  chain_signal(p.chain_signal);
}

void products() {
  const uint tid = mv_thread();  // a row's lanes are consecutive here
  const uint lane = tid % MV_LANES;
  const uint s = gl_WorkGroupID.z;
  const int id = ids[s];
  const bool valid = id >= 0 && uint(id) < p.experts;
  const uint e = valid ? uint(id) : 0u;
  const uint row_quads = p.cols * p.bits / 128u;
  const uint groups = p.cols / p.group_size;
  const uint xb = p.x_offset + (s / p.x_div) * p.x_stride;
  if (p.loop_groups == 0u) {
    const uint r = linear_group() * MV_ROWS + tid / MV_LANES;
    const float acc = mv_row(r < p.rows && valid, e * (p.packed_stride / 4u) + r * row_quads,
                             e * p.scale_stride + r * groups, xb, p.cols, p.bits, p.group_size,
                             lane);
    const float sum = mv_reduce(acc, lane);
    if (lane == 0u && r < p.rows) y[p.y_offset + s * p.y_stride + r] = sum;
    return;
  }
  // As qmatvec_blocks (qmatvec.glsl): x staged once for several blocks, MV_LOOP_ROWS of them at
  // once while they are whole (and the slot's expert valid); the same sums.
  mv_stage(xb, 0u, p.cols);
  const uint blocks = (p.rows + MV_ROWS - 1u) / MV_ROWS;
  const uint whole_blocks = p.rows / MV_ROWS;
  const uint step = p.loop_groups;
  uint b = linear_group();
  for (; MV_LOOP_ROWS > 1u && valid && b + (MV_LOOP_ROWS - 1u) * step < whole_blocks;
       b += MV_LOOP_ROWS * step) {  // uniform in the workgroup
    float sums[4];
    mv_blocks_at_once(sums, b, step, e * (p.packed_stride / 4u), e * p.scale_stride, row_quads,
                      groups, p.cols, p.bits, p.group_size, tid, lane);
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
      const uint r = (b + i * step) * MV_ROWS + tid / MV_LANES;
      if (i < MV_LOOP_ROWS && lane == 0u) y[p.y_offset + s * p.y_stride + r] = sums[i];
    }
  }
  for (; b < blocks; b += step) {  // uniform in the workgroup
    const uint r = b * MV_ROWS + tid / MV_LANES;
    const float acc = mv_chunk(0.0, r < p.rows && valid, e * (p.packed_stride / 4u) + r * row_quads,
                               e * p.scale_stride + r * groups, 0u, p.cols, p.bits, p.group_size,
                               lane);
    const float sum = mv_reduce(acc, lane);
    if (lane == 0u && r < p.rows) y[p.y_offset + s * p.y_stride + r] = sum;
  }
}
