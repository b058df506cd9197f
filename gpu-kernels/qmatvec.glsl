// The decode product's kernel body (qmatvec.comp, and router.comp, which routes in the product's
// last workgroup): declarations and qmatvec_product(), which writes y. An including kernel may
// define QMATVEC_Y_COHERENT (its last workgroup reads what the others wrote to y) and
// QMATVEC_EXTRA_PARAMS (its own push constants after the shared block, quant_params.glsl), and
// QMATVEC_STAGE(t) (the looping grid stages token t's x with it instead of mv_stage: a function
// the kernel declares before this file and defines after it, with mv_stage's barriers).

// Threads per workgroup: 256, or fewer on a CPU device (matvec.glsl; docs/gpu.md).
layout(constant_id = 0) const uint THREADS = 256u;
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uvec4 packed4[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Biases { uint biases[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
#ifdef QMATVEC_Y_COHERENT
layout(std430, set = 0, binding = 4) coherent buffer Y { float y[]; };
#else
layout(std430, set = 0, binding = 4) buffer Y { float y[]; };
#endif
layout(std430, set = 0, binding = 5) readonly buffer NormWeight { float norm_weight[]; };
#include "quant_params.glsl"

#define MV_X(I) (p.geglu_half != 0u ? gelu_tanh_mul(x[(I)], x[(I) + p.geglu_half]) : x[(I)])
#define MV_SCALE(I) LOAD_SCALE(scales, (I), p.scale_type)
#define MV_BIAS(I) LOAD_SCALE(biases, (I), p.scale_type)
#define MV_X_FACTOR(C)                                       \
  (p.norm_mode == 1u   ? p.norm_offset + norm_weight[(C)]    \
   : p.norm_mode == 2u ? norm_weight[(C)] * p.col_scale \
                       : 1.0)
#include "matvec.glsl"

void qmatvec_product() {
  const uint tid = mv_thread();  // a row's lanes are consecutive here
  const uint r = linear_group() * MV_ROWS + tid / MV_LANES;
  const uint lane = tid % MV_LANES;
  const uint t = gl_WorkGroupID.z;
  const bool row_ok = r < p.rows;
  // A row holds cols * bits / 128 uvec4s (cols is a multiple of the group size, at least 32).
  const uint row_quads = p.cols * p.bits / 128u;
  const uint groups = p.cols / p.group_size;
  const float acc = mv_row(row_ok, r * row_quads, p.scale0 + r * groups,
                           p.x_offset + t * p.x_stride, p.cols, p.bits, p.group_size, lane);
  float sum = mv_reduce(acc, lane);
  if (p.norm_mode != 0u) sum *= mv_norm_factor(p.cols, p.norm_eps);  // uniform branch
  if (lane == 0u && row_ok) y[p.y_offset + t * p.y_stride + r] = sum;
}

// qmatvec_product() for grids of fewer workgroups than blocks of MV_ROWS rows (rows of at most
// MV_CHUNK columns): each workgroup stages its token's x once, then computes blocks
// linear_group(), + groups, + 2 groups, ... The x staging is as much traffic as a block's
// weights on a 2,816-column row, so sharing it among several blocks leaves the weights the
// bulk of what a large product reads (docs/gpu.md, "Eighteenth round"). With MV_LOOP_ROWS > 1
// it computes that many blocks at once (mv_chunk_rows: x read from shared memory once for all of
// them, their weight loads in flight together; docs/gpu.md, "Twenty-second round"). Each row's
// sum is qmatvec_product()'s, in the same order.
void qmatvec_blocks(uint groups) {
  const uint tid = mv_thread();
  const uint lane = tid % MV_LANES;
  const uint t = gl_WorkGroupID.z;
  const uint row_quads = p.cols * p.bits / 128u;
  const uint row_groups = p.cols / p.group_size;
  const uint blocks = (p.rows + MV_ROWS - 1u) / MV_ROWS;
#ifdef QMATVEC_STAGE
  QMATVEC_STAGE(t);
#else
  mv_stage(p.x_offset + t * p.x_stride, 0u, p.cols);
#endif
  float factor = 1.0;
  if (p.norm_mode != 0u) {  // uniform branch
    factor = mv_norm_factor(p.cols, p.norm_eps);
    barrier();  // every thread has read the sum before mv_reduce reuses mv_partial
  }
  uint b = linear_group();
  // MV_LOOP_ROWS blocks at once, b, b + groups, ...: all of them whole (the rest below).
  const uint whole_blocks = p.rows / MV_ROWS;
  for (; MV_LOOP_ROWS > 1u && b + (MV_LOOP_ROWS - 1u) * groups < whole_blocks;
       b += MV_LOOP_ROWS * groups) {  // uniform in the workgroup
    float sums[4];
    mv_blocks_at_once(sums, b, groups, 0u, p.scale0, row_quads, row_groups, p.cols, p.bits,
                      p.group_size, tid, lane);
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
      const uint r = (b + i * groups) * MV_ROWS + tid / MV_LANES;
      if (i < MV_LOOP_ROWS && lane == 0u)
        y[p.y_offset + t * p.y_stride + r] = p.norm_mode != 0u ? sums[i] * factor : sums[i];
    }
  }
  for (; b < blocks; b += groups) {  // uniform in the workgroup
    const uint r = b * MV_ROWS + tid / MV_LANES;
    const bool row_ok = r < p.rows;
    const float acc = mv_chunk(0.0, row_ok, r * row_quads, p.scale0 + r * row_groups, 0u, p.cols,
                               p.bits, p.group_size, lane);
    float sum = mv_reduce(acc, lane);
    if (p.norm_mode != 0u) sum *= factor;
    if (lane == 0u && row_ok) y[p.y_offset + t * p.y_stride + r] = sum;
  }
}
