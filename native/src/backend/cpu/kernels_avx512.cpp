// AVX-512 (F, BW, DQ, VL) versions of the quantized matrix-vector product; every other kernel
// comes from the AVX2 table. The decode product is limited by instruction throughput rather
// than memory on CPUs with wide memory systems: the exact float32 method (see
// kernels_avx2.cpp) needs a mask, a conversion and an FMA per 8 weights in AVX2, and 512-bit
// registers halve that. dispatch.cpp selects this table only when the CPU has AVX-512.
//
// The file is compiled without extra flags (CMakeLists.txt only sets flags for *_avx2.cpp); the
// target pragma below enables AVX-512 for the functions defined after it. The standard headers
// come first so that none of their code is compiled for AVX-512.
#if defined(REDWING_HAVE_AVX2)

#include <math.h>
#include <cstdint>

#include "backend/cpu/kernels_impl.h"

#if defined(__clang__)
#pragma clang attribute push(                                                    \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")
// GCC 12 reports _mm512_undefined_ps() inside its own intrinsics as uninitialized when they are
// enabled by a target pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "backend/cpu/attention_loops.h"
#include "backend/cpu/avx512_common.h"

namespace redwing::cpu {
namespace {

// Converts n scales to out[0, n) and zeroes out[n, n + 16) (out has room for the padding).
void scales_to_f32(const void* p, ScaleType type, int64_t offset, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 16) {
    _mm512_storeu_ps(out + i, load_scales16(p, type, offset + i, first_lanes(n - i)));
  }
  _mm512_storeu_ps(out + n, _mm512_setzero_ps());
}

// Lane-wise partial sums of biases[offset + g] * sx[g] over g < n (the bias part of a row; the
// caller's final reduction adds the lanes up together with the rest of the row).
__m512 bias_lanes(const void* p, ScaleType type, int64_t offset, int64_t n, const float* sx) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    acc = _mm512_fmadd_ps(load_scales16(p, type, offset + i, lanes),
                          _mm512_maskz_loadu_ps(lanes, sx + i), acc);
  }
  return acc;
}

template <int kBits>
struct Layout {
  static constexpr int kPerWord = 32 / kBits;   // elements per uint32 word
  static constexpr int kBlock = 16 * kPerWord;  // elements per 64-byte block
  static constexpr uint32_t kMask = (1u << kBits) - 1u;
};

// As in kernels_avx2.cpp, with 16 lanes: xt[blk + 16k + i] = x[blk + i * kPerWord + k] scaled by
// 2^(-kBits * k) (the last k unscaled). A row may end in a partial block (4 bits: 704 columns
// are 5.5 blocks); its missing lanes get x = 0 so that they add nothing.
// One whole block of prepare_x: out[16k + i] = x[i * kPerWord + k] * scale[k]. A lane permute
// puts the elements of each output row next to each other, then a transpose of 64-bit pairs
// (4 bits) or 128-bit quarters (8 bits) across the registers finishes the job.
template <int kBits>
inline void transpose_block(const float* x, float* out, const float* scale) {
  if constexpr (kBits == 4) {
    // Register j holds x[16j, 16j + 16); element pair k of row k is (x[16j + k], x[16j + 8 + k]).
    const __m512i pairs = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    __m512d c[8];
    for (int j = 0; j < 8; ++j) {
      c[j] = _mm512_castps_pd(_mm512_permutexvar_ps(pairs, _mm512_loadu_ps(x + 16 * j)));
    }
    __m512d u[8], v[8];
    for (int j = 0; j < 8; j += 2) {
      u[j] = _mm512_unpacklo_pd(c[j], c[j + 1]);
      u[j + 1] = _mm512_unpackhi_pd(c[j], c[j + 1]);
    }
    const __m512i even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int h = 0; h < 8; h += 4) {
      v[h] = _mm512_permutex2var_pd(u[h], even, u[h + 2]);          // columns 0 and 4
      v[h + 2] = _mm512_permutex2var_pd(u[h], odd, u[h + 2]);       // columns 2 and 6
      v[h + 1] = _mm512_permutex2var_pd(u[h + 1], even, u[h + 3]);  // 1 and 5
      v[h + 3] = _mm512_permutex2var_pd(u[h + 1], odd, u[h + 3]);   // 3 and 7
    }
    for (int k = 0; k < 4; ++k) {
      const __m512d lo = _mm512_shuffle_f64x2(v[k], v[k + 4], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512d hi = _mm512_shuffle_f64x2(v[k], v[k + 4], _MM_SHUFFLE(3, 2, 3, 2));
      _mm512_store_ps(out + 16 * k, _mm512_mul_ps(_mm512_castpd_ps(lo), _mm512_set1_ps(scale[k])));
      _mm512_store_ps(out + 16 * (k + 4),
                      _mm512_mul_ps(_mm512_castpd_ps(hi), _mm512_set1_ps(scale[k + 4])));
    }
  } else {
    // Register j holds x[16j, 16j + 16); quarter k of row k is x[16j + 4t + k], t = 0..3.
    const __m512i quarters =
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512 c[4];
    for (int j = 0; j < 4; ++j) c[j] = _mm512_permutexvar_ps(quarters, _mm512_loadu_ps(x + 16 * j));
    const __m512 t0 = _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 t1 = _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 t2 = _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 t3 = _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 o[4] = {_mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1)),
                         _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1))};
    for (int k = 0; k < 4; ++k) {
      _mm512_store_ps(out + 16 * k, _mm512_mul_ps(o[k], _mm512_set1_ps(scale[k])));
    }
  }
}

