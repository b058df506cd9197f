// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c (see CMakeLists.txt) and only
// called after dispatch.cpp has checked the CPU for all three.
//
// Quantized matrix-vector product (the decode hot path, memory bound). Each 32-byte block of a
// packed row holds 8 words; with kBits-bit values a word holds kPerWord = 32 / kBits elements, so
// lane i of the block holds elements i * kPerWord ... i * kPerWord + kPerWord - 1. For every step
// k < kPerWord, masking the
// block with (2^kBits - 1) << (kBits * k) leaves element (i * kPerWord + k) of the block in lane i,
// scaled by 2^(kBits * k). Converting that integer to float is exact (at most 8 significant
// bits), so multiplying it with x[i * kPerWord + k] * 2^(-kBits * k) (prepared once per call, a
// power-of-two scaling, exact) gives exactly x * q: no shifts and no shuffles in the inner loop.
// The last step uses a logical shift instead of a mask so the value stays below 2^31. Per group
// the kernel accumulates sum(x * q) in 8 lanes and adds s * that to the row's accumulator; the
// bias term b * sum(x) uses group sums of x computed once per call.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include <math.h>

#include "backend/cpu/attention_loops.h"
#include "backend/cpu/kernels_impl.h"

namespace redwing::cpu {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load_bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Eight scales or biases starting at index i, as float32.
inline __m256 load_scales8(const void* p, ScaleType type, int64_t i) {
  switch (type) {
    case ScaleType::bf16:
      return load_bf16x8(static_cast<const uint16_t*>(p) + i);
    case ScaleType::f16:
      return load_f16x8(static_cast<const uint16_t*>(p) + i);
    case ScaleType::f32:
      break;
  }
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

void scales_to_f32(const void* p, ScaleType type, int64_t offset, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load_scales8(p, type, offset + i));
  for (; i < n; ++i) out[i] = load_scale(p, type, offset + i);
}

// sum_g biases[offset + g] * sx[g]: the bias part of one row of a product.
float bias_dot(const void* p, ScaleType type, int64_t offset, int64_t n, const float* sx) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc = _mm256_fmadd_ps(load_scales8(p, type, offset + i), _mm256_loadu_ps(sx + i), acc);
  }
  float total = hsum(acc);
  for (; i < n; ++i) total += load_scale(p, type, offset + i) * sx[i];
  return total;
}

// ---- qmatvec ---------------------------------------------------------------------------------

template <int kBits>
struct Layout {
  static constexpr int kPerWord = 32 / kBits;  // elements per uint32 word
  static constexpr int kBlock = 8 * kPerWord;  // elements per 32-byte block
  static constexpr uint32_t kMask = (1u << kBits) - 1u;
};

// One block of prepare_x: out[8k + i] = x[i * kPerWord + k] * scale[k], by register transposes.
template <int kBits>
inline void transpose_block(const float* x, float* out, const float* scale) {
  if constexpr (kBits == 4) {
    // out row k, lane i = x[8i + k]: a plain 8 x 8 transpose. Written out without arrays: GCC
    // 12 turned an array version into 128-bit loads and stack round trips that stalled.
    const __m256 r0 = _mm256_loadu_ps(x), r1 = _mm256_loadu_ps(x + 8);
    const __m256 r2 = _mm256_loadu_ps(x + 16), r3 = _mm256_loadu_ps(x + 24);
    const __m256 r4 = _mm256_loadu_ps(x + 32), r5 = _mm256_loadu_ps(x + 40);
    const __m256 r6 = _mm256_loadu_ps(x + 48), r7 = _mm256_loadu_ps(x + 56);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    auto put = [&](int k, __m256 v) {
      _mm256_storeu_ps(out + 8 * k, _mm256_mul_ps(v, _mm256_set1_ps(scale[k])));
    };
    put(0, _mm256_permute2f128_ps(s0, s4, 0x20));
    put(1, _mm256_permute2f128_ps(s1, s5, 0x20));
    put(2, _mm256_permute2f128_ps(s2, s6, 0x20));
    put(3, _mm256_permute2f128_ps(s3, s7, 0x20));
    put(4, _mm256_permute2f128_ps(s0, s4, 0x31));
    put(5, _mm256_permute2f128_ps(s1, s5, 0x31));
    put(6, _mm256_permute2f128_ps(s2, s6, 0x31));
    put(7, _mm256_permute2f128_ps(s3, s7, 0x31));
  } else {
    // Register j holds x[8j, 8j + 8); after the lane permute, 64-bit pair k is
    // (x[8j + k], x[8j + 4 + k]) = lanes (2j, 2j + 1) of out row k; a 4 x 4 transpose of pairs.
    const __m256i pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256d c[4];
    for (int j = 0; j < 4; ++j) {
      c[j] = _mm256_castps_pd(_mm256_permutevar8x32_ps(_mm256_loadu_ps(x + 8 * j), pairs));
    }
    const __m256d t0 = _mm256_unpacklo_pd(c[0], c[1]);
    const __m256d t1 = _mm256_unpackhi_pd(c[0], c[1]);
    const __m256d t2 = _mm256_unpacklo_pd(c[2], c[3]);
    const __m256d t3 = _mm256_unpackhi_pd(c[2], c[3]);
    const __m256d o[4] = {
        _mm256_permute2f128_pd(t0, t2, 0x20), _mm256_permute2f128_pd(t1, t3, 0x20),
        _mm256_permute2f128_pd(t0, t2, 0x31), _mm256_permute2f128_pd(t1, t3, 0x31)};
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(out + 8 * k,
                       _mm256_mul_ps(_mm256_castpd_ps(o[k]), _mm256_set1_ps(scale[k])));
    }
  }
}

