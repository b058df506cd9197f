// AVX-512 VNNI version of the 8-bit-activation product (qmatvec_q8 and qmatmul_q8, kernels.h):
// vpdpbusd multiplies 64 unsigned weight codes (4-bit nibbles or 8-bit bytes) by 64 signed int8
// activations and adds each group of four products into an int32 lane, so 128 4-bit weights
// cost two masks, two dot products, one conversion and one FMA per row, against 8 times (mask,
// conversion, FMA) on the float32 path. dispatch.cpp puts it in the avx512 table when the CPU
// has AVX512_VNNI; without it that table keeps the AVX2 version.
//
// The same rows loop also runs qmatvec's exact integer method (kernels.h): x as 24-bit integers
// in three byte limbs instead of one int8 byte, with a power-of-two unit per lane in place of d
// (x24_block, prepare_x24, lane_dots_x24 and qmatvec_x24_prepared).
//
// Compiled without extra flags like kernels_avx512.cpp: the target pragma below enables the
// instructions for the functions defined after it, and the standard headers come first.
#if defined(REDWING_HAVE_AVX2)

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "backend/cpu/kernels_impl.h"

#if defined(__clang__)
#pragma clang attribute push(                                                               \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "backend/cpu/avx512_common.h"

namespace redwing::cpu {
namespace {

// One 64-byte register of packed weights covers kValues values: lane i (one uint32 word) holds
// values [i * kPerLane, (i + 1) * kPerLane).
template <int kBits>
struct Q8Layout {
  static constexpr int kPerLane = 32 / kBits;
  static constexpr int kValues = 16 * kPerLane;
};

// The int32 sums of q * a8 per lane for one register of weights.
template <int kBits>
inline __m512i lane_dots(__m512i wv, const int8_t* a) {
  if constexpr (kBits == 4) {
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    const __m512i lo = _mm512_and_si512(wv, nibble);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nibble);
    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(a));
    return _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(a + 64));
  } else {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(a));
  }
}

// The exact int32 sums of q * X per lane for one register of 4-bit weights, X the 24-bit
// integers of x24_block (below): X = 65536 * top + 256 * mid + low, top signed, mid and low
// unsigned bytes. vpdpbusd multiplies unsigned by signed bytes, so the codes (0..15, valid as
// either) are the unsigned operand against the top bytes and the signed one against the others.
// Horner's rule: each partial sum moves up a byte before the next limb adds in. A lane holds 8
// products, |sum| <= 8 * 15 * 2^23 < 2^31: no step overflows.
inline __m512i lane_dots_x24(__m512i wv, const int8_t* a) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  // Each dword moved up one byte (times 256) by a byte shuffle: port 5, beside the dot
  // products' port 0.
  const __m512i up8 = _mm512_set4_epi32(0x0e0d0c80, 0x0a090880, 0x06050480, 0x02010080);
  const __m512i lo = _mm512_and_si512(wv, nibble);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nibble);
  __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(a));
  t = _mm512_dpbusd_epi32(t, hi, _mm512_load_si512(a + 64));
  t = _mm512_shuffle_epi8(t, up8);
  t = _mm512_dpbusd_epi32(t, _mm512_load_si512(a + 128), lo);
  t = _mm512_dpbusd_epi32(t, _mm512_load_si512(a + 192), hi);
  t = _mm512_shuffle_epi8(t, up8);
  t = _mm512_dpbusd_epi32(t, _mm512_load_si512(a + 256), lo);
  return _mm512_dpbusd_epi32(t, _mm512_load_si512(a + 320), hi);
}

// Row r's scales and biases as float32 (stride floats each, zero past its gpr groups), so that a
// product converts them once per row and gathers them per block with lane_groups.
inline void row_scales_f32(const QuantMatrix& w, int64_t r, int64_t gpr, int64_t stride, float* s,
                           float* b) {
  const int64_t first = r * gpr;
  for (int64_t g = 0; g < stride; g += 16) {
    const __mmask16 lanes = g < gpr ? first_lanes(gpr - g) : static_cast<__mmask16>(0);
    _mm512_storeu_ps(s + g, load_scales16(w.scales, w.scale_type, first + g, lanes));
    _mm512_storeu_ps(b + g, load_scales16(w.biases, w.scale_type, first + g, lanes));
  }
}

