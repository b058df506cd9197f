// y[s, r] = sum_c W_e[r, c] x[s / x_div, c] for every routed slot s (token t's j-th expert is
// slot t * top_k + j) with e = ids[s] read from device memory: the decode product of the routed
// experts, all of a layer's experts stacked in one buffer (expert e's packed rows start at word
// e * packed_stride, its scales at e * scale_stride, its biases bias0 after its scales). The
// same arithmetic as qmatvec.comp (4 rows per workgroup, 16 threads per row, per group
// s * sum(x q) + b * sum(x)).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed_words[]; };
layout(std430, set = 0, binding = 1) readonly buffer ScalesBiases { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 3) buffer Y { float y[]; };
layout(std430, set = 0, binding = 4) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Params {
  uint rows;           // rows of one expert's matrix
  uint cols;
  uint bits;
  uint group_size;
  uint scale_type;
  uint packed_stride;  // words from one expert's packed rows to the next
  uint scale_stride;   // scales from one expert's scales to the next
  uint bias0;          // scales from a scale to its bias
  uint x_offset;
  uint x_stride;
  uint x_div;          // slot s reads row s / x_div of x (top_k: every expert of a token)
  uint y_offset;
  uint y_stride;
  uint experts;        // ids outside [0, experts) contribute nothing
} p;

const uint ROWS_PER_GROUP = 4u;
const uint THREADS_PER_ROW = 16u;
shared float partial[64];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint r = linear_group() * ROWS_PER_GROUP + tid / THREADS_PER_ROW;
  const uint lane = tid % THREADS_PER_ROW;
  const uint s = gl_WorkGroupID.z;
  const int id = ids[s];
  const bool valid = id >= 0 && uint(id) < p.experts;
  float acc = 0.0;
  if (r < p.rows && valid) {
    const uint e = uint(id);
    const uint per_word = 32u / p.bits;
    const uint mask = (1u << p.bits) - 1u;
    const uint words = p.cols / per_word;
    const uint groups = p.cols / p.group_size;
    const uint xb = p.x_offset + (s / p.x_div) * p.x_stride;
    const uint wb = e * p.packed_stride + r * words;
    const uint sb = e * p.scale_stride + r * groups;
    for (uint i = lane; i < words; i += THREADS_PER_ROW) {
      const uint word = packed_words[wb + i];
      const uint c0 = i * per_word;
      const uint g = c0 / p.group_size;
      float sxq = 0.0;
      float sx = 0.0;
      for (uint k = 0u; k < per_word; ++k) {
        const float xv = x[xb + c0 + k];
        sxq += xv * float((word >> (k * p.bits)) & mask);
        sx += xv;
      }
      const uint si = sb + g;
      acc += LOAD_SCALE(scales, si, p.scale_type) * sxq +
             LOAD_SCALE(scales, p.bias0 + si, p.scale_type) * sx;
    }
  }
  partial[tid] = acc;
  barrier();
  for (uint h = THREADS_PER_ROW / 2u; h > 0u; h >>= 1u) {
    if (lane < h) partial[tid] += partial[tid + h];
    barrier();
  }
  if (lane == 0u && r < p.rows) y[p.y_offset + s * p.y_stride + r] = partial[tid];
}
