// y[t, row0 + r] = sum_c W[r, c] x[t, c] for an MLX affine-quantized W (4 or 8 bits, any group
// size, bf16/f16/f32 scales and biases): the decode product, used for up to 4 rows of x (one
// z-slice each). Each workgroup computes MV_ROWS rows in teams of MV_LANES threads, x read from
// device memory without staging; every weight word is read once per token (matvec.glsl says why).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

// Threads per workgroup: 256, or fewer on a CPU device (matvec.glsl; docs/gpu.md).
layout(constant_id = 0) const uint THREADS = 256u;
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Biases { uint biases[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { vec4 x4[]; };  // (16-byte aligned binding)
layout(std430, set = 0, binding = 4) buffer Y { float y[]; };
layout(std430, set = 0, binding = 5) readonly buffer NormWeight { float norm_weight[]; };
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
  uint tokens;       // (qmatmul's; unused here)
  // An RMSNorm of x folded into the product (backend.h's qmatmul_normed): 0 none; 1: x is
  // normed with the weight factor (norm_offset + norm_weight[c]); 2: x * norm_weight[c] * col_scale
  // (rms_norm_mul_cols); 3: normed without a weight.
  uint norm_mode;
  float norm_offset;
  float norm_eps;
  float col_scale;
  uint geglu_half;  // 0, or x's element i is gelu_tanh(x[i]) * x[i + geglu_half] (a gated MLP's
                    // GeGLU computed while staging the down product's input)
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
#define MV_BIAS(I) LOAD_SCALE(biases, (I), p.scale_type)
#define MV_X_FACTOR(C)                                       \
  (p.norm_mode == 1u   ? p.norm_offset + norm_weight[(C)]    \
   : p.norm_mode == 2u ? norm_weight[(C)] * p.col_scale \
                       : 1.0)
#include "matvec.glsl"

void main() {
  const uint thread = mv_thread();
  const uint lane = thread % MV_LANES;
  const uint r0 = linear_group() * MV_ROWS + (thread / MV_LANES) * MV_RPT;  // the team's first row
  const uint t = gl_WorkGroupID.z;
  const uint rows_here = r0 < p.rows ? min(MV_RPT, p.rows - r0) : 0u;
  // A row holds cols * bits / 32 words (cols is a multiple of the group size, at least 32).
  const uint row_words = p.cols * p.bits / 32u;
  const uint groups = p.cols / p.group_size;
  const uint xb = p.x_offset + t * p.x_stride;
  const bool aligned = (xb & 3u) == 0u && (p.geglu_half & 3u) == 0u;
  float acc[MV_MAX_RPT];
  float ss;
  mv_rows(r0 * row_words, p.scale0 + r0 * groups, xb, aligned, p.cols, p.bits, p.group_size,
          lane, rows_here, acc, ss);
  float v[MV_MAX_RPT + 1u];
  [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i) v[i] = acc[i];
  v[MV_RPT] = ss;  // reduced only with a folded norm
  mv_reduce(v, p.norm_mode != 0u ? MV_RPT + 1u : MV_RPT, thread, lane);
  // (mean(x^2) + eps)^-1/2 of x: the factor of an RMSNorm folded into the product (sum_c W[r, c]
  // x[c] f[c] times it is the product with the normed x).
  const float factor = p.norm_mode != 0u ? 1.0 / sqrt(v[MV_RPT] / float(p.cols) + p.norm_eps) : 1.0;
  if (lane == 0u) {
    [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i)
      if (i < rows_here) y[p.y_offset + t * p.y_stride + r0 + i] = v[i] * factor;
  }
}