// Lane i's group within a register block of 16 lanes of kPerLane values (0 for every lane when a
// group spans the block): the index that gathers the lanes' scales from a block's first group.
template <int kPerLane, int kGroup>
inline __m512i lane_groups() {
  alignas(64) int32_t lane_group[16];
  for (int i = 0; i < 16; ++i) lane_group[i] = kGroup >= 16 * kPerLane ? 0 : i * kPerLane / kGroup;
  return _mm512_load_si512(lane_group);
}

// Each lane's scale for a register block whose first group's scale is at first (a row's scales
// as float32, row_scales_f32): lane i takes first[lane_groups' i], and those indices are under
// 4 (a block spans at most 4 groups of 32), so 4 floats are read.
inline __m512 block_scales(__m512i idx, const float* first) {
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps(first)));
}

// The lane sum of one vector in reduce4's order, so that a row's sum has the same bits whether
// it was reduced alone or with three others.
inline float reduce1(__m512 a) {
  const __m512 z = _mm512_setzero_ps();
  return _mm_cvtss_f32(reduce4(a, z, z, z));
}

inline int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

// What every row needs of one activation row: each lane's d per register block (16 floats per
// block; the integer method's units) and the float32 sums of x per weight group (zero-padded to
// 16). q is the int8 activations, or the integer method's limbs (384 bytes per block).
struct Q8Prepared {
  const int8_t* q;
  const float* dl;
  const float* sums;
};

