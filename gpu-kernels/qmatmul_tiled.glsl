// The register-tiled prefill product's body, shared by qmatmul_tiled.comp (one matrix) and
// moe_matmul_tiled.comp (the routed experts' grouped product): a workgroup computes a tile of BM
// weight rows by BN tokens, each thread a 4 x 4 block of it in registers. The columns go by in
// slabs of 32 (inside one quantization group for group 32, never across a word): per slab the
// workgroup dequantizes its BM rows' 32 columns once (s * q + b, the CPU's qmatmul and MLX's qmm
// arithmetic) and stages its BN tokens' 32 inputs, both in shared memory as float rows of 8
// vec4s (one pad vec4 per row, so that 8 threads reading 8 rows' vec4s hit all 32 banks); then
// every thread takes, per 4 columns, its 4 rows' and 4 tokens' vec4s and adds their 16 dot
// products. A weight is dequantized once per BN tokens (qmatmul.comp: once per 8) and an input
// read from shared memory once per 4 rows (qmatmul.comp: once per row).
//
// BM = 32, 64 or 128 (BN = 16 * THREADS / BM) is chosen per dispatch by the host. Nothing
// assumes a subgroup size; no specialization constant sizes an array (shared memory is sized for
// the largest tile, BM + BN <= 160: 23 KB), so SPIRV-Cross translates it for Metal as is. Edge
// tiles: rows past the last and tokens past the last are staged as zeros and not written.
//
// The including kernel declares THREADS (constant_id 0) and the bindings packed (uint words),
// scales, biases, x and y, then calls tiled_product from main.

const uint SLAB = 32u;                // columns per step
const uint SLAB_VEC4 = SLAB / 4u;     // 8
const uint ROW_VEC4 = SLAB_VEC4 + 1u;  // a staged row's stride in vec4s (one pad)
const uint MAX_TILE_SUM = 160u;        // BM + BN at most
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
  const uint tr_count = bm / 4u;           // threads along the rows
  const uint tc_count = THREADS / tr_count;  // threads along the tokens
  const uint bn = 4u * tc_count;
  const uint tr = tid % tr_count;
  const uint tc = tid / tr_count;
  const uint row0 = gl_WorkGroupID.x * bm;
  const uint words_per_slab = SLAB * bits / 32u;  // of one row: 4 (4-bit) or 8 (8-bit)
  const uint cols_per_word = 32u / bits;
  const uint row_words = cols / cols_per_word;
  const uint groups = cols / group_size;

  vec4 acc[4];  // acc[i][j]: row tr + i * tr_count, token tc + j * tc_count
  [[unroll]] for (uint i = 0u; i < 4u; ++i) acc[i] = vec4(0.0);

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
    if (r >= rows) continue;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      const uint t = t0 + tc + j * tc_count;
      if (t < tokens) y[y_offset + t * y_stride + r] = acc[i][j];
    }
  }
}