// xt[block + 8k + i] = x[block + i * kPerWord + k] * 2^(-kBits * k) (the last k unscaled, see
// the top of the file); sx[g] = sum of group g of x.
template <int kBits>
void prepare_x(const float* x, int64_t cols, int group_size, float* xt, float* sx) {
  using L = Layout<kBits>;
  float step_scale[L::kPerWord];
  for (int k = 0; k < L::kPerWord; ++k) {
    step_scale[k] = k == L::kPerWord - 1 ? 1.0f : 1.0f / static_cast<float>(1u << (kBits * k));
  }
  // Whole blocks only: with 4 bits and groups of 32, a row may end in half a block (see qmv_rows).
  for (int64_t b0 = 0; b0 + L::kBlock <= cols; b0 += L::kBlock) {
    transpose_block<kBits>(x + b0, xt + b0, step_scale);
  }
  for (int64_t g = 0; g * group_size < cols; ++g) {
    const float* xg = x + g * group_size;
    __m256 a0 = _mm256_loadu_ps(xg);
    __m256 a1 = _mm256_loadu_ps(xg + 8);
    __m256 a2 = _mm256_loadu_ps(xg + 16);
    __m256 a3 = _mm256_loadu_ps(xg + 24);
    for (int j = 32; j < group_size; j += 32) {
      a0 = _mm256_add_ps(a0, _mm256_loadu_ps(xg + j));
      a1 = _mm256_add_ps(a1, _mm256_loadu_ps(xg + j + 8));
      a2 = _mm256_add_ps(a2, _mm256_loadu_ps(xg + j + 16));
      a3 = _mm256_add_ps(a3, _mm256_loadu_ps(xg + j + 24));
    }
    sx[g] = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
}

// For kRows rows, out[i] (+)= the 8 lane partial sums of x * q over block blk.
template <int kBits, int kRows>
inline void block_dot(const RowBlocks& rows, int64_t blk, const float* xtb, __m256* out, bool init,
                      const char* prefetch) {
  using L = Layout<kBits>;
  // Rows are read kRows at a time, which hardware prefetchers follow poorly (several short
  // streams); prefetching a later row group sequentially, one line per row every other 32-byte
  // block, keeps the loads streaming. Prefetches past the matrix end never fault.
  if ((blk & 1) == 0) {
    for (int i = 0; i < kRows; ++i)
      _mm_prefetch(prefetch + (blk / 2 * kRows + i) * 64, _MM_HINT_T0);
  }
  __m256i wv[kRows];
  for (int i = 0; i < kRows; ++i) {
    wv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.word(i, blk * 8)));
  }
  for (int k = 0; k < L::kPerWord; ++k) {
    const __m256 xk = _mm256_loadu_ps(xtb + 8 * k);
    for (int i = 0; i < kRows; ++i) {
      __m256i q;
      if (k == L::kPerWord - 1) {
        q = _mm256_srli_epi32(wv[i], 32 - kBits);
      } else {
        q = _mm256_and_si256(wv[i], _mm256_set1_epi32(static_cast<int>(L::kMask << (kBits * k))));
      }
      const __m256 qf = _mm256_cvtepi32_ps(q);
      out[i] = (k == 0 && init) ? _mm256_mul_ps(qf, xk) : _mm256_fmadd_ps(qf, xk, out[i]);
    }
  }
}

// Lanes [0, n) of 8 set (n in 0..8).
inline __m256i first_lanes8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int kBits, int kGroup, int kRows>
void qmv_rows(const QuantMatrix& w, const float* x, const float* xt, const float* sx, int64_t r0,
              float* y, float* sbuf) {
  using L = Layout<kBits>;
  const int64_t wpr = w.cols / L::kPerWord;
  const int64_t gpr = w.cols / kGroup;
  float bias_part[kRows] = {};
  const RowBlocks rows = row_blocks(w, r0);
  prefetch_scales(w, (r0 + kPrefetchGroups * kRows) * gpr, kRows * gpr);
  // The rows' scales and biases are contiguous: both widened in one pass each (sbuf holds the
  // kRows rows' scales, then their biases), instead of a call per row with its own short tail.
  float* bbuf = sbuf + kRows * gpr;
  scales_to_f32(w.scales, w.scale_type, r0 * gpr, kRows * gpr, sbuf);
  scales_to_f32(w.biases, w.scale_type, r0 * gpr, kRows * gpr, bbuf);
  // Each row's accumulator starts with its bias term, sum_g b[g] * sx[g] in 8 lanes (sx is
  // zero-padded to whole vectors, the biases past the row are masked off), so one reduction at
  // the end covers both.
  const int64_t full = gpr & ~int64_t{7};
  const __m256i tail = first_lanes8(gpr - full);
  __m256 acc[kRows];
  for (int i = 0; i < kRows; ++i) {
    const float* b = bbuf + i * gpr;
    __m256 a = _mm256_setzero_ps();
    for (int64_t g = 0; g < full; g += 8)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(b + g), _mm256_loadu_ps(sx + g), a);
    if (full < gpr)
      a = _mm256_fmadd_ps(_mm256_maskload_ps(b + full, tail), _mm256_loadu_ps(sx + full), a);
    acc[i] = a;
  }
  const char* pf = reinterpret_cast<const char*>(w.packed + (r0 + kPrefetchGroups * kRows) * wpr);
  if constexpr (kGroup >= L::kBlock) {
    constexpr int kBlocksPerGroup = kGroup / L::kBlock;
    for (int64_t g = 0; g < gpr; ++g) {
      __m256 gacc[kRows];
      for (int bb = 0; bb < kBlocksPerGroup; ++bb) {
        const int64_t blk = g * kBlocksPerGroup + bb;
        block_dot<kBits, kRows>(rows, blk, xt + blk * L::kBlock, gacc, bb == 0, pf);
      }
      for (int i = 0; i < kRows; ++i) {
        acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(sbuf + i * gpr + g), gacc[i], acc[i]);
      }
    }
  } else {
    // 4-bit with groups of 32: lanes 0-3 of a block belong to group 2 blk, lanes 4-7 to the next.
    static_assert(L::kBlock == 2 * kGroup);
    const int64_t nblk = w.cols / L::kBlock;
    for (int64_t blk = 0; blk < nblk; ++blk) {
      __m256 bacc[kRows];
      block_dot<kBits, kRows>(rows, blk, xt + blk * L::kBlock, bacc, true, pf);
      for (int i = 0; i < kRows; ++i) {
        const float* s = sbuf + i * gpr + 2 * blk;
        const __m256 sv = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(s)),
                                               _mm_broadcast_ss(s + 1), 1);
        acc[i] = _mm256_fmadd_ps(sv, bacc[i], acc[i]);
      }
    }
    if (w.cols % L::kBlock != 0) {
      // An odd number of groups: the last group is half a block, done one element at a time.
      const int64_t c0 = nblk * L::kBlock;
      for (int i = 0; i < kRows; ++i) {
        float sxq = 0.0f;
        for (int64_t c = c0; c < w.cols; ++c) {
          sxq +=
              x[c] * static_cast<float>(quant_at(rows.word(i, c0 / (32 / kBits)), kBits, c - c0));
        }
        bias_part[i] += sbuf[i * gpr + gpr - 1] * sxq;
      }
    }
  }
  for (int i = 0; i < kRows; ++i) y[r0 + i] = hsum(acc[i]) + bias_part[i];
}

