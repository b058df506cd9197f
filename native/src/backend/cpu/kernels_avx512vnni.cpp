// AVX-512 VNNI version of the 8-bit-activation product (qmatvec_q8, kernels.h): vpdpbusd
// multiplies 64 unsigned weight codes (4-bit nibbles or 8-bit bytes) by 64 signed int8
// activations and adds each group of four products into an int32 lane, so 128 4-bit weights
// cost two masks, two dot products, one conversion and one FMA per row, against 8 times (mask,
// conversion, FMA) on the float32 path. dispatch.cpp puts it in the avx512 table when the CPU
// has AVX512_VNNI; without it that table keeps the AVX2 version.
//
// Compiled without extra flags like kernels_avx512.cpp: the target pragma below enables the
// instructions for the functions defined after it, and the standard headers come first.
#if defined(REDWING_HAVE_AVX2)

#include <cstdint>

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

namespace redwing::cpu {
namespace {

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// Scales or biases [i, i + 16) as float32; lanes outside `lanes` read nothing and are 0.
inline __m512 load_scales16(const void* p, ScaleType type, int64_t i, __mmask16 lanes) {
  switch (type) {
    case ScaleType::bf16: {
      const __m512i v = _mm512_cvtepu16_epi32(
          _mm256_maskz_loadu_epi16(lanes, static_cast<const uint16_t*>(p) + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    case ScaleType::f16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, static_cast<const uint16_t*>(p) + i));
    case ScaleType::f32:
      break;
  }
  return _mm512_maskz_loadu_ps(lanes, static_cast<const float*>(p) + i);
}

inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 half =
      _mm256_add_ps(_mm512_castps512_ps256(abcd),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

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

// Rows [r0, r0 + kRows). dl holds 16 floats per register block: each lane's activation scale d.
// sbuf: kRows rows of stride gpr + 16 (the row's scales, then zeros).
template <int kBits, int kGroup, int kRows>
void q8_rows(const QuantMatrix& w, const Q8Activation& xa, const float* dl, const float* sums,
             int64_t r0, float* y, float* sbuf) {
  using L = Q8Layout<kBits>;
  const int64_t wpr = w.cols / L::kPerLane;
  const int64_t gpr = w.cols / kGroup;
  const int64_t stride = gpr + 16;
  const int64_t n_blocks = (w.cols + L::kValues - 1) / L::kValues;
  const int tail_words = static_cast<int>((w.cols % L::kValues) / L::kPerLane);
  const uint32_t* rows[kRows];
  __m512 acc[kRows];
  for (int i = 0; i < kRows; ++i) {
    const int64_t first = (r0 + i) * gpr;
    for (int64_t g = 0; g < gpr; g += 16)
      _mm512_storeu_ps(sbuf + i * stride + g,
                       load_scales16(w.scales, w.scale_type, first + g, first_lanes(gpr - g)));
    _mm512_storeu_ps(sbuf + i * stride + gpr, _mm512_setzero_ps());
    // The bias part: b_g times the float32 sum of x over group g, lane-wise.
    __m512 b = _mm512_setzero_ps();
    for (int64_t g = 0; g < gpr; g += 16) {
      const __mmask16 lanes = first_lanes(gpr - g);
      b = _mm512_fmadd_ps(load_scales16(w.biases, w.scale_type, first + g, lanes),
                          _mm512_maskz_loadu_ps(lanes, sums + g), b);
    }
    acc[i] = b;
    rows[i] = w.packed + (r0 + i) * wpr;
  }
  const char* pf = reinterpret_cast<const char*>(w.packed + (r0 + kPrefetchGroups * kRows) * wpr);
  alignas(64) int32_t lane_group[16];
  for (int i = 0; i < 16; ++i) lane_group[i] = kGroup >= L::kValues ? 0 : i * L::kPerLane / kGroup;
  const __m512i idx = _mm512_load_si512(lane_group);
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const bool partial = blk == n_blocks - 1 && tail_words > 0;
    const __mmask16 lanes = partial ? first_lanes(tail_words) : static_cast<__mmask16>(0xffff);
    const int8_t* a = xa.q + blk * (kBits == 4 ? 128 : 64);
    const __m512 d = _mm512_load_ps(dl + blk * 16);
    const int64_t g0 = blk * L::kValues / kGroup;
    for (int i = 0; i < kRows; ++i) {
      _mm_prefetch(pf + (blk * kRows + i) * 64, _MM_HINT_T0);
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
  if constexpr (kRows == 4) {
    _mm_storeu_ps(y + r0, reduce4(acc[0], acc[1], acc[2], acc[3]));
  } else {
    for (int i = 0; i < kRows; ++i) y[r0 + i] = _mm512_reduce_add_ps(acc[i]);
  }
}

template <int kBits, int kGroup>
void q8_range(const QuantMatrix& w, const Q8Activation& xa, float* y, int64_t rb, int64_t re) {
  using L = Q8Layout<kBits>;
  thread_local Scratch dl_buf, sum_buf, s_buf;
  const int64_t gpr = w.cols / kGroup;
  const int64_t n_blocks = (w.cols + L::kValues - 1) / L::kValues;
  const int64_t n_act_blocks = w.cols / kQ8Block;
  float* dl = dl_buf.floats(static_cast<size_t>(n_blocks * 16));
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    for (int i = 0; i < 16; ++i) {
      const int64_t ab = (blk * L::kValues + i * L::kPerLane) / kQ8Block;
      dl[blk * 16 + i] = ab < n_act_blocks ? xa.scale[ab] : 0.0f;
    }
  }
  float* sums = sum_buf.floats(static_cast<size_t>(gpr));
  q8_group_sums(xa, kGroup, sums);
  float* sbuf = s_buf.floats(static_cast<size_t>(4 * (gpr + 16) + 16));
  int64_t r = rb;
  for (; r + 4 <= re; r += 4) q8_rows<kBits, kGroup, 4>(w, xa, dl, sums, r, y, sbuf);
  for (; r < re; ++r) q8_rows<kBits, kGroup, 1>(w, xa, dl, sums, r, y, sbuf);
}

template <int kBits>
void q8_bits(const QuantMatrix& w, const Q8Activation& xa, float* y, int64_t rb, int64_t re) {
  switch (w.group_size) {
    case 32:
      return q8_range<kBits, 32>(w, xa, y, rb, re);
    case 64:
      return q8_range<kBits, 64>(w, xa, y, rb, re);
    default:
      return q8_range<kBits, 128>(w, xa, y, rb, re);
  }
}

void qmatvec_q8_vnni(const QuantMatrix& w, const Q8Activation& xa, float* y, int64_t rb,
                     int64_t re) {
  if (w.bits == 4) {
    q8_bits<4>(w, xa, y, rb, re);
  } else {
    q8_bits<8>(w, xa, y, rb, re);
  }
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
Q8Kernel avx512_vnni_qmatvec_q8() { return qmatvec_q8_vnni; }
}  // namespace redwing::cpu

#endif  // REDWING_HAVE_AVX2