// Rows [r0, r0 + kRows) against every prepared activation row. The rows' scales and biases are
// converted once (sbuf, bbuf: row i at i * (pad16(gpr) + 16), pad16(gpr) floats written, zero
// past gpr) and their packed weights stay in L1 while each activation row goes by, so a prefill
// chunk reads the weights from memory once. kX24: the integer method's limbs (4-bit weights, one
// x row).
template <int kBits, int kGroup, int kRows, bool kX24 = false>
void q8_rows(const QuantMatrix& w, const Q8Prepared* xs, int64_t n_x, int64_t r0, float* y,
             int64_t y_stride, float* sbuf, float* bbuf) {
  using L = Q8Layout<kBits>;
  const int64_t wpr = w.cols / L::kPerLane;
  const int64_t gpr = w.cols / kGroup;
  const int64_t stride = pad16(gpr) + 16;
  const int64_t n_blocks = (w.cols + L::kValues - 1) / L::kValues;
  const int tail_words = static_cast<int>((w.cols % L::kValues) / L::kPerLane);
  const RowBlocks rows = row_blocks(w, r0);
  prefetch_scales(w, (r0 + kPrefetchGroups * kRows) * gpr, kRows * gpr);
  // Each row's scales as float32 into sbuf, 16 groups at a time up to pad16(gpr): a block reads
  // at most 4 of them from its first group on (block_scales), and the lanes of a partial last
  // block that pick groups past gpr find the zeros the masked conversion wrote there. The biases
  // go to bbuf likewise for several x rows; for one (decode) they go straight into the row's
  // bias part instead: the same products in the same order, without a store and a reload. Short
  // rows gain most: an expert's 704-column down row (11 groups) converted 2 x 32 floats before
  // (pad16(gpr) + 16, for 16-float loads at any group) and stored and reloaded its biases.
  const bool one_x = n_x == 1;
  __m512 bias_part[kRows];
  for (int i = 0; i < kRows; ++i) {
    const int64_t first = (r0 + i) * gpr;
    __m512 b = _mm512_setzero_ps();
    for (int64_t g = 0; g < gpr; g += 16) {
      const __mmask16 lanes = first_lanes(gpr - g);
      _mm512_storeu_ps(sbuf + i * stride + g,
                       load_scales16(w.scales, w.scale_type, first + g, lanes));
      const __m512 bias = load_scales16(w.biases, w.scale_type, first + g, lanes);
      if (one_x)
        b = _mm512_fmadd_ps(bias, _mm512_load_ps(xs[0].sums + g), b);
      else
        _mm512_storeu_ps(bbuf + i * stride + g, bias);
    }
    bias_part[i] = b;
  }
  const char* pf = reinterpret_cast<const char*>(w.packed + (r0 + kPrefetchGroups * kRows) * wpr);
  const __m512i idx = lane_groups<L::kPerLane, kGroup>();
  for (int64_t t = 0; t < n_x; ++t) {
    const Q8Prepared& x = xs[t];
    __m512 acc[kRows];
    for (int i = 0; i < kRows; ++i) {
      // The bias part: b_g times the float32 sum of x over group g, lane-wise.
      __m512 b = bias_part[i];
      if (!one_x)
        for (int64_t g = 0; g < gpr; g += 16)
          b = _mm512_fmadd_ps(_mm512_loadu_ps(bbuf + i * stride + g), _mm512_load_ps(x.sums + g),
                              b);
      acc[i] = b;
    }
    // Register block blk of the rows, row i's words at p + i * rs: the full blocks in a loop
    // whose row offsets stay put, then the partial last one (masked), so that no block pays for
    // picking its addresses (RowBlocks::at) or its kind.
    auto block = [&](auto partial, int64_t blk, const uint32_t* p, int64_t rs) {
      const int8_t* a = x.q + blk * (kX24 ? 384 : kBits == 4 ? 128 : 64);
      const __m512 d = _mm512_load_ps(x.dl + blk * 16);
      const int64_t g0 = blk * L::kValues / kGroup;
      REDWING_UNROLL
      for (int i = 0; i < kRows; ++i) {
        if (t == 0) _mm_prefetch(pf + (blk * kRows + i) * 64, _MM_HINT_T0);
        __m512i wv;
        if constexpr (decltype(partial)::value) {
          wv = _mm512_maskz_loadu_epi32(first_lanes(tail_words), p + i * rs);
        } else {
          wv = _mm512_loadu_si512(p + i * rs);
        }
        __m512 dots;
        if constexpr (kX24) {
          dots = _mm512_cvtepi32_ps(lane_dots_x24(wv, a));
        } else {
          dots = _mm512_cvtepi32_ps(lane_dots<kBits>(wv, a));
        }
        __m512 s;
        if constexpr (kGroup >= L::kValues) {
          s = _mm512_set1_ps(sbuf[i * stride + g0]);
        } else {
          s = block_scales(idx, sbuf + i * stride + g0);
        }
        acc[i] = _mm512_fmadd_ps(dots, _mm512_mul_ps(s, d), acc[i]);
      }
    };
    const int64_t full_blocks = n_blocks - (tail_words > 0 ? 1 : 0);
    const uint32_t* p = rows.at(0, 0);
    for (int64_t blk = 0; blk < full_blocks; ++blk, p += rows.blk_stride)
      block(std::false_type{}, blk, p, rows.row_stride);
    if (tail_words > 0)
      block(std::true_type{}, full_blocks, rows.at(full_blocks, 0), rows.tail_stride);
    float* yt = y + t * y_stride;
    if constexpr (kRows == 4) {
      _mm_storeu_ps(yt + r0, reduce4(acc[0], acc[1], acc[2], acc[3]));
    } else {
      for (int i = 0; i < kRows; ++i) yt[r0 + i] = reduce1(acc[i]);
    }
  }
}

// This thread's array of at least n prepared rows, kept between calls. (A unique_ptr of a type
// with internal linkage: no weak symbol leaves this file.)
Q8Prepared* prepared_rows(int64_t n) {
  thread_local std::unique_ptr<Q8Prepared[]> buf;
  thread_local int64_t cap = 0;
  if (cap < n) {
    buf = std::make_unique<Q8Prepared[]>(static_cast<size_t>(n));
    cap = n;
  }
  return buf.get();
}