template <int kBits, int kGroup>
void qmv_range(const QuantMatrix& w, const float* x, const float* xt, const float* sx, float* y,
               int64_t rb, int64_t re, float* sbuf) {
  // 4 rows share each load of x: 4 keeps 16 ymm registers busy.
  for_row_tiles(
      w, rb, re, [&](int64_t r) { qmv_rows<kBits, kGroup, 4>(w, x, xt, sx, r, y, sbuf); },
      [&](int64_t r) { qmv_rows<kBits, kGroup, 1>(w, x, xt, sx, r, y, sbuf); });
}

template <int kBits, int kGroup>
void qmatvec_shaped(const QuantMatrix& w, const float* x, float* y, int64_t rb, int64_t re) {
  thread_local Scratch xt_buf, sx_buf, s_buf;
  const int64_t gpr = groups_per_row(w);
  float* xt = xt_buf.floats(static_cast<size_t>(w.cols));
  // sx padded with zeros to whole 8-lane vectors (qmv_rows reads it 8 at a time).
  float* sx = sx_buf.floats(static_cast<size_t>(gpr + 8));
  float* sbuf = s_buf.floats(static_cast<size_t>(8 * gpr));
  prepare_x<kBits>(x, w.cols, w.group_size, xt, sx);
  std::fill_n(sx + gpr, 8, 0.0f);
  qmv_range<kBits, kGroup>(w, x, xt, sx, y, rb, re, sbuf);
}

void qmatvec_avx2(const QuantMatrix& w, const float* x, float* y, int64_t rb, int64_t re) {
  with_quant_shape(
      w, [&]<int kBits, int kGroup>() { qmatvec_shaped<kBits, kGroup>(w, x, y, rb, re); });
}

// ---- dequantization and qmatmul --------------------------------------------------------------

// ---- qmatvec_q8 (8-bit activations, kernels.h) ----------------------------------------------

// vpmaddubsw multiplies unsigned weight codes by signed int8 activations and adds adjacent
// pairs into int16; vpmaddwd by ones adds those pairs into int32, so lane i of a 256-bit
// register gets the dot product of weight word i with its activations. 4-bit codes times 127
// stay far from int16 saturation (2 * 15 * 127); 8-bit codes are split into nibbles for the
// same reason (2 * 255 * 127 would saturate) and recombined as lo + 16 * hi in int32.
template <int kBits>
struct Q8Layout {
  static constexpr int kPerLane = 32 / kBits;
  static constexpr int kValues = 8 * kPerLane;  // values per 32-byte register of weights
};

template <int kBits>
inline __m256i lane_dots_q8(__m256i wv, const int8_t* q, int64_t blk) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i lo = _mm256_and_si256(wv, nibble);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nibble);
  if constexpr (kBits == 4) {
    // 128-value activation blocks hold the even values, then the odd ones (kernels.h).
    const int8_t* a = q + (blk >> 1) * 128 + (blk & 1) * 32;
    const __m256i a_even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i a_odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 64));
    const __m256i p =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, a_even), _mm256_maddubs_epi16(hi, a_odd));
    return _mm256_madd_epi16(p, ones);
  } else {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + blk * 32));
    const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a), ones);
    const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a), ones);
    return _mm256_add_epi32(plo, _mm256_slli_epi32(phi, 4));
  }
}

// What every row needs of one activation row: each lane's d per register block (8 floats per
// block) and the float32 sums of x per weight group.
struct Q8Prepared {
  const int8_t* q;
  const float* dl;
  const float* sums;
};

// Rows [r0, r0 + kRows) against every prepared activation row, the rows' scales converted once
// (sbuf: kRows rows of gpr + 8 floats) and their weights kept in L1 across activation rows.
template <int kBits, int kGroup, int kRows>
void q8_rows(const QuantMatrix& w, const Q8Prepared* xs, int64_t n_x, int64_t r0, float* y,
             int64_t y_stride, float* sbuf) {
  using L = Q8Layout<kBits>;
  const int64_t wpr = w.cols / L::kPerLane;
  const int64_t gpr = w.cols / kGroup;
  const int64_t n_blocks = (w.cols + L::kValues - 1) / L::kValues;
  const int tail_words = static_cast<int>((w.cols % L::kValues) / L::kPerLane);
  const RowBlocks rows = row_blocks(w, r0);
  prefetch_scales(w, (r0 + kPrefetchGroups * kRows) * gpr, kRows * gpr);
  for (int i = 0; i < kRows; ++i) {
    scales_to_f32(w.scales, w.scale_type, (r0 + i) * gpr, gpr, sbuf + i * (gpr + 8));
    sbuf[i * (gpr + 8) + gpr] = 0.0f;  // read by the pair load of a partial last block
  }
  const char* pf = reinterpret_cast<const char*>(w.packed + (r0 + kPrefetchGroups * kRows) * wpr);
  // Lane i's group within a block (only 4-bit weights in 32-value groups have two per block).
  const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i tail_lanes =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(tail_words), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int64_t t = 0; t < n_x; ++t) {
    const Q8Prepared& x = xs[t];
    __m256 acc[kRows];
    for (int i = 0; i < kRows; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      const bool partial = blk == n_blocks - 1 && tail_words > 0;
      const __m256 d = _mm256_load_ps(x.dl + blk * 8);
      const int64_t g0 = blk * L::kValues / kGroup;
      if (t == 0 && (blk & 1) == 0) {
        for (int i = 0; i < kRows; ++i) _mm_prefetch(pf + (blk / 2 * kRows + i) * 64, _MM_HINT_T0);
      }
      for (int i = 0; i < kRows; ++i) {
        const int32_t* src = reinterpret_cast<const int32_t*>(rows.word(i, blk * 8));
        const __m256i wv = partial ? _mm256_maskload_epi32(src, tail_lanes)
                                   : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        const __m256 dots = _mm256_cvtepi32_ps(lane_dots_q8<kBits>(wv, x.q, blk));
        __m256 sc;
        if constexpr (kGroup >= L::kValues) {
          sc = _mm256_set1_ps(sbuf[i * (gpr + 8) + g0]);
        } else {
          // Two adjacent float scales, broadcast as one 8-byte value (memcpy: the pair need
          // not be 8-byte aligned, which _mm256_broadcast_sd's double load would require).
          double pair;
          std::memcpy(&pair, sbuf + i * (gpr + 8) + g0, sizeof pair);
          const __m256 two = _mm256_castpd_ps(_mm256_set1_pd(pair));
          sc = _mm256_permutevar8x32_ps(two, idx);
        }
        acc[i] = _mm256_fmadd_ps(dots, _mm256_mul_ps(sc, d), acc[i]);
      }
    }
    float* yt = y + t * y_stride;
    for (int i = 0; i < kRows; ++i)
      yt[r0 + i] = hsum(acc[i]) + bias_dot(w.biases, w.scale_type, (r0 + i) * gpr, gpr, x.sums);
  }
}