template <int kBits>
void prepare_x(const float* x, int64_t cols, int group_size, float* xt, float* sx) {
  using L = Layout<kBits>;
  float step_scale[L::kPerWord];
  for (int k = 0; k < L::kPerWord; ++k) {
    step_scale[k] = k == L::kPerWord - 1 ? 1.0f : 1.0f / static_cast<float>(1u << (kBits * k));
  }
  int64_t b0 = 0;
  for (; b0 + L::kBlock <= cols; b0 += L::kBlock)
    transpose_block<kBits>(x + b0, xt + b0, step_scale);
  if (b0 < cols) {
    // The partial block: transpose a zero-padded copy.
    alignas(64) float padded[L::kBlock] = {};
    for (int64_t c = b0; c < cols; ++c) padded[c - b0] = x[c];
    transpose_block<kBits>(padded, xt + b0, step_scale);
  }
  group_sums(x, cols, group_size, sx);
}

template <int kBits, int kRows, bool kPartial>
inline void block_dot(const uint32_t* const* rows, int64_t blk, const float* xtb, __m512* out,
                      bool init, __mmask16 lanes, const char* prefetch) {
  using L = Layout<kBits>;
  // Rows are read kRows at a time, which the hardware prefetcher sees as several short streams
  // and follows poorly; fetching the row group ahead sequentially, one line per row per block,
  // restores streaming speed. Prefetches past the matrix end are harmless (they never fault).
  for (int i = 0; i < kRows; ++i) _mm_prefetch(prefetch + (blk * kRows + i) * 64, _MM_HINT_T0);
  __m512i wv[kRows];
  for (int i = 0; i < kRows; ++i) {
    // A partial block loads only the words that exist: masked lanes do not touch memory.
    wv[i] = kPartial ? _mm512_maskz_loadu_epi32(lanes, rows[i] + blk * 16)
                     : _mm512_loadu_si512(rows[i] + blk * 16);
  }
  for (int k = 0; k < L::kPerWord; ++k) {
    const __m512 xk = _mm512_load_ps(xtb + 16 * k);
    for (int i = 0; i < kRows; ++i) {
      __m512i q;
      if (k == L::kPerWord - 1) {
        q = _mm512_srli_epi32(wv[i], 32 - kBits);
      } else {
        q = _mm512_and_si512(wv[i], _mm512_set1_epi32(static_cast<int>(L::kMask << (kBits * k))));
      }
      const __m512 qf = _mm512_cvtepi32_ps(q);
      out[i] = (k == 0 && init) ? _mm512_mul_ps(qf, xk) : _mm512_fmadd_ps(qf, xk, out[i]);
    }
  }
}

