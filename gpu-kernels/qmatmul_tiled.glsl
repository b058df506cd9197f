// The register-tiled prefill product's body, shared by the single-matrix kernels
// (qmatmul_tiled_kernel.glsl) and the routed experts' grouped ones (moe_matmul_tiled_kernel.glsl):
// a workgroup computes a tile of BM weight rows by BN tokens, each thread a TILE_RM x TILE_RN
// block of it in registers. The columns go by in slabs of TILE_SLAB (inside one quantization
// group, never across a word): per slab the workgroup dequantizes its BM rows' columns once
// (s * q + b, the CPU's qmatmul and MLX's qmm arithmetic) and stages its BN tokens' inputs, both in
// shared memory as float rows of TILE_SLAB / 4 vec4s plus one pad vec4 (so that 8 threads reading
// 8 rows' vec4s hit all 32 banks); then every thread takes, per 4 columns, its rows' and tokens'
// vec4s and adds their dot products. A weight is dequantized once per BN tokens and an input read
// from shared memory once per TILE_RM rows.
//
// Why two block sizes (docs/gpu.md, "Seventeenth round"): a thread's shared-memory reads per
// multiply-add fall with the block (4 x 4: 8 vec4s per 64 multiply-adds; 8 x 8: 16 per 256). On a
// CPU device (lavapipe), where a shared-memory read is a real load, the 8-row blocks cut the dense
// products' time by 40% and the experts' by 15%; on the H200 they were 20-39% slower (64
// accumulators leave one workgroup per multiprocessor to hide the loads' latency), so a GPU keeps
// 4 x 4. The host picks the kernel and BM per dispatch (device.h's choose_matmul_tile).
//
// The including kernel defines TILE_RM, TILE_RN (a multiple of 4) and TILE_SLAB (16 or 32),
// declares its push constants and any bindings from 5 on, and calls tiled_product from main.
// Declared here: THREADS (constant_id 0) and bindings 0-4, the matrix (packed uint words, scales,
// biases), x and y. Nothing assumes a subgroup size; no specialization
// constant sizes an array (shared memory is sized by TILE_SLAB: BM + BN <= 160 rows of 9 vec4s
// at slabs of 32, 320 rows of 5 at 16, 23 or 25 KB), so SPIRV-Cross translates it for Metal as
// is. Edge tiles: rows past the last and tokens past the last are staged as zeros and not written.

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uint packed[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Biases { uint biases[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 4) buffer Y { float y[]; };

const uint SLAB = TILE_SLAB;              // columns per step
const uint SLAB_VEC4 = SLAB / 4u;
const uint ROW_VEC4 = SLAB_VEC4 + 1u;     // a staged row's stride in vec4s (one pad)
const uint MAX_TILE_SUM = 5120u / SLAB;   // BM + BN at most: 160 at slabs of 32, 320 at 16
const uint ACC_COLS = TILE_RN / 4u;       // vec4s of accumulators per row of the block
// Rows 0..BM-1: the dequantized weights; rows BM..BM+BN-1: the tokens' inputs.
shared vec4 tile[MAX_TILE_SUM * ROW_VEC4];

// The tile of weight rows gl_WorkGroupID.x * bm.. and tokens t0..t0 + BN - 1 (those below
// `tokens`) of a rows x cols matrix whose packed rows start at word word_base of packed and
// whose scales (and biases) start at element scale0. Token t's input starts at
// x[x_offset + t * x_stride], its output row at y[y_offset + t * y_stride].
void tiled_product(uint rows, uint cols, uint bits, uint group_size, uint scale_type,
                   uint word_base, uint scale0, uint x_offset, uint x_stride, uint y_offset,
                   uint y_stride, uint tokens, uint bm, uint t0) {
  const uint tid = gl_LocalInvocationID.x;
  const uint tr_count = bm / TILE_RM;        // threads along the rows
  const uint tc_count = THREADS / tr_count;  // threads along the tokens
  const uint bn = TILE_RN * tc_count;
  const uint tr = tid % tr_count;
  const uint tc = tid / tr_count;
  const uint row0 = gl_WorkGroupID.x * bm;
  const uint words_per_slab = SLAB * bits / 32u;  // of one row
  const uint cols_per_word = 32u / bits;
  const uint row_words = cols / cols_per_word;
  const uint groups = cols / group_size;

  // acc[i * ACC_COLS + jj][j]: row tr + i * tr_count, token tc + (4 * jj + j) * tc_count
  vec4 acc[TILE_RM * ACC_COLS];
  [[unroll]] for (uint i = 0u; i < TILE_RM * ACC_COLS; ++i) acc[i] = vec4(0.0);

  for (uint c0 = 0u; c0 < cols; c0 += SLAB) {
    barrier();  // the previous slab's readers are done
    // The weights: one word (8 or 4 columns of one row) per step, adjacent threads adjacent
    // words of a row.
    for (uint w = tid; w < bm * words_per_slab; w += THREADS) {
      const uint m = w / words_per_slab;
      const uint kw = w % words_per_slab;
      const uint r = row0 + m;
      vec4 lo = vec4(0.0), hi = vec4(0.0);
      if (r < rows) {
        const uint word = packed[word_base + r * row_words + c0 / cols_per_word + kw];
        const uint si = scale0 + r * groups + (c0 + kw * cols_per_word) / group_size;
        const float s = LOAD_SCALE(scales, si, scale_type);
        const float b = LOAD_SCALE(biases, si, scale_type);
        if (bits == 4u) {
          lo = s * vec4(uvec4(word, word >> 4u, word >> 8u, word >> 12u) & 15u) + b;
          hi = s * vec4(uvec4(word >> 16u, word >> 20u, word >> 24u, word >> 28u) & 15u) + b;
        } else {
          lo = s * vec4(uvec4(word, word >> 8u, word >> 16u, word >> 24u) & 255u) + b;
        }
      }
      if (bits == 4u) {
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
      if (t < tokens) {
        const uint base = x_offset + t * x_stride + c0 + q * 4u;
        xv = vec4(x[base], x[base + 1u], x[base + 2u], x[base + 3u]);
      }
      tile[(bm + n) * ROW_VEC4 + q] = xv;
    }
    barrier();
    [[unroll]] for (uint q = 0u; q < SLAB_VEC4; ++q) {
      // The tokens' vec4s are held for the whole block; the rows' are read one at a time
      // (fewer live registers than holding both: TILE_RN + 1 vec4s besides the accumulators).
      vec4 b[TILE_RN];
      [[unroll]] for (uint j = 0u; j < TILE_RN; ++j)
        b[j] = tile[(bm + tc + j * tc_count) * ROW_VEC4 + q];
      [[unroll]] for (uint i = 0u; i < TILE_RM; ++i) {
        const vec4 a = tile[(tr + i * tr_count) * ROW_VEC4 + q];
        [[unroll]] for (uint jj = 0u; jj < ACC_COLS; ++jj)
          acc[i * ACC_COLS + jj] += vec4(dot(a, b[4u * jj]), dot(a, b[4u * jj + 1u]),
                                         dot(a, b[4u * jj + 2u]), dot(a, b[4u * jj + 3u]));
      }
    }
  }
  [[unroll]] for (uint i = 0u; i < TILE_RM; ++i) {
    const uint r = row0 + tr + i * tr_count;
    if (r >= rows) continue;
    [[unroll]] for (uint j = 0u; j < TILE_RN; ++j) {
      const uint t = t0 + tc + j * tc_count;
      if (t < tokens) y[y_offset + t * y_stride + r] = acc[i * ACC_COLS + j / 4u][j % 4u];
    }
  }
}