template <int kBits, int kGroup>
void q8_range(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y, int64_t y_stride,
              int64_t rb, int64_t re) {
  using L = Q8Layout<kBits>;
  thread_local Scratch dl_buf, sum_buf, s_buf;
  // (unique_ptr of a type with internal linkage: no weak symbol leaves this file.)
  thread_local std::unique_ptr<Q8Prepared[]> prepared_buf;
  thread_local int64_t prepared_cap = 0;
  if (prepared_cap < n_x) {
    prepared_buf = std::make_unique<Q8Prepared[]>(static_cast<size_t>(n_x));
    prepared_cap = n_x;
  }
  Q8Prepared* prepared = prepared_buf.get();
  const int64_t gpr = w.cols / kGroup;
  const int64_t n_blocks = (w.cols + L::kValues - 1) / L::kValues;
  const int64_t n_act_blocks = w.cols / kQ8Block;
  float* dl = dl_buf.floats(static_cast<size_t>(n_x * n_blocks * 8));
  float* sums = sum_buf.floats(static_cast<size_t>(n_x * gpr));
  for (int64_t t = 0; t < n_x; ++t) {
    float* dlt = dl + t * n_blocks * 8;
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      for (int i = 0; i < 8; ++i) {
        const int64_t ab = (blk * L::kValues + i * L::kPerLane) / kQ8Block;
        dlt[blk * 8 + i] = ab < n_act_blocks ? xa[t].scale[ab] : 0.0f;
      }
    }
    q8_group_sums(xa[t], kGroup, sums + t * gpr);
    prepared[t] = {xa[t].q, dlt, sums + t * gpr};
  }
  // Each row's scales plus 8 spare floats, so a pair load at the last group stays inside.
  float* sbuf = s_buf.floats(static_cast<size_t>(4 * (gpr + 8)));
  for_row_tiles(
      w, rb, re,
      [&](int64_t r) { q8_rows<kBits, kGroup, 4>(w, prepared, n_x, r, y, y_stride, sbuf); },
      [&](int64_t r) { q8_rows<kBits, kGroup, 1>(w, prepared, n_x, r, y, y_stride, sbuf); });
}

void qmatmul_q8_avx2(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y,
                     int64_t y_stride, int64_t rb, int64_t re) {
  with_quant_shape(w, [&]<int kBits, int kGroup>() {
    q8_range<kBits, kGroup>(w, xa, n_x, y, y_stride, rb, re);
  });
}

void qdequant_row_avx2(const QuantMatrix& w, int64_t row, float* out) {
  const int64_t gpr = groups_per_row(w);
  const uint32_t* packed = w.packed + row * words_per_row(w);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask4 = _mm256_set1_epi32(0xf);
  for (int64_t g = 0; g < gpr; ++g) {
    const __m256 s = _mm256_set1_ps(load_scale(w.scales, w.scale_type, row * gpr + g));
    const __m256 b = _mm256_set1_ps(load_scale(w.biases, w.scale_type, row * gpr + g));
    const int64_t c0 = g * w.group_size;
    for (int64_t c = c0; c < c0 + w.group_size; c += 8) {
      __m256i q;
      if (w.bits == 4) {
        // One word holds these 8 elements; shift each lane to its nibble.
        const __m256i word = _mm256_set1_epi32(static_cast<int>(packed[c / 8]));
        q = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), mask4);
      } else {
        q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + c / 4)));
      }
      _mm256_storeu_ps(out + c, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), b));
    }
  }
}

// kRows x kCols dot products of dequantized rows w (row stride ws) with rows of x (stride xs),
// over n columns (a multiple of 8); results to y[t * ys + i].
template <int kRows, int kCols>
void micro_kernel(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y,
                  int64_t ys) {
  __m256 acc[kRows][kCols];
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < kCols; ++t) acc[i][t] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < n; c += 8) {
    __m256 xv[kCols];
    for (int t = 0; t < kCols; ++t) xv[t] = _mm256_loadu_ps(x + t * xs + c);
    for (int i = 0; i < kRows; ++i) {
      const __m256 wv = _mm256_loadu_ps(w + i * ws + c);
      for (int t = 0; t < kCols; ++t) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < kCols; ++t) y[t * ys + i] = hsum(acc[i][t]);
  }
}

template <int kRows>
void micro_rows(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y,
                int64_t ys, int n_cols) {
  switch (n_cols) {
    case 3:
      return micro_kernel<kRows, 3>(w, ws, x, xs, n, y, ys);
    case 2:
      return micro_kernel<kRows, 2>(w, ws, x, xs, n, y, ys);
    default:
      return micro_kernel<kRows, 1>(w, ws, x, xs, n, y, ys);
  }
}

// The previous qmatmul, kept as redwing-bench-prefill's baseline (--avx2-previous): dequantizes
// a panel of up to kPanel weight rows (kept in L2) and multiplies it with every row of X, 4
// weight rows by 3 X rows at a time, each a dot product over the whole row. Its operands (7 rows
// of up to 11 KiB) do not fit in L1 and stream from L2 (about 58% of the FMA peak on Zen 3).
void qmatmul_avx2_row_dots(const QuantMatrix& w, const float* x, int64_t n_x, int64_t xs, float* y,
                           int64_t ys, int64_t rb, int64_t re) {
  constexpr int64_t kPanel = 16;
  const int64_t cols = w.cols;
  thread_local Scratch panel_buf;
  float* panel = panel_buf.floats(static_cast<size_t>(kPanel * cols));
  for (int64_t p0 = rb; p0 < re; p0 += kPanel) {
    const int64_t np = re - p0 < kPanel ? re - p0 : kPanel;
    for (int64_t i = 0; i < np; ++i) qdequant_row_avx2(w, p0 + i, panel + i * cols);
    for (int64_t t0 = 0; t0 < n_x; t0 += 3) {
      const int nt = static_cast<int>(n_x - t0 < 3 ? n_x - t0 : 3);
      const float* xt = x + t0 * xs;
      float* yt = y + t0 * ys + p0;
      int64_t i = 0;
      for (; i + 4 <= np; i += 4)
        micro_rows<4>(panel + i * cols, cols, xt, xs, cols, yt + i, ys, nt);
      for (; i < np; ++i) micro_rows<1>(panel + i * cols, cols, xt, xs, cols, yt + i, ys, nt);
    }
  }
}