template <int kBits, int kGroup>
void q8_range(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y, int64_t y_stride,
              int64_t rb, int64_t re) {
  using L = Q8Layout<kBits>;
  thread_local Scratch dl_buf, sum_buf, s_buf, b_buf;
  Q8Prepared* prepared = prepared_rows(n_x);
  const int64_t gpr = w.cols / kGroup;
  const int64_t n_blocks = (w.cols + L::kValues - 1) / L::kValues;
  const int64_t n_act_blocks = w.cols / kQ8Block;
  float* dl = dl_buf.floats(static_cast<size_t>(n_x * n_blocks * 16));
  float* sums = sum_buf.floats(static_cast<size_t>(n_x * pad16(gpr)));
  for (int64_t t = 0; t < n_x; ++t) {
    float* dlt = dl + t * n_blocks * 16;
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      for (int i = 0; i < 16; ++i) {
        const int64_t ab = (blk * L::kValues + i * L::kPerLane) / kQ8Block;
        dlt[blk * 16 + i] = ab < n_act_blocks ? xa[t].scale[ab] : 0.0f;
      }
    }
    float* st = sums + t * pad16(gpr);
    q8_group_sums(xa[t], kGroup, st);
    for (int64_t g = gpr; g < pad16(gpr); ++g) st[g] = 0.0f;
    prepared[t] = {xa[t].q, dlt, st};
  }
  const size_t sb = static_cast<size_t>(4 * (pad16(gpr) + 16));
  float* sbuf = s_buf.floats(sb);
  float* bbuf = b_buf.floats(sb);
  for_row_tiles(
      w, rb, re,
      [&](int64_t r) { q8_rows<kBits, kGroup, 4>(w, prepared, n_x, r, y, y_stride, sbuf, bbuf); },
      [&](int64_t r) { q8_rows<kBits, kGroup, 1>(w, prepared, n_x, r, y, y_stride, sbuf, bbuf); });
}

void qmatmul_q8_vnni(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y,
                     int64_t y_stride, int64_t rb, int64_t re) {
  with_quant_shape(w, [&]<int kBits, int kGroup>() {
    q8_range<kBits, kGroup>(w, xa, n_x, y, y_stride, rb, re);
  });
}

// ---- the exact decode product on integer dot products (qmatvec_x24, kernels.h) ------------

