// y[t, row0 + r] = sum_c W[r, c] x[t, c] for an MLX affine-quantized W (4 or 8 bits, any group
// size, bf16/f16/f32 scales and biases): the decode product, used for up to 4 rows of x (one
// z-slice each). Each workgroup computes 8 rows with 32 threads per row, each thread reading 4
// weight words at once; every weight word is read once per token (matvec.glsl says why).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uvec4 packed4[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Biases { uint biases[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 4) buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint rows;        // rows in this chunk (the bindings start at its first row)
  uint cols;
  uint bits;
  uint group_size;
  uint scale_type;
  uint scale0;      // index of the chunk's first scale inside the scale/bias bindings
  uint x_offset;
  uint x_stride;
  uint y_offset;    // element of y for token 0, row 0 of the chunk
  uint y_stride;
} p;

#define MV_X(I) x[(I)]
#define MV_SCALE(I) LOAD_SCALE(scales, (I), p.scale_type)
#define MV_BIAS(I) LOAD_SCALE(biases, (I), p.scale_type)
#include "matvec.glsl"

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r = linear_group() * MV_ROWS + tid / MV_LANES;
  const uint lane = tid % MV_LANES;
  const uint t = gl_WorkGroupID.z;
  const bool row_ok = r < p.rows;
  // A row holds cols * bits / 128 uvec4s (cols is a multiple of the group size, at least 32).
  const uint row_quads = p.cols * p.bits / 128u;
  const uint groups = p.cols / p.group_size;
  const float acc = mv_row(row_ok, r * row_quads, p.scale0 + r * groups,
                           p.x_offset + t * p.x_stride, p.cols, p.bits, p.group_size, lane);
  const float sum = mv_reduce(acc, lane);
  if (lane == 0u && row_ok) y[p.y_offset + t * p.y_stride + r] = sum;
}