// ---- qmatmul: a register- and cache-blocked float32 product ----------------------------------
//
// Y^T = X W^T as an outer-product GEMM. The weights of kPanelRows (16) rows are dequantized
// into a K-major panel: for each column c, the 16 rows' values side by side (pack_panel: 8 words
// of 8 rows transposed, so that shifting one vector by 4 or 8 bits per column gives the next
// column's codes for 8 rows). The micro-kernel then, per column, loads the panel's 2 vectors
// (16 rows) and broadcasts x[t][c] for up to 6 tokens: 12 accumulators of 8 rows x 1 token, 12
// FMAs per 8 loads. K is cut into blocks of kBlockK columns: a block of kBlockRows rows
// (kBlockRows * kBlockK * 4 = 128 KiB of panels) stays in L2, each 16 KiB panel stays in L1
// while the token tiles of a block of kBlockTokens tokens (96 KiB of x) pass over it. Each lane
// sums its (row, token) pair's products in column order within a K block, and the blocks add
// into y in order: a row's result does not depend on the row range or the tile that computed it.
constexpr int kPanelRows = 16;
constexpr int kTileTokens = 6;
constexpr int64_t kBlockK = 256;  // a multiple of every group size, so blocks hold whole groups
constexpr int64_t kBlockRows = 128;
constexpr int64_t kBlockTokens = 96;

// pack_panel reads 16 rows a little at a time, a pattern the hardware prefetchers do not follow,
// and the weights are usually cold (each is read once per product): while a panel's products
// run, fetch into L2 what packing the same rows' next K block will read (after the last K
// block, the next row block's first), words, scales and biases, so that the misses overlap
// the arithmetic instead of stalling the packing.
template <int kBits>
void prefetch_next_panel(const QuantMatrix& w, int64_t r0, int64_t k0, int64_t kc) {
  const bool last = k0 + kc >= w.cols;
  const int64_t pr = last ? r0 + kBlockRows : r0;
  const int64_t pk = last ? 0 : k0 + kc;
  const int64_t pkc = std::min(kBlockK, w.cols - pk);
  const int64_t n_pr = std::min<int64_t>(kPanelRows, w.rows - pr);
  const int64_t wpr = words_per_row(w);
  const int64_t gpr = groups_per_row(w);
  const int64_t scale_bytes = w.scale_type == ScaleType::f32 ? 4 : 2;
  const auto* scales = static_cast<const char*>(w.scales);
  const auto* biases = static_cast<const char*>(w.biases);
  for (int64_t i = 0; i < n_pr; ++i) {
    const auto* p = reinterpret_cast<const char*>(w.packed + (pr + i) * wpr + pk * kBits / 32);
    for (int64_t at = 0; at < pkc * kBits / 8; at += 64) _mm_prefetch(p + at, _MM_HINT_T1);
    const int64_t g = (pr + i) * gpr + pk / w.group_size;
    _mm_prefetch(scales + g * scale_bytes, _MM_HINT_T1);
    _mm_prefetch(biases + g * scale_bytes, _MM_HINT_T1);
  }
}