// sbuf holds kRows rows of stride (gpr + 16) floats: the row's scales then 16 zeros, so a
// 16-wide load at any group of the row stays inside the buffer and reads 0 past the end.
template <int kBits, int kGroup, int kRows>
void qmv_rows(const QuantMatrix& w, const float* xt, const float* sx, int64_t r0, float* y,
              float* sbuf) {
  using L = Layout<kBits>;
  const int64_t wpr = w.cols / L::kPerWord;
  const int64_t gpr = w.cols / kGroup;
  const int64_t stride = gpr + 16;
  const uint32_t* rows[kRows];
  __m512 acc[kRows];  // starts with the bias part, lane-wise
  prefetch_scales(w, (r0 + kPrefetchGroups * kRows) * gpr, kRows * gpr);
  for (int i = 0; i < kRows; ++i) {
    scales_to_f32(w.scales, w.scale_type, (r0 + i) * gpr, gpr, sbuf + i * stride);
    acc[i] = bias_lanes(w.biases, w.scale_type, (r0 + i) * gpr, gpr, sx);
    rows[i] = w.packed + (r0 + i) * wpr;
  }
  const char* pf = reinterpret_cast<const char*>(w.packed + (r0 + kPrefetchGroups * kRows) * wpr);
  if constexpr (kGroup >= L::kBlock) {
    // Whole blocks per group (cols is a multiple of the group, so no partial block).
    constexpr int kBlocksPerGroup = kGroup / L::kBlock;
    for (int64_t g = 0; g < gpr; ++g) {
      __m512 gacc[kRows];
      for (int bb = 0; bb < kBlocksPerGroup; ++bb) {
        const int64_t blk = g * kBlocksPerGroup + bb;
        block_dot<kBits, kRows, false>(rows, blk, xt + blk * L::kBlock, gacc, bb == 0, 0, pf);
      }
      for (int i = 0; i < kRows; ++i) {
        acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(sbuf[i * stride + g]), gacc[i], acc[i]);
      }
    }
  } else {
    // Several groups per block: lane i belongs to group (i * kPerWord) / kGroup of the block,
    // so a permute spreads the block's scales over the lanes.
    constexpr int kGroupsPerBlock = L::kBlock / kGroup;
    alignas(64) int32_t lane_group[16];
    for (int i = 0; i < 16; ++i) lane_group[i] = i * L::kPerWord / kGroup;
    const __m512i idx = _mm512_load_si512(lane_group);
    const int64_t n_full = w.cols / L::kBlock;
    auto scale_block = [&](int64_t blk, const __m512* bacc) {
      for (int i = 0; i < kRows; ++i) {
        const __m512 s = _mm512_loadu_ps(sbuf + i * stride + blk * kGroupsPerBlock);
        acc[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, s), bacc[i], acc[i]);
      }
    };
    for (int64_t blk = 0; blk < n_full; ++blk) {
      __m512 bacc[kRows];
      block_dot<kBits, kRows, false>(rows, blk, xt + blk * L::kBlock, bacc, true, 0, pf);
      scale_block(blk, bacc);
    }
    const int tail_words = static_cast<int>((w.cols % L::kBlock) / L::kPerWord);
    if (tail_words > 0) {
      __m512 bacc[kRows];
      const auto lanes = static_cast<__mmask16>((1u << tail_words) - 1u);
      block_dot<kBits, kRows, true>(rows, n_full, xt + n_full * L::kBlock, bacc, true, lanes, pf);
      scale_block(n_full, bacc);
    }
  }
  if constexpr (kRows == 4) {
    _mm_storeu_ps(y + r0, reduce4(acc[0], acc[1], acc[2], acc[3]));
  } else {
    for (int i = 0; i < kRows; ++i) y[r0 + i] = _mm512_reduce_add_ps(acc[i]);
  }
}

constexpr int kRowsPerStep = 4;  // rows sharing each load of x

template <int kBits, int kGroup>
void qmv_range(const QuantMatrix& w, const float* xt, const float* sx, float* y, int64_t rb,
               int64_t re, float* sbuf) {
  int64_t r = rb;
  for (; r + kRowsPerStep <= re; r += kRowsPerStep) {
    qmv_rows<kBits, kGroup, kRowsPerStep>(w, xt, sx, r, y, sbuf);
  }
  for (; r < re; ++r) qmv_rows<kBits, kGroup, 1>(w, xt, sx, r, y, sbuf);
}

template <int kBits, int kGroup>
void qmatvec_shaped(const QuantMatrix& w, const float* x, float* y, int64_t rb, int64_t re) {
  using L = Layout<kBits>;
  thread_local Scratch xt_buf, sx_buf, s_buf;
  const int64_t gpr = groups_per_row(w);
  const int64_t padded_cols = (w.cols + L::kBlock - 1) / L::kBlock * L::kBlock;
  float* xt = xt_buf.floats(static_cast<size_t>(padded_cols));
  float* sx = sx_buf.floats(static_cast<size_t>(gpr));
  float* sbuf = s_buf.floats(static_cast<size_t>(kRowsPerStep * (gpr + 16) + 16));
  prepare_x<kBits>(x, w.cols, w.group_size, xt, sx);
  qmv_range<kBits, kGroup>(w, xt, sx, y, rb, re, sbuf);
}

