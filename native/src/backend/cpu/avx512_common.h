// Small AVX-512 helpers shared by the kernel files that enable AVX-512 with a target pragma
// (kernels_avx512.cpp, kernels_avx512vnni.cpp, kernels_amx.cpp). Include it after that pragma
// and <immintrin.h>, so that these functions are compiled with the including file's
// instructions; they have internal linkage, so each file keeps its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

namespace redwing::cpu {
namespace {

// The mask of the first min(n, 16) lanes (none for n <= 0).
inline __mmask16 first_lanes(int64_t n) {
  if (n <= 0) return 0;
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

// sums[g] = the float32 sum of x over group g of `group` values (a multiple of 32), for the
// products' bias term b_g * sum(x); in the same order wherever a product needs them.
inline void group_sums(const float* x, int64_t cols, int group, float* sums) {
  for (int64_t g = 0; g * group < cols; ++g) {
    const float* xg = x + g * group;
    __m512 a0 = _mm512_loadu_ps(xg);
    __m512 a1 = _mm512_loadu_ps(xg + 16);
    for (int j = 32; j < group; j += 32) {
      a0 = _mm512_add_ps(a0, _mm512_loadu_ps(xg + j));
      a1 = _mm512_add_ps(a1, _mm512_loadu_ps(xg + j + 16));
    }
    sums[g] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
}

// The lane sums of four vectors: {sum(a), sum(b), sum(c), sum(d)}, in fewer steps than four
// separate reductions.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // Per 128-bit quarter: {a, b, c, d} partial sums.
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 half =
      _mm256_add_ps(_mm512_castps512_ps256(abcd),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

}  // namespace
}  // namespace redwing::cpu