// Panel of rows [r0, r0 + n_rows) (n_rows <= 16; missing rows are zeros), columns
// [k0, k0 + kc): out[(c - k0) * 16 + i] = s * q + b of row r0 + i, the same float32 value as
// qdequant_row_avx2 (one fused multiply-add).
// Transposes 8 x 8 32-bit words: v[i] word j becomes v[j] word i.
inline void transpose8x8(__m256i* v) {
  const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  v[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
  v[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
  v[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
  v[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
  v[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
  v[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
  v[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
  v[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// The kPerWord columns of one word per row (8 rows: lane i is row i's word) dequantized into the
// panel at o (column stride kPanelRows).
template <int kBits>
inline void dequant_word_columns(__m256i words, __m256 s, __m256 b, float* o) {
  constexpr int kPerWord = 32 / kBits;
  const __m256i mask = _mm256_set1_epi32((1 << kBits) - 1);
#pragma GCC unroll 8
  for (int j = 0; j < kPerWord; ++j) {
    const __m256i q = _mm256_and_si256(_mm256_srli_epi32(words, j * kBits), mask);
    _mm256_store_ps(o + j * kPanelRows, _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), b));
  }
}

// Panel of rows [r0, r0 + n_rows) (n_rows <= 16; missing rows are zeros), columns
// [k0, k0 + kc): out[(c - k0) * 16 + i] = s * q + b of row r0 + i, the same float32 value as
// qdequant_row_avx2 (one fused multiply-add). Per 8 rows, 8 consecutive words of each row are
// loaded and transposed, so that each vector holds one word of every row: shifting it by kBits
// per column gives the next column's 8 codes.
template <int kBits>
void pack_panel(const QuantMatrix& w, int64_t r0, int n_rows, int64_t k0, int64_t kc, float* out) {
  constexpr int kPerWord = 32 / kBits;
  constexpr int64_t kChunk = 8 * kPerWord;  // columns in 8 words
  const int64_t wpr = words_per_row(w);
  const int64_t gpr = groups_per_row(w);
  const int64_t n_groups = kc / w.group_size;
  for (int h = 0; h < kPanelRows / 8; ++h) {
    // Lanes past the last row read the last row's words and get zero scale and bias.
    const uint32_t* row[8];
    alignas(32) float sb[2 * kBlockK / 32][8];  // scales then biases of the block's groups  //
                                                // scales then biases of the block's groups
    for (int i = 0; i < 8; ++i) {
      const bool real = h * 8 + i < n_rows;
      const int64_t r = r0 + std::min(h * 8 + i, n_rows - 1);
      row[i] = w.packed + r * wpr;
      for (int64_t g = 0; g < n_groups; ++g) {
        const int64_t at = r * gpr + k0 / w.group_size + g;
        sb[g][i] = real ? load_scale(w.scales, w.scale_type, at) : 0.0f;
        sb[n_groups + g][i] = real ? load_scale(w.biases, w.scale_type, at) : 0.0f;
      }
    }
    float* o = out + h * 8;
    int64_t c = k0;
    for (; c + kChunk <= k0 + kc; c += kChunk) {
      __m256i v[8];
      for (int i = 0; i < 8; ++i)
        v[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[i] + c / kPerWord));
      transpose8x8(v);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const int64_t col = c + j * kPerWord - k0;
        const int64_t g = col / w.group_size;
        dequant_word_columns<kBits>(v[j], _mm256_load_ps(sb[g]), _mm256_load_ps(sb[n_groups + g]),
                                    o + col * kPanelRows);
      }
    }
    // A block whose width is not a multiple of kChunk (4-bit, 32 columns left): one word per
    // row at a time.
    for (; c < k0 + kc; c += kPerWord) {
      const int64_t col = c - k0;
      const int64_t g = col / w.group_size;
      const __m256i words = _mm256_setr_epi32(
          static_cast<int>(row[0][c / kPerWord]), static_cast<int>(row[1][c / kPerWord]),
          static_cast<int>(row[2][c / kPerWord]), static_cast<int>(row[3][c / kPerWord]),
          static_cast<int>(row[4][c / kPerWord]), static_cast<int>(row[5][c / kPerWord]),
          static_cast<int>(row[6][c / kPerWord]), static_cast<int>(row[7][c / kPerWord]));
      dequant_word_columns<kBits>(words, _mm256_load_ps(sb[g]), _mm256_load_ps(sb[n_groups + g]),
                                  o + col * kPanelRows);
    }
  }
}

// y[t * ys + i] (+)= sum over kc columns of panel[c][i] * x[t * xs + c] for kTokens tokens and
// the panel's 16 rows; only the first n_rows rows are written. add: y holds an earlier K block.
template <int kTokens>
void panel_tile(const float* panel, const float* x, int64_t xs, int64_t kc, float* y, int64_t ys,
                int n_rows, bool add) {
  // Every loop over tokens is unrolled, so the accumulators are indexed by constants only and
  // stay in registers (a variable index anywhere puts the whole array on the stack).
  __m256 acc[kTokens][2];
#pragma GCC unroll 8
  for (int t = 0; t < kTokens; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t c = 0; c < kc; ++c) {
    const __m256 w0 = _mm256_load_ps(panel + c * kPanelRows);
    const __m256 w1 = _mm256_load_ps(panel + c * kPanelRows + 8);
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x + t * xs + c);
      acc[t][0] = _mm256_fmadd_ps(w0, xb, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, xb, acc[t][1]);
    }
  }
  if (n_rows == kPanelRows) {
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) {
      float* yt = y + t * ys;
      __m256 lo = acc[t][0];
      __m256 hi = acc[t][1];
      if (add) {
        lo = _mm256_add_ps(_mm256_loadu_ps(yt), lo);
        hi = _mm256_add_ps(_mm256_loadu_ps(yt + 8), hi);
      }
      _mm256_storeu_ps(yt, lo);
      _mm256_storeu_ps(yt + 8, hi);
    }
    return;
  }
  // The range's last rows: the same sums, stored row by row.
  alignas(32) float part[kTokens][kPanelRows];
#pragma GCC unroll 8
  for (int t = 0; t < kTokens; ++t) {
    _mm256_store_ps(part[t], acc[t][0]);
    _mm256_store_ps(part[t] + 8, acc[t][1]);
  }
  for (int t = 0; t < kTokens; ++t) {
    float* yt = y + t * ys;
    for (int i = 0; i < n_rows; ++i) yt[i] = add ? yt[i] + part[t][i] : part[t][i];
  }
}

void panel_tokens(const float* panel, const float* x, int64_t xs, int64_t kc, float* y, int64_t ys,
                  int n_rows, bool add, int n_tokens) {
  switch (n_tokens) {
    case 6:
      return panel_tile<6>(panel, x, xs, kc, y, ys, n_rows, add);
    case 5:
      return panel_tile<5>(panel, x, xs, kc, y, ys, n_rows, add);
    case 4:
      return panel_tile<4>(panel, x, xs, kc, y, ys, n_rows, add);
    case 3:
      return panel_tile<3>(panel, x, xs, kc, y, ys, n_rows, add);
    case 2:
      return panel_tile<2>(panel, x, xs, kc, y, ys, n_rows, add);
    default:
      return panel_tile<1>(panel, x, xs, kc, y, ys, n_rows, add);
  }
}

template <int kBits>
void qmatmul_blocked(const QuantMatrix& w, const float* x, int64_t n_x, int64_t xs, float* y,
                     int64_t ys, int64_t rb, int64_t re) {
  thread_local Scratch panel_buf;
  float* panels = panel_buf.floats(static_cast<size_t>(kBlockRows * kBlockK));
  for (int64_t m0 = rb; m0 < re; m0 += kBlockRows) {
    const int64_t m1 = std::min(m0 + kBlockRows, re);
    for (int64_t k0 = 0; k0 < w.cols; k0 += kBlockK) {
      const int64_t kc = std::min(kBlockK, w.cols - k0);
      for (int64_t p0 = m0; p0 < m1; p0 += kPanelRows) {
        const int n_rows = static_cast<int>(std::min<int64_t>(kPanelRows, m1 - p0));
        pack_panel<kBits>(w, p0, n_rows, k0, kc, panels + (p0 - m0) * kc);
      }
      for (int64_t b0 = 0; b0 < n_x; b0 += kBlockTokens) {
        const int64_t b1 = std::min(b0 + kBlockTokens, n_x);
        for (int64_t p0 = m0; p0 < m1; p0 += kPanelRows) {
          const int n_rows = static_cast<int>(std::min<int64_t>(kPanelRows, m1 - p0));
          const float* panel = panels + (p0 - m0) * kc;
          if (b0 == 0) prefetch_next_panel<kBits>(w, p0, k0, kc);
          for (int64_t t0 = b0, nt = 0; t0 < b1; t0 += nt) {
            // Tiles of 6 tokens; the last two split evenly when fewer than 4 would be left for
            // the last one (fewer than 8 accumulators cannot hide the FMA latency).
            const int64_t left = b1 - t0;
            nt = left >= kTileTokens + 4 || left <= kTileTokens
                     ? std::min<int64_t>(kTileTokens, left)
                     : (left + 1) / 2;
            panel_tokens(panel, x + t0 * xs + k0, xs, kc, y + t0 * ys + p0, ys, n_rows, k0 > 0,
                         static_cast<int>(nt));
          }
        }
      }
    }
  }
}

void qmatmul_avx2(const QuantMatrix& w, const float* x, int64_t n_x, int64_t xs, float* y,
                  int64_t ys, int64_t rb, int64_t re) {
  if (w.bits == 4)
    qmatmul_blocked<4>(w, x, n_x, xs, y, ys, rb, re);
  else
    qmatmul_blocked<8>(w, x, n_x, xs, y, ys, rb, re);
}

// ---- element-wise --------------------------------------------------------------------------

// exp(x) for x in float range: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p of degree 7
// (Taylor; truncation error below 1e-8 relative), so about 1-2 ulp overall.
inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)),
                    _mm256_set1_ps(-87.3365447505531f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 split hi + lo
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^n, built in two halves so that n = 128 (x near the top of the range) does not overflow
  // the exponent field.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 f1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 f2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

// tanh(v): an odd Taylor polynomial for |v| < 0.3 (where 1 - 2 / (e^2v + 1) would cancel),
// otherwise 1 - 2 / (e^(2|v|) + 1) with v's sign.
inline __m256 tanh_ps(__m256 v) {
  const __m256 sign = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)));
  const __m256 a = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)), v);
  const __m256 e = exp_ps(_mm256_mul_ps(a, _mm256_set1_ps(2.0f)));
  const __m256 large =
      _mm256_sub_ps(_mm256_set1_ps(1.0f),
                    _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  const __m256 a2 = _mm256_mul_ps(a, a);
  __m256 p = _mm256_set1_ps(21844.0f / 6081075.0f);
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1382.0f / 155925.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(62.0f / 2835.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-17.0f / 315.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(2.0f / 15.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1.0f / 3.0f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, a2), a, a);
  const __m256 is_small = _mm256_cmp_ps(a, _mm256_set1_ps(0.3f), _CMP_LT_OQ);
  const __m256 t = _mm256_or_ps(_mm256_blendv_ps(large, small, is_small), sign);
  // NaN in, NaN out, as std::tanh: the clamped exponent would otherwise turn it into +-1 and a
  // broken model into a constant, finite token instead of a non-finite-logits error.
  return _mm256_blendv_ps(t, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

void gelu_tanh_mul_avx2(const float* gate, const float* up, int64_t n, float* out) {
  // 0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)): no cancellation for negative u.
  const __m256 k2 = _mm256_set1_ps(-2.0f * 0.7978845608028654f);
  const __m256 kc = _mm256_set1_ps(0.044715f);
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 u = _mm256_fmadd_ps(kc, g3, g);
    const __m256 e = exp_ps(_mm256_mul_ps(k2, u));
    const __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
  }
  if (i < n) scalar_kernels().gelu_tanh_mul(gate + i, up + i, n - i, out + i);
}

void softcap_avx2(float* x, int64_t n, float cap) {
  const __m256 c = _mm256_set1_ps(cap);
  const __m256 inv = _mm256_set1_ps(1.0f / cap);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv))));
  }
  if (i < n) scalar_kernels().softcap(x + i, n - i, cap);
}

