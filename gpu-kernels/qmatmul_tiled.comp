// Y[t, row0 + r] = sum_c W[r, c] X[t, c] for many tokens (prefill), register-tiled: a workgroup
// computes a tile of BM weight rows by BN tokens, each thread a 4 x 4 block of it in registers.
// The columns go by in slabs of 32 (inside one quantization group for group 32, never across a
// word): per slab the workgroup dequantizes its BM rows' 32 columns once (s * q + b, the CPU's
// qmatmul and MLX's qmm arithmetic) and stages its BN tokens' 32 inputs, both in shared memory
// as float rows of 8 vec4s (one pad vec4 per row, so that 8 threads reading 8 rows' vec4s hit
// all 32 banks); then every thread takes, per 4 columns, its 4 rows' and 4 tokens' vec4s and adds
// their 16 dot products. A weight is dequantized once per BN tokens (qmatmul.comp: once per 8)
// and an input read from shared memory once per 4 rows (qmatmul.comp: once per row).
//
// The tile is chosen per dispatch (push constant tile_rows, BM = 32, 64 or 128; BN = 16 *
// THREADS / BM): the host fits it to the token count (gpu_backend.cpp). Nothing assumes a
// subgroup size; no specialization constant sizes an array (shared memory is sized for the
// largest tile, BM + BN <= 160: 23 KB), so SPIRV-Cross translates it for Metal as is.
// Edge tiles: rows past the last and tokens past the last are staged as zeros and not written.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Biases { uint biases[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 4) buffer Y { float y[]; };
// The block of qmatvec.comp (the host fills one struct for both), then the tile.
layout(push_constant) uniform Params {
  uint rows;        // rows in this chunk (the bindings start at its first row)
  uint cols;        // a multiple of the group size, so of 32
  uint bits;
  uint group_size;
  uint scale_type;
  uint scale0;      // index of the chunk's first scale inside the scale/bias bindings
  uint x_offset;
  uint x_stride;
  uint y_offset;    // element of y for token 0, row 0 of the chunk
  uint y_stride;
  uint tokens;
  uint norm_mode;   // (qmatvec's; 0 here)
  float norm_offset;
  float norm_eps;
  float col_scale;
  uint geglu_half;  // (qmatvec's; 0 here)
  uint tile_rows;   // BM: 32, 64 or 128, with BM / 4 <= THREADS / 2 and BM + BN <= 160
} p;

const uint SLAB = 32u;                // columns per step
const uint SLAB_VEC4 = SLAB / 4u;     // 8
const uint ROW_VEC4 = SLAB_VEC4 + 1u;  // a staged row's stride in vec4s (one pad)
const uint MAX_TILE_SUM = 160u;        // BM + BN at most
// Rows 0..BM-1: the dequantized weights; rows BM..BM+BN-1: the tokens' inputs.
shared vec4 tile[MAX_TILE_SUM * ROW_VEC4];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint bm = p.tile_rows;
  const uint tr_count = bm / 4u;           // threads along the rows
  const uint tc_count = THREADS / tr_count;  // threads along the tokens
  const uint bn = 4u * tc_count;
  const uint tr = tid % tr_count;
  const uint tc = tid / tr_count;
  const uint row0 = gl_WorkGroupID.x * bm;
  const uint t0 = gl_WorkGroupID.y * bn;
  const uint words_per_slab = SLAB * p.bits / 32u;  // of one row: 4 (4-bit) or 8 (8-bit)
  const uint cols_per_word = 32u / p.bits;
  const uint row_words = p.cols / cols_per_word;
  const uint groups = p.cols / p.group_size;

  vec4 acc[4];  // acc[i][j]: row tr + i * tr_count, token tc + j * tc_count
  [[unroll]] for (uint i = 0u; i < 4u; ++i) acc[i] = vec4(0.0);

  for (uint c0 = 0u; c0 < p.cols; c0 += SLAB) {
    barrier();  // the previous slab's readers are done
    // The weights: one word (8 or 4 columns of one row) per step, adjacent threads adjacent
    // words of a row.
    for (uint w = tid; w < bm * words_per_slab; w += THREADS) {
      const uint m = w / words_per_slab;
      const uint kw = w % words_per_slab;
      const uint r = row0 + m;
      vec4 lo = vec4(0.0), hi = vec4(0.0);
      if (r < p.rows) {
        const uint word = packed[r * row_words + c0 / cols_per_word + kw];
        const uint si = p.scale0 + r * groups + (c0 + kw * cols_per_word) / p.group_size;
        const float s = LOAD_SCALE(scales, si, p.scale_type);
        const float b = LOAD_SCALE(biases, si, p.scale_type);
        if (p.bits == 4u) {
          lo = s * vec4(uvec4(word, word >> 4u, word >> 8u, word >> 12u) & 15u) + b;
          hi = s * vec4(uvec4(word >> 16u, word >> 20u, word >> 24u, word >> 28u) & 15u) + b;
        } else {
          lo = s * vec4(uvec4(word, word >> 8u, word >> 16u, word >> 24u) & 255u) + b;
        }
      }
      if (p.bits == 4u) {
        tile[m * ROW_VEC4 + 2u * kw] = lo;
        tile[m * ROW_VEC4 + 2u * kw + 1u] = hi;
      } else {
        tile[m * ROW_VEC4 + kw] = lo;
      }
    }
    // The inputs: 4 columns of one token per step, adjacent threads adjacent columns.
    for (uint v = tid; v < bn * SLAB_VEC4; v += THREADS) {
      const uint n = v / SLAB_VEC4;
      const uint q = v % SLAB_VEC4;
      const uint t = t0 + n;
      vec4 xv = vec4(0.0);
      if (t < p.tokens) {
        const uint base = p.x_offset + t * p.x_stride + c0 + q * 4u;
        xv = vec4(x[base], x[base + 1u], x[base + 2u], x[base + 3u]);
      }
      tile[(bm + n) * ROW_VEC4 + q] = xv;
    }
    barrier();
    [[unroll]] for (uint q = 0u; q < SLAB_VEC4; ++q) {
      vec4 a[4], b[4];
      [[unroll]] for (uint i = 0u; i < 4u; ++i) a[i] = tile[(tr + i * tr_count) * ROW_VEC4 + q];
      [[unroll]] for (uint j = 0u; j < 4u; ++j)
        b[j] = tile[(bm + tc + j * tc_count) * ROW_VEC4 + q];
      [[unroll]] for (uint i = 0u; i < 4u; ++i)
        acc[i] += vec4(dot(a[i], b[0]), dot(a[i], b[1]), dot(a[i], b[2]), dot(a[i], b[3]));
    }
  }
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    const uint r = row0 + tr + i * tr_count;
    if (r >= p.rows) continue;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      const uint t = t0 + tc + j * tc_count;
      if (t < p.tokens) y[p.y_offset + t * p.y_stride + r] = acc[i][j];
    }
  }
}