// Block b of x (128 values, 16 lanes of 8) as x24 stores it: lane i holds values
// [128 b + 8 i, 128 b + 8 i + 8) as 24-bit integers X = x / e_i, e_i a power of two chosen from
// the lane's largest |x| so that |X| < 2^23. Limbs, 64 bytes each: top (signed) even, top odd,
// mid even, mid odd, low even, low odd; "even" holds values 8i, 8i+2, 8i+4, 8i+6 in the bytes
// of dword i, "odd" 8i+1, ..., 8i+7 (the nibble order of lane_dots_x24). Returns false if the
// block holds inf or NaN (the caller then takes the float32 path, which propagates them).
inline bool x24_block(const float* x, int64_t valid_lanes, int8_t* out, float* e_out) {
  const __mmask16 lanes = first_lanes(valid_lanes);
  const __m512i base =
      _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
  __m512 v[8];
  __m512 mx = _mm512_setzero_ps();
  __mmask16 bad = 0;
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  for (int k = 0; k < 8; ++k) {
    v[k] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes,
                                    _mm512_add_epi32(base, _mm512_set1_epi32(k)), x, 4);
    const __m512 a = _mm512_abs_ps(v[k]);
    bad |= _mm512_cmp_ps_mask(a, inf, _CMP_NLT_UQ);  // inf or NaN
    mx = _mm512_max_ps(mx, a);
  }
  if (bad) return false;
  // floor(log2(max)) per lane; lanes of zeros (and the padding) take 0, and tiny lanes are
  // clamped so that the unit 2^(floor - 22) stays a normal float (a lane under 2^-100 keeps
  // fewer bits; values under 2^-123 become zero).
  const __mmask16 nonzero = _mm512_cmp_ps_mask(mx, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512 fl = _mm512_max_ps(_mm512_maskz_getexp_ps(nonzero, mx), _mm512_set1_ps(-100.0f));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 up = _mm512_scalef_ps(one, _mm512_sub_ps(_mm512_set1_ps(22.0f), fl));
  _mm512_store_ps(e_out, _mm512_scalef_ps(one, _mm512_sub_ps(fl, _mm512_set1_ps(22.0f))));
  // max < 2^(fl + 1), so |x * up| < 2^23; rounding may reach 2^23 itself, which is clamped.
  __m512i q[8];
  for (int k = 0; k < 8; ++k) {
    const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v[k], up));
    q[k] = _mm512_max_epi32(_mm512_min_epi32(r, _mm512_set1_epi32((1 << 23) - 1)),
                            _mm512_set1_epi32(-(1 << 23)));
  }
  // Limb m of the even (h = 0) or odd (h = 1) values: byte m of q[2j + h] into byte j.
  for (int m = 0; m < 3; ++m) {
    for (int h = 0; h < 2; ++h) {
      __m512i acc = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        const __m512i src = q[2 * j + h];
        const int move = 8 * j - 8 * (2 - m);  // limb m is byte 2 - m of X
        const __m512i moved = move > 0   ? _mm512_slli_epi32(src, static_cast<unsigned>(move))
                              : move < 0 ? _mm512_srli_epi32(src, static_cast<unsigned>(-move))
                                         : src;
        // (moved & mask) | acc
        acc = _mm512_ternarylogic_epi32(moved, _mm512_set1_epi32(0xff << (8 * j)), acc, 0xea);
      }
      _mm512_store_si512(out + (2 * m + h) * 64, acc);
    }
  }
  return true;
}

inline int64_t x24_blocks(int64_t cols) { return (cols + 127) / 128; }

// Lane exponents, limbs and group sums of x for 4-bit products; false on inf or NaN.
bool prepare_x24(const float* x, int64_t cols, int group, int8_t* limbs, float* e, float* sums) {
  const int64_t n_blocks = x24_blocks(cols);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t lanes = std::min<int64_t>(16, (cols - 128 * b) / 8);
    if (!x24_block(x + 128 * b, lanes, limbs + 384 * b, e + 16 * b)) return false;
  }
  const int64_t gpr = cols / group;
  group_sums(x, cols, group, sums);
  for (int64_t g = gpr; g < pad16(gpr); ++g) sums[g] = 0.0f;
  return true;
}

void qmatvec_x24_prepared(const QuantMatrix& w, const int8_t* limbs, const float* e,
                          const float* sums, float* y, int64_t rb, int64_t re) {
  thread_local Scratch s_buf, b_buf;
  const int64_t gpr = w.cols / w.group_size;
  const Q8Prepared prepared{limbs, e, sums};
  const size_t sb = static_cast<size_t>(4 * (pad16(gpr) + 16));
  float* sbuf = s_buf.floats(sb);
  float* bbuf = b_buf.floats(sb);
  with_quant_shape(w, [&]<int kBits, int kGroup>() {
    if constexpr (kBits == 4) {
      for_row_tiles(
          w, rb, re,
          [&](int64_t r) { q8_rows<4, kGroup, 4, true>(w, &prepared, 1, r, y, 0, sbuf, bbuf); },
          [&](int64_t r) { q8_rows<4, kGroup, 1, true>(w, &prepared, 1, r, y, 0, sbuf, bbuf); });
    }
  });
}