void softmax_avx2(float* x, int64_t n) {
  if (n <= 0) return;
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float m = _mm_cvtss_f32(m4);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  const __m256 mb = _mm256_set1_ps(m);
  __m256 sv = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mb));
    _mm256_storeu_ps(x + i, e);
    sv = _mm256_add_ps(sv, e);
  }
  float sum = hsum(sv);
  for (; i < n; ++i) {
    x[i] = expf(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  const __m256 iv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
  for (; i < n; ++i) x[i] *= inv;
}

void rms_norm_avx2(const float* x, const float* weight, float weight_offset, float eps, int64_t n,
                   float* y) {
  __m256 a0 = _mm256_setzero_ps();
  __m256 a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + i);
    const __m256 v1 = _mm256_loadu_ps(x + i + 8);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    a1 = _mm256_fmadd_ps(v1, v1, a1);
  }
  float ss = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  const __m256 iv = _mm256_set1_ps(inv);
  const __m256 off = _mm256_set1_ps(weight_offset);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), iv);
    if (weight) v = _mm256_mul_ps(v, _mm256_add_ps(off, _mm256_loadu_ps(weight + i)));
    _mm256_storeu_ps(y + i, v);
  }
  for (; i < n; ++i) y[i] = x[i] * inv * (weight ? weight_offset + weight[i] : 1.0f);
}

void rope_neox_avx2(float* x, int64_t n_heads, int64_t head_dim, const float* cos,
                    const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    int64_t j = 0;
    for (; j + 8 <= half; j += 8) {
      const __m256 a = _mm256_loadu_ps(v + j);
      const __m256 b = _mm256_loadu_ps(v + j + half);
      const __m256 c = _mm256_loadu_ps(cos + j);
      const __m256 s = _mm256_loadu_ps(sin + j);
      _mm256_storeu_ps(v + j, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
      _mm256_storeu_ps(v + j + half, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
    }
    for (; j < half; ++j) {
      const float a = v[j];
      const float b = v[j + half];
      v[j] = a * cos[j] - b * sin[j];
      v[j + half] = b * cos[j] + a * sin[j];
    }
  }
}

// ---- dot, axpy, conversions ------------------------------------------------------------------

float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float total = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

float dot_f16_avx2(const float* a, const uint16_t* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_f16x8(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_f16x8(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_f16x8(b + i), s0);
  float total = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) total += a[i] * f16_bits_to_f32(b[i]);
  return total;
}

void axpy_f32_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

void axpy_f16_avx2(float a, const uint16_t* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, load_f16x8(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * f16_bits_to_f32(x[i]);
}

void f32_to_f16_avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = f32_to_f16_bits(x[i]);
}

void f16_to_f32_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16x8(x + i));
  for (; i < n; ++i) y[i] = f16_bits_to_f32(x[i]);
}

void bf16_to_f32_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_bf16x8(x + i));
  for (; i < n; ++i) y[i] = bf16_bits_to_f32(x[i]);
}

