// y[t, row0 + r] = sum_c W[r, c] x[t, c] for an MLX affine-quantized W (4 or 8 bits, any group
// size, bf16/f16/f32 scales and biases): the decode product. Each workgroup computes 4 rows with
// 16 threads per row; adjacent threads read adjacent weight words, every word is read once per
// token. Per group it accumulates s * sum(x q) + b * sum(x), as the CPU's qmatvec and MLX's qmv.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed_words[]; };
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

const uint ROWS_PER_GROUP = 4u;
const uint THREADS_PER_ROW = 16u;
shared float partial[64];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r = linear_group() * ROWS_PER_GROUP + tid / THREADS_PER_ROW;
  const uint lane = tid % THREADS_PER_ROW;
  const uint t = gl_WorkGroupID.z;
  float acc = 0.0;
  if (r < p.rows) {
    const uint per_word = 32u / p.bits;
    const uint mask = (1u << p.bits) - 1u;
    const uint words = p.cols / per_word;
    const uint groups = p.cols / p.group_size;
    const uint xb = p.x_offset + t * p.x_stride;
    for (uint i = lane; i < words; i += THREADS_PER_ROW) {
      const uint word = packed_words[r * words + i];
      const uint c0 = i * per_word;
      const uint g = c0 / p.group_size;
      float sxq = 0.0;
      float sx = 0.0;
      for (uint k = 0u; k < per_word; ++k) {
        const float xv = x[xb + c0 + k];
        sxq += xv * float((word >> (k * p.bits)) & mask);
        sx += xv;
      }
      const uint si = p.scale0 + r * groups + g;
      acc += LOAD_SCALE(scales, si, p.scale_type) * sxq + LOAD_SCALE(biases, si, p.scale_type) * sx;
    }
  }
  partial[tid] = acc;
  barrier();
  for (uint s = THREADS_PER_ROW / 2u; s > 0u; s >>= 1u) {
    if (lane < s) partial[tid] += partial[tid + s];
    barrier();
  }
  if (lane == 0u && r < p.rows) y[p.y_offset + t * p.y_stride + r] = partial[tid];
}