// ---- the exact prefill product on integer dot products (qmatmul_x24, kernels.h) ----------
//
// qmatvec_x24's arithmetic for kR weight rows and kT tokens at a time: a block's nibbles are
// unpacked and its scales gathered once for the kT tokens, and a token's limbs loaded once for
// the kR rows, so that the six dot products of a (row, token, block) are most of the work.
// Each (row, token) takes exactly the operations q8_rows<4, kGroup, kRows, true> does (the bias
// part, then one FMA per block in block order, then reduce4's sum), so its bits do not depend on
// kR, kT or the call's token count.
template <int kGroup, int kR, int kT>
inline void x24_tile(const RowBlocks& rows, const float* sbuf, const float* bbuf, int64_t stride,
                     const Q8Prepared* xs, int64_t n_blocks, int tail_words, int64_t gpr,
                     __m512i idx, float* y, int64_t y_stride, int64_t r0) {
  __m512 acc[kR][kT];
  REDWING_UNROLL
  for (int t = 0; t < kT; ++t) {
    REDWING_UNROLL
    for (int i = 0; i < kR; ++i) {
      __m512 b = _mm512_setzero_ps();
      for (int64_t g = 0; g < gpr; g += 16)
        b = _mm512_fmadd_ps(_mm512_loadu_ps(bbuf + i * stride + g), _mm512_load_ps(xs[t].sums + g),
                            b);
      acc[i][t] = b;
    }
  }
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const __m512i up8 = _mm512_set4_epi32(0x0e0d0c80, 0x0a090880, 0x06050480, 0x02010080);
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const bool partial = blk == n_blocks - 1 && tail_words > 0;
    const __mmask16 lanes = partial ? first_lanes(tail_words) : static_cast<__mmask16>(0xffff);
    const int64_t g0 = blk * 128 / kGroup;
    __m512i lo[kR], hi[kR];
    __m512 s[kR];
    REDWING_UNROLL
    for (int i = 0; i < kR; ++i) {
      const __m512i wv = partial ? _mm512_maskz_loadu_epi32(lanes, rows.at(blk, i))
                                 : _mm512_loadu_si512(rows.at(blk, i));
      lo[i] = _mm512_and_si512(wv, nibble);
      hi[i] = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nibble);
      if constexpr (kGroup >= 128) {
        s[i] = _mm512_set1_ps(sbuf[i * stride + g0]);
      } else {
        s[i] = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(sbuf + i * stride + g0));
      }
    }
    REDWING_UNROLL
    for (int t = 0; t < kT; ++t) {
      const int8_t* a = xs[t].q + blk * 384;
      const __m512i top_even = _mm512_load_si512(a);
      const __m512i top_odd = _mm512_load_si512(a + 64);
      const __m512i mid_even = _mm512_load_si512(a + 128);
      const __m512i mid_odd = _mm512_load_si512(a + 192);
      const __m512i low_even = _mm512_load_si512(a + 256);
      const __m512i low_odd = _mm512_load_si512(a + 320);
      const __m512 e = _mm512_load_ps(xs[t].dl + blk * 16);
      REDWING_UNROLL
      for (int i = 0; i < kR; ++i) {
        // lane_dots_x24, with the unpacked nibbles and the limbs shared.
        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], top_even);
        d = _mm512_dpbusd_epi32(d, hi[i], top_odd);
        d = _mm512_shuffle_epi8(d, up8);
        d = _mm512_dpbusd_epi32(d, mid_even, lo[i]);
        d = _mm512_dpbusd_epi32(d, mid_odd, hi[i]);
        d = _mm512_shuffle_epi8(d, up8);
        d = _mm512_dpbusd_epi32(d, low_even, lo[i]);
        d = _mm512_dpbusd_epi32(d, low_odd, hi[i]);
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s[i], e), acc[i][t]);
      }
    }
  }
  REDWING_UNROLL
  for (int t = 0; t < kT; ++t) {
    float* yt = y + t * y_stride + r0;
    if constexpr (kR == 4) {
      _mm_storeu_ps(yt, reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
    } else {
      REDWING_UNROLL
      for (int i = 0; i < kR; ++i) yt[i] = reduce1(acc[i][t]);
    }
  }
}