// ---- attention over one block of keys ---------------------------------------------------
//
// The tiles of kernels_avx512.cpp at 8 lanes: the generic attention_partial (dispatch.cpp)
// widens each f16 row of K and V once per query head and reloads and stores each head's output
// once per key; these widen a row once for several heads and keep 8 independent accumulators
// in registers (of 16). Head sizes that are not a multiple of 8 end in a part-vector loaded
// through a zero-filled copy.

// Lanes [0, min(lanes, 8)) of row data at element `at`, the rest zero.
template <bool kF16>
inline __m256 load_kv8(const void* base, int64_t at, int lanes) {
  if constexpr (kF16) {
    const uint16_t* p = static_cast<const uint16_t*>(base) + at;
    if (lanes >= 8) return load_f16x8(p);
    alignas(16) uint16_t part[8] = {};
    std::memcpy(part, p, sizeof(uint16_t) * static_cast<size_t>(lanes));
    return load_f16x8(part);
  } else {
    const float* p = static_cast<const float*>(base) + at;
    if (lanes >= 8) return _mm256_loadu_ps(p);
    alignas(32) float part[8] = {};
    std::memcpy(part, p, sizeof(float) * static_cast<size_t>(lanes));
    return _mm256_loadu_ps(part);
  }
}

// The tiles of attention_loops.h at 8 lanes.
struct Avx2AttentionTiles {
  static constexpr int kLanes = 8;

  // Scores of keys [j0, j0 + kKeys) for query heads [h0, h0 + kHeads): one 8-lane accumulator
  // per pair, summed over the head dimension, then reduced.
  template <bool kF16, int kKeys, int kHeads>
  static void score_tile(const float* q, int64_t q_stride, int d, float scale, const void* k,
                         const int64_t* rows, int64_t n, int h0, int64_t j0, float* s) {
    __m256 acc[kKeys][kHeads];
    REDWING_UNROLL
    for (int a = 0; a < kKeys; ++a) {
      REDWING_UNROLL
      for (int h = 0; h < kHeads; ++h) acc[a][h] = _mm256_setzero_ps();
    }
    for (int c = 0; c < d; c += 8) {
      __m256 qv[kHeads];
      REDWING_UNROLL
      for (int h = 0; h < kHeads; ++h) qv[h] = load_kv8<false>(q + (h0 + h) * q_stride, c, d - c);
      REDWING_UNROLL
      for (int a = 0; a < kKeys; ++a) {
        const __m256 kv = load_kv8<kF16>(k, rows[j0 + a] + c, d - c);
        REDWING_UNROLL
        for (int h = 0; h < kHeads; ++h) acc[a][h] = _mm256_fmadd_ps(qv[h], kv, acc[a][h]);
      }
    }
    REDWING_UNROLL
    for (int a = 0; a < kKeys; ++a) {
      REDWING_UNROLL
      for (int h = 0; h < kHeads; ++h) s[(h0 + h) * n + j0 + a] = hsum(acc[a][h]) * scale;
    }
  }

  // Output columns [c0, c0 + 8 kChunks) of query heads [h0, h0 + kHeads): each value row's
  // columns are widened once and added, weighted, to every head's accumulators, key by key (the
  // order of the generic path's axpy calls).
  template <bool kF16, int kHeads, int kChunks>
  static void value_tile(const float* p, int d, const void* v, const int64_t* rows, int64_t n,
                         int h0, int c0, float* o) {
    __m256 acc[kHeads][kChunks];
    REDWING_UNROLL
    for (int h = 0; h < kHeads; ++h) {
      REDWING_UNROLL
      for (int c = 0; c < kChunks; ++c) acc[h][c] = _mm256_setzero_ps();
    }
    for (int64_t j = 0; j < n; ++j) {
      __m256 vv[kChunks];
      REDWING_UNROLL
      for (int c = 0; c < kChunks; ++c) {
        const int col = c0 + 8 * c;
        vv[c] = col < d ? load_kv8<kF16>(v, rows[j] + col, d - col) : _mm256_setzero_ps();
      }
      REDWING_UNROLL
      for (int h = 0; h < kHeads; ++h) {
        const __m256 w = _mm256_set1_ps(p[(h0 + h) * n + j]);
        REDWING_UNROLL
        for (int c = 0; c < kChunks; ++c) acc[h][c] = _mm256_fmadd_ps(w, vv[c], acc[h][c]);
      }
    }
    REDWING_UNROLL
    for (int h = 0; h < kHeads; ++h) {
      REDWING_UNROLL
      for (int c = 0; c < kChunks; ++c) {
        const int col = c0 + 8 * c;
        float* out = o + (h0 + h) * d + col;
        if (col + 8 <= d) {
          _mm256_storeu_ps(out, acc[h][c]);
        } else if (col < d) {
          alignas(32) float part[8];
          _mm256_store_ps(part, acc[h][c]);
          std::memcpy(out, part, sizeof(float) * static_cast<size_t>(d - col));
        }
      }
    }
  }
};

}  // namespace

decltype(KernelTable::qmatmul) avx2_previous_qmatmul() { return qmatmul_avx2_row_dots; }

const KernelTable& avx2_kernels() {
  static const KernelTable table = [] {
    KernelTable t = scalar_kernels();
    t.qmatvec = qmatvec_avx2;
    t.qmatmul = qmatmul_avx2;
    t.qdequant_row = qdequant_row_avx2;
    t.qmatmul_q8 = qmatmul_q8_avx2;
    t.row_groups.qmatvec = t.row_groups.q8 = true;  // qmv_rows and q8_rows read row groups
    t.rms_norm = rms_norm_avx2;
    t.gelu_tanh_mul = gelu_tanh_mul_avx2;
    t.softcap = softcap_avx2;
    t.rope_neox = rope_neox_avx2;
    t.dot_f32 = dot_f32_avx2;
    t.dot_f16 = dot_f16_avx2;
    t.axpy_f32 = axpy_f32_avx2;
    t.axpy_f16 = axpy_f16_avx2;
    t.f32_to_f16 = f32_to_f16_avx2;
    t.f16_to_f32 = f16_to_f32_avx2;
    t.bf16_to_f32 = bf16_to_f32_avx2;
    t.softmax = softmax_avx2;
    t.attention_scores = AttentionLoops<Avx2AttentionTiles>::scores;
    t.attention_values = AttentionLoops<Avx2AttentionTiles>::values;
    return t;
  }();
  return table;
}

}  // namespace redwing::cpu
