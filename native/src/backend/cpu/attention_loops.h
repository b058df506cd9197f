// The loops around the SIMD attention tiles, shared by kernels_avx2.cpp and kernels_avx512.cpp:
// keys in tiles of 8 / heads, query heads in groups of 4, 2 and 1 (in decode the first group's
// pass over the keys fetches them ahead; later passes find them in cache), value columns in
// chunks of Tiles::kLanes * 8 / heads, f16 or f32 rows. A kernel file includes this after its
// target pragma, so that the loops are compiled for the instructions of the tiles they inline,
// and takes AttentionLoops<Tiles>::scores and ::values for its table. Tiles provides:
//   static constexpr int kLanes;  // floats per vector register
//   template <bool kF16, int kKeys, int kHeads>
//   static void score_tile(q, q_stride, d, scale, k, rows, n, h0, j0, s);
//     scores of keys [j0, j0 + kKeys) for query heads [h0, h0 + kHeads)
//   template <bool kF16, int kHeads, int kChunks>
//   static void value_tile(p, d, v, rows, n, h0, c0, o);
//     output columns [c0, c0 + kLanes kChunks) of query heads [h0, h0 + kHeads)
// (kernels.h's KernelTable::attention_scores and attention_values say what the whole calls do.)
#pragma once

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

namespace redwing::cpu {

template <class Tiles>
struct AttentionLoops {
  static void scores(const float* q, int64_t q_stride, int group, int head_dim, float scale,
                     const AttentionKv& kv, const int64_t* rows, int64_t n, float* s) {
    if (kv.f16)
      scores_of<true>(q, q_stride, group, head_dim, scale, kv, rows, n, s);
    else
      scores_of<false>(q, q_stride, group, head_dim, scale, kv, rows, n, s);
  }

  static void values(const float* p, int group, int head_dim, const AttentionKv& kv,
                     const int64_t* rows, int64_t n, float* o) {
    if (kv.f16)
      values_of<true>(p, group, head_dim, kv.v, rows, n, o);
    else
      values_of<false>(p, group, head_dim, kv.v, rows, n, o);
  }

 private:
  template <bool kF16, int kHeads>
  static void score_heads(const float* q, int64_t q_stride, int d, float scale,
                          const AttentionKv& kv, const int64_t* rows, int64_t n, int h0, float* s,
                          bool prefetch) {
    constexpr int kKeys = 8 / kHeads;
    int64_t j = 0;
    for (; j + kKeys <= n; j += kKeys) {
      if (prefetch) prefetch_kv_keys(kv, rows, n, j, kKeys, d);
      Tiles::template score_tile<kF16, kKeys, kHeads>(q, q_stride, d, scale, kv.k, rows, n, h0, j,
                                                      s);
    }
    for (; j < n; ++j) {
      if (prefetch) prefetch_kv_keys(kv, rows, n, j, 1, d);
      Tiles::template score_tile<kF16, 1, kHeads>(q, q_stride, d, scale, kv.k, rows, n, h0, j, s);
    }
  }

  template <bool kF16>
  static void scores_of(const float* q, int64_t q_stride, int group, int d, float scale,
                        const AttentionKv& kv, const int64_t* rows, int64_t n, float* s) {
    int h = 0;
    for (; h + 4 <= group; h += 4)
      score_heads<kF16, 4>(q, q_stride, d, scale, kv, rows, n, h, s, kv.fetch_ahead && h == 0);
    for (; h + 2 <= group; h += 2)
      score_heads<kF16, 2>(q, q_stride, d, scale, kv, rows, n, h, s, kv.fetch_ahead && h == 0);
    for (; h < group; ++h)
      score_heads<kF16, 1>(q, q_stride, d, scale, kv, rows, n, h, s, kv.fetch_ahead && h == 0);
  }

  template <bool kF16, int kHeads>
  static void value_heads(const float* p, int d, const void* v, const int64_t* rows, int64_t n,
                          int h0, float* o) {
    constexpr int kChunks = 8 / kHeads;
    for (int c0 = 0; c0 < d; c0 += Tiles::kLanes * kChunks)
      Tiles::template value_tile<kF16, kHeads, kChunks>(p, d, v, rows, n, h0, c0, o);
  }

  template <bool kF16>
  static void values_of(const float* p, int group, int d, const void* v, const int64_t* rows,
                        int64_t n, float* o) {
    int h = 0;
    for (; h + 4 <= group; h += 4) value_heads<kF16, 4>(p, d, v, rows, n, h, o);
    for (; h + 2 <= group; h += 2) value_heads<kF16, 2>(p, d, v, rows, n, h, o);
    for (; h < group; ++h) value_heads<kF16, 1>(p, d, v, rows, n, h, o);
  }
};

}  // namespace redwing::cpu