// Tokens per tile: their limbs (384 bytes per 128 columns) stay in the L2 cache while every row
// group of the range goes by, and each row group's weights stay in L1 across the tile.
constexpr int64_t kX24TokenTile = 48;
constexpr int kX24Rows = 4;    // weight rows per register tile (for_row_tiles' quads)
constexpr int kX24Tokens = 2;  // tokens per register tile

template <int kGroup>
void x24_rows_range(const QuantMatrix& w, const Q8Prepared* xs, int64_t n_x, float* y,
                    int64_t y_stride, int64_t rb, int64_t re) {
  thread_local Scratch s_buf, b_buf;
  const int64_t gpr = w.cols / kGroup;
  const int64_t stride = pad16(gpr) + 16;
  const int64_t n_blocks = (w.cols + 127) / 128;
  const int tail_words = static_cast<int>((w.cols % 128) / 8);
  float* sbuf = s_buf.floats(static_cast<size_t>(kX24Rows * stride));
  float* bbuf = b_buf.floats(static_cast<size_t>(kX24Rows * stride));
  const __m512i idx = lane_groups<8, kGroup>();
  for (int64_t t0 = 0; t0 < n_x; t0 += kX24TokenTile) {
    const int64_t t_end = std::min(n_x, t0 + kX24TokenTile);
    for_row_tiles(
        w, rb, re,
        [&](int64_t r0) {
          for (int i = 0; i < kX24Rows; ++i)
            row_scales_f32(w, r0 + i, gpr, stride, sbuf + i * stride, bbuf + i * stride);
          const RowBlocks rows = row_blocks(w, r0);
          int64_t t = t0;
          for (; t + kX24Tokens <= t_end; t += kX24Tokens)
            x24_tile<kGroup, kX24Rows, kX24Tokens>(rows, sbuf, bbuf, stride, xs + t, n_blocks,
                                                   tail_words, gpr, idx, y + t * y_stride, y_stride,
                                                   r0);
          for (; t < t_end; ++t)
            x24_tile<kGroup, kX24Rows, 1>(rows, sbuf, bbuf, stride, xs + t, n_blocks, tail_words,
                                          gpr, idx, y + t * y_stride, y_stride, r0);
        },
        [&](int64_t r) {
          row_scales_f32(w, r, gpr, stride, sbuf, bbuf);
          for (int64_t t = t0; t < t_end; ++t)
            x24_tile<kGroup, 1, 1>(row_blocks(w, r), sbuf, bbuf, stride, xs + t, n_blocks,
                                   tail_words, gpr, idx, y + t * y_stride, y_stride, r);
        });
  }
}

void qmatmul_x24_prepared(const QuantMatrix& w, const int8_t* limbs, int64_t limb_stride,
                          const float* units, int64_t unit_stride, const float* sums,
                          int64_t sum_stride, int64_t n_x, float* y, int64_t y_stride, int64_t rb,
                          int64_t re) {
  Q8Prepared* xs = prepared_rows(n_x);
  for (int64_t t = 0; t < n_x; ++t)
    xs[t] = {limbs + t * limb_stride, units + t * unit_stride, sums + t * sum_stride};
  with_quant_shape(w, [&]<int kBits, int kGroup>() {
    if constexpr (kBits == 4) x24_rows_range<kGroup>(w, xs, n_x, y, y_stride, rb, re);
  });
}

}  // namespace
}  // namespace redwing::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace redwing::cpu {
// Outside the target region: handing out the pointer must not need the instructions.
Q8Kernel avx512_vnni_qmatmul_q8() { return qmatmul_q8_vnni; }
X24Kernels avx512_vnni_x24() { return {prepare_x24, qmatvec_x24_prepared, qmatmul_x24_prepared}; }
}  // namespace redwing::cpu

#endif  // REDWING_HAVE_AVX2