void qmatvec_avx512(const QuantMatrix& w, const float* x, float* y, int64_t rb, int64_t re) {
  with_quant_shape(
      w, [&]<int kBits, int kGroup>() { qmatvec_shaped<kBits, kGroup>(w, x, y, rb, re); });
}

// ---- qmatmul ---------------------------------------------------------------------------------

// kRows x kCols dot products of dequantized weight rows (stride ws) with rows of X (stride xs)
// over n columns (a multiple of 16); 4 x 6 accumulators fill 24 of the 32 registers.
template <int kRows, int kCols>
void micro_kernel(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y,
                  int64_t ys) {
  __m512 acc[kRows][kCols];
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < kCols; ++t) acc[i][t] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < n; c += 16) {
    __m512 xv[kCols];
    for (int t = 0; t < kCols; ++t) xv[t] = _mm512_loadu_ps(x + t * xs + c);
    for (int i = 0; i < kRows; ++i) {
      const __m512 wv = _mm512_loadu_ps(w + i * ws + c);
      for (int t = 0; t < kCols; ++t) acc[i][t] = _mm512_fmadd_ps(wv, xv[t], acc[i][t]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < kCols; ++t) y[t * ys + i] = _mm512_reduce_add_ps(acc[i][t]);
  }
}

template <int kRows>
void micro_rows(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y,
                int64_t ys, int n_cols) {
  switch (n_cols) {
    case 6:
      return micro_kernel<kRows, 6>(w, ws, x, xs, n, y, ys);
    case 5:
      return micro_kernel<kRows, 5>(w, ws, x, xs, n, y, ys);
    case 4:
      return micro_kernel<kRows, 4>(w, ws, x, xs, n, y, ys);
    case 3:
      return micro_kernel<kRows, 3>(w, ws, x, xs, n, y, ys);
    case 2:
      return micro_kernel<kRows, 2>(w, ws, x, xs, n, y, ys);
    default:
      return micro_kernel<kRows, 1>(w, ws, x, xs, n, y, ys);
  }
}

// As qmatmul_avx2 (a dequantized panel of weight rows reused for every row of X), with 512-bit
// FMAs and 6 X rows per tile.
void qmatmul_avx512(const QuantMatrix& w, const float* x, int64_t n_x, int64_t xs, float* y,
                    int64_t ys, int64_t rb, int64_t re) {
  constexpr int64_t kPanel = 16;
  constexpr int kTile = 6;
  const int64_t cols = w.cols;
  const auto dequant = avx2_kernels().qdequant_row;
  thread_local Scratch panel_buf;
  float* panel = panel_buf.floats(static_cast<size_t>(kPanel * cols));
  for (int64_t p0 = rb; p0 < re; p0 += kPanel) {
    const int64_t np = re - p0 < kPanel ? re - p0 : kPanel;
    for (int64_t i = 0; i < np; ++i) dequant(w, p0 + i, panel + i * cols);
    for (int64_t t0 = 0; t0 < n_x; t0 += kTile) {
      const int nt = static_cast<int>(n_x - t0 < kTile ? n_x - t0 : kTile);
      const float* xt = x + t0 * xs;
      float* yt = y + t0 * ys + p0;
      int64_t i = 0;
      for (; i + 4 <= np; i += 4) {
        micro_rows<4>(panel + i * cols, cols, xt, xs, cols, yt + i, ys, nt);
      }
      for (; i < np; ++i) micro_rows<1>(panel + i * cols, cols, xt, xs, cols, yt + i, ys, nt);
    }
  }
}

// ---- attention over one block of keys ---------------------------------------------------
//
// The generic attention_partial (dispatch.cpp) calls a dot product per (key, query head) and
// an axpy per (key, query head): each f16 row is widened once per head, each head's 256-value
// dot runs on two dependent accumulator chains and ends in its own reduction, and every axpy
// reloads and stores the head's output. These tiles widen each row of K or V once for several
// heads and keep 8 independent accumulators in registers.

// Lanes [0, n) of 16 (none for n <= 0).
inline __mmask16 lanes_upto(int64_t n) {
  return n <= 0 ? static_cast<__mmask16>(0) : first_lanes(n);
}

template <bool kF16>
inline __m512 load_kv16(const void* base, int64_t at, __mmask16 lanes) {
  if constexpr (kF16) {
    return _mm512_cvtph_ps(
        _mm256_maskz_loadu_epi16(lanes, static_cast<const uint16_t*>(base) + at));
  } else {
    return _mm512_maskz_loadu_ps(lanes, static_cast<const float*>(base) + at);
  }
}

