// AVX-512 VNNI version of the 8-bit-activation product (qmatvec_q8 and qmatmul_q8, kernels.h):
// vpdpbusd multiplies 64 unsigned weight codes (4-bit nibbles or 8-bit bytes) by 64 signed int8
// activations and adds each group of four products into an int32 lane, so 128 4-bit weights
// cost two masks, two dot products, one conversion and one FMA per row, against 8 times (mask,
// conversion, FMA) on the float32 path. dispatch.cpp puts it in the avx512 table when the CPU
// has AVX512_VNNI; without it that table keeps the AVX2 version.
//
// Compiled without extra flags like kernels_avx512.cpp: the target pragma below enables the
// instructions for the functions defined after it, and the standard headers come first.
#if defined(REDWING_HAVE_AVX2)

#include <cstdint>
#include <memory>

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

constexpr int kPrefetchGroups = 2;  // row groups ahead, as in kernels_avx512.cpp

inline int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

// What every row needs of one activation row: each lane's d per register block (16 floats per
// block) and the float32 sums of x per weight group (zero-padded to 16).
struct Q8Prepared {
  const int8_t* q;
  const float* dl;
  const float* sums;
};

// Rows [r0, r0 + kRows) against every prepared activation row. The rows' scales and biases are
// converted once (sbuf, bbuf: kRows rows of pad16(gpr) + 16 floats, zero past gpr) and their
// packed weights stay in L1 while each activation row goes by, so a prefill chunk reads the
// weights from memory once.
template <int kBits, int kGroup, int kRows>
void q8_rows(const QuantMatrix& w, const Q8Prepared* xs, int64_t n_x, int64_t r0, float* y,
             int64_t y_stride, float* sbuf, float* bbuf) {
  using L = Q8Layout<kBits>;
  const int64_t wpr = w.cols / L::kPerLane;
  const int64_t gpr = w.cols / kGroup;
  const int64_t stride = pad16(gpr) + 16;
  const int64_t n_blocks = (w.cols + L::kValues - 1) / L::kValues;
  const int tail_words = static_cast<int>((w.cols % L::kValues) / L::kPerLane);
  const uint32_t* rows[kRows];
  for (int i = 0; i < kRows; ++i) {
    const int64_t first = (r0 + i) * gpr;
    for (int64_t g = 0; g < stride; g += 16) {
      const __mmask16 lanes = g < gpr ? first_lanes(gpr - g) : static_cast<__mmask16>(0);
      _mm512_storeu_ps(sbuf + i * stride + g,
                       load_scales16(w.scales, w.scale_type, first + g, lanes));
      _mm512_storeu_ps(bbuf + i * stride + g,
                       load_scales16(w.biases, w.scale_type, first + g, lanes));
    }
    rows[i] = w.packed + (r0 + i) * wpr;
  }
  const char* pf = reinterpret_cast<const char*>(w.packed + (r0 + kPrefetchGroups * kRows) * wpr);
  alignas(64) int32_t lane_group[16];
  for (int i = 0; i < 16; ++i) lane_group[i] = kGroup >= L::kValues ? 0 : i * L::kPerLane / kGroup;
  const __m512i idx = _mm512_load_si512(lane_group);
  for (int64_t t = 0; t < n_x; ++t) {
    const Q8Prepared& x = xs[t];
    __m512 acc[kRows];
    for (int i = 0; i < kRows; ++i) {
      // The bias part: b_g times the float32 sum of x over group g, lane-wise.
      __m512 b = _mm512_setzero_ps();
      for (int64_t g = 0; g < gpr; g += 16)
        b = _mm512_fmadd_ps(_mm512_loadu_ps(bbuf + i * stride + g), _mm512_load_ps(x.sums + g), b);
      acc[i] = b;
    }
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      const bool partial = blk == n_blocks - 1 && tail_words > 0;
      const __mmask16 lanes = partial ? first_lanes(tail_words) : static_cast<__mmask16>(0xffff);
      const int8_t* a = x.q + blk * (kBits == 4 ? 128 : 64);
      const __m512 d = _mm512_load_ps(x.dl + blk * 16);
      const int64_t g0 = blk * L::kValues / kGroup;
      for (int i = 0; i < kRows; ++i) {
        if (t == 0) _mm_prefetch(pf + (blk * kRows + i) * 64, _MM_HINT_T0);
        const __m512i wv = partial ? _mm512_maskz_loadu_epi32(lanes, rows[i] + blk * 16)
                                   : _mm512_loadu_si512(rows[i] + blk * 16);
        const __m512 dots = _mm512_cvtepi32_ps(lane_dots<kBits>(wv, a));
        __m512 s;
        if constexpr (kGroup >= L::kValues) {
          s = _mm512_set1_ps(sbuf[i * stride + g0]);
        } else {
          s = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(sbuf + i * stride + g0));
        }
        acc[i] = _mm512_fmadd_ps(dots, _mm512_mul_ps(s, d), acc[i]);
      }
    }
    float* yt = y + t * y_stride;
    if constexpr (kRows == 4) {
      _mm_storeu_ps(yt + r0, reduce4(acc[0], acc[1], acc[2], acc[3]));
    } else {
      for (int i = 0; i < kRows; ++i) yt[r0 + i] = _mm512_reduce_add_ps(acc[i]);
    }
  }
}

template <int kBits, int kGroup>
void q8_range(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y, int64_t y_stride,
              int64_t rb, int64_t re) {
  using L = Q8Layout<kBits>;
  thread_local Scratch dl_buf, sum_buf, s_buf, b_buf;
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
  int64_t r = rb;
  for (; r + 4 <= re; r += 4)
    q8_rows<kBits, kGroup, 4>(w, prepared, n_x, r, y, y_stride, sbuf, bbuf);
  for (; r < re; ++r) q8_rows<kBits, kGroup, 1>(w, prepared, n_x, r, y, y_stride, sbuf, bbuf);
}

void qmatmul_q8_vnni(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y,
                     int64_t y_stride, int64_t rb, int64_t re) {
  with_quant_shape(w, [&]<int kBits, int kGroup>() {
    q8_range<kBits, kGroup>(w, xa, n_x, y, y_stride, rb, re);
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
}  // namespace redwing::cpu

#endif  // REDWING_HAVE_AVX2