// The tiles of attention_loops.h at 16 lanes.
struct Avx512AttentionTiles {
  static constexpr int kLanes = 16;

  // Scores of keys [j0, j0 + kKeys) for query heads [h0, h0 + kHeads): one 16-lane accumulator
  // per pair, summed over the head dimension, then reduced.
  template <bool kF16, int kKeys, int kHeads>
  static void score_tile(const float* q, int64_t q_stride, int d, float scale, const void* k,
                         const int64_t* rows, int64_t n, int h0, int64_t j0, float* s) {
    __m512 acc[kKeys][kHeads];
    REDWING_UNROLL
    for (int a = 0; a < kKeys; ++a) {
      REDWING_UNROLL
      for (int h = 0; h < kHeads; ++h) acc[a][h] = _mm512_setzero_ps();
    }
    for (int c = 0; c < d; c += 16) {
      const __mmask16 lanes = lanes_upto(d - c);
      __m512 qv[kHeads];
      REDWING_UNROLL
      for (int h = 0; h < kHeads; ++h)
        qv[h] = _mm512_maskz_loadu_ps(lanes, q + (h0 + h) * q_stride + c);
      REDWING_UNROLL
      for (int a = 0; a < kKeys; ++a) {
        const __m512 kv = load_kv16<kF16>(k, rows[j0 + a] + c, lanes);
        REDWING_UNROLL
        for (int h = 0; h < kHeads; ++h) acc[a][h] = _mm512_fmadd_ps(qv[h], kv, acc[a][h]);
      }
    }
    REDWING_UNROLL
    for (int a = 0; a < kKeys; ++a) {
      REDWING_UNROLL
      for (int h = 0; h < kHeads; ++h)
        s[(h0 + h) * n + j0 + a] = _mm512_reduce_add_ps(acc[a][h]) * scale;
    }
  }

  // Output columns [c0, c0 + 16 kChunks) of query heads [h0, h0 + kHeads): each value row's
  // columns are widened once and added, weighted, to every head's accumulators, key by key (the
  // order of the generic path's axpy calls, so the sums are the same).
  template <bool kF16, int kHeads, int kChunks>
  static void value_tile(const float* p, int d, const void* v, const int64_t* rows, int64_t n,
                         int h0, int c0, float* o) {
    __m512 acc[kHeads][kChunks];
    __mmask16 lanes[kChunks];
    REDWING_UNROLL
    for (int c = 0; c < kChunks; ++c) lanes[c] = lanes_upto(d - c0 - 16 * c);
    REDWING_UNROLL
    for (int h = 0; h < kHeads; ++h) {
      REDWING_UNROLL
      for (int c = 0; c < kChunks; ++c) acc[h][c] = _mm512_setzero_ps();
    }
    for (int64_t j = 0; j < n; ++j) {
      __m512 vv[kChunks];
      REDWING_UNROLL
      for (int c = 0; c < kChunks; ++c) vv[c] = load_kv16<kF16>(v, rows[j] + c0 + 16 * c, lanes[c]);
      REDWING_UNROLL
      for (int h = 0; h < kHeads; ++h) {
        const __m512 w = _mm512_set1_ps(p[(h0 + h) * n + j]);
        REDWING_UNROLL
        for (int c = 0; c < kChunks; ++c) acc[h][c] = _mm512_fmadd_ps(w, vv[c], acc[h][c]);
      }
    }
    REDWING_UNROLL
    for (int h = 0; h < kHeads; ++h) {
      REDWING_UNROLL
      for (int c = 0; c < kChunks; ++c)
        _mm512_mask_storeu_ps(o + (h0 + h) * d + c0 + 16 * c, lanes[c], acc[h][c]);
    }
  }
};

}  // namespace

const KernelTable& avx512_kernels() {
  static const KernelTable table = [] {
    KernelTable t = avx2_kernels();
    t.qmatvec = qmatvec_avx512;
    t.qmatmul = qmatmul_avx512;
    t.row_groups.qmatvec = false;  // the AVX2 table's flag; this one reads rows
    if (cpu_has_avx512_vnni()) {
      t.qmatmul_q8 = avx512_vnni_qmatmul_q8();
      t.x24 = avx512_vnni_x24();
      t.row_groups.q8 = t.row_groups.x24 = true;  // both read row groups (kernels.h)
    }
    t.attention_scores = AttentionLoops<Avx512AttentionTiles>::scores;
    t.attention_values = AttentionLoops<Avx512AttentionTiles>::values;
    return t;
  }();
  return table;
}

}  // namespace redwing::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#endif  // REDWING_HAVE_AVX2
