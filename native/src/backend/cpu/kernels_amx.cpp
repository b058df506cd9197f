// AMX version of the exact prefill product (qmatmul_split, kernels.h) and the amx kernel table.
//
// The activations arrive split exactly into three bfloat16 parts (SplitActivation), already laid
// out as 16 x 32 tiles; the weights' 4-bit or 8-bit codes are widened to bfloat16 (exact) into
// the matrix unit's pair-interleaved ("VNNI") layout, 32 weight rows at a time, and reused for
// every token of the chunk. TDPBF16PS multiplies 16 tokens x 32 columns by 32 columns x 16
// weight rows, adding exact products into float32 accumulators, once per part; each group's
// sums then leave the tiles and are scaled in AVX-512 registers: y += s * sum(q x) + b * sum(x).
//
// Tile registers: 0-3 the float32 sums of (token tile i, weight tile j) at 2 i + j, 4-5 two
// token tiles of one part, 6-7 two weight tiles. Compiled without extra flags like
// kernels_avx512.cpp: the target pragma below enables the instructions for the functions
// defined after it, and dispatch.cpp selects this table only when cpu_has_amx().
#if defined(REDWING_HAVE_AVX2)

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels_impl.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace redwing::cpu {

bool cpu_has_amx() {
  static const bool available = [] {
#if defined(__linux__) && defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = (edx & (1u << 22)) != 0;
    const bool amx_tile = (edx & (1u << 24)) != 0;
    if (!amx_bf16 || !amx_tile) return false;
    // Linux hands out the 8 KiB tile state only to processes that ask for it
    // (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); without it the first tile instruction
    // faults.
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return available;
}

}  // namespace redwing::cpu

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,amx-tile,amx-bf16"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,amx-tile,amx-bf16")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "backend/cpu/avx512_common.h"

namespace redwing::cpu {
namespace {

// GCC's tile intrinsics are asm statements that do not tell the compiler they read or write
// memory, so ordinary stores that a tile load reads, and loads of what a tile store wrote, must
// not be moved across them.
inline void memory_fence_for_tiles() { asm volatile("" ::: "memory"); }

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Eight tiles of 16 rows of 64 bytes (the largest shape; one product uses them all).
void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// Two 16-bit integers per lane (low, high; each < 256) as the bfloat16 pair of the same values.
inline __m512i pair_to_bf16(__m512i pair) {
  const __m512i lo =
      _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_and_si512(pair, _mm512_set1_epi32(0xffff))));
  const __m512i hi = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_srli_epi32(pair, 16)));
  return _mm512_or_si512(_mm512_srli_epi32(lo, 16),
                         _mm512_and_si512(hi, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// The weight tiles of rows [r0, r0 + 32) for every block of 32 columns: tile (kc, j) at
// out + (2 kc + j) * 256 has in row k' (16 uint32) the bfloat16 pair (q[r][32 kc + 2 k'],
// q[r][32 kc + 2 k' + 1]) of each row r = r0 + 16 j + lane. Rows past the matrix are zero.
constexpr int64_t kPrefetchBytes = 512;  // per weight row, ahead of the conversion

template <int kBits>
void convert_weights(const QuantMatrix& w, int64_t r0, uint32_t* out) {
  const int64_t row_bytes = w.cols * kBits / 8;
  const int64_t n_kc = w.cols / kSplitK;
  const char* base = reinterpret_cast<const char*>(w.packed);
  const __m512i lane_offsets =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int>(row_bytes)));
  const __m512i zero = _mm512_setzero_si512();
  const __m512i byte_mask = _mm512_set1_epi32(0xff);
  // bfloat16 of 0..15 (the float32's top half: exact for small integers), in the low half of a
  // lane and in the high half.
  const __m512i bf16_low =
      _mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_set_epi32(
                            15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0))),
                        16);
  const __m512i bf16_high = _mm512_slli_epi32(bf16_low, 16);
  for (int j = 0; j < 2; ++j) {
    const int64_t first = r0 + 16 * j;
    const __mmask16 valid = first_lanes(w.rows - first);
    if (valid == 0) {
      for (int64_t kc = 0; kc < n_kc; ++kc) std::memset(out + (2 * kc + j) * 256, 0, 1024);
      continue;
    }
    const char* rows = base + first * row_bytes;
    for (int64_t kc = 0; kc < n_kc; ++kc) {
      uint32_t* tile = out + (2 * kc + j) * 256;
      const char* cols = rows + kc * kSplitK * kBits / 8;
      // The weights come from memory once per product, and the gathers touch 16 rows at once,
      // which the hardware prefetchers do not follow: fetch each row a few lines ahead.
      if ((kc * kSplitK * kBits / 8) % 64 == 0) {
        const char* ahead = cols + kPrefetchBytes;
        if (ahead < rows + row_bytes) {
          for (int r = 0; r < 16; ++r)
            if ((valid >> r) & 1) _mm_prefetch(ahead + r * row_bytes, _MM_HINT_T0);
        }
      }
      if constexpr (kBits == 4) {
        // Each gathered uint32 holds 8 values (4 pairs) of one row: byte b is pair 4 d + b.
        // vpermd reads only the low 4 bits of each index, so a shift alone picks a nibble and
        // the tables give its bfloat16 in the low or the high half of the pair.
        for (int d = 0; d < 4; ++d) {
          const __m512i v = _mm512_mask_i32gather_epi32(zero, valid, lane_offsets, cols + 4 * d, 1);
          for (int b = 0; b < 4; ++b) {
            const __m512i lo = _mm512_permutexvar_epi32(_mm512_srli_epi32(v, 8 * b), bf16_low);
            const __m512i hi = _mm512_permutexvar_epi32(_mm512_srli_epi32(v, 8 * b + 4), bf16_high);
            _mm512_store_si512(tile + (4 * d + b) * 16, _mm512_or_si512(lo, hi));
          }
        }
      } else {
        // Each gathered uint32 holds 4 values (2 pairs) of one row.
        for (int d = 0; d < 8; ++d) {
          const __m512i v = _mm512_mask_i32gather_epi32(zero, valid, lane_offsets, cols + 4 * d, 1);
          const __m512i p0 = _mm512_or_si512(
              _mm512_and_si512(v, byte_mask),
              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(v, 8), byte_mask), 16));
          const __m512i p1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(v, 16), byte_mask),
                                             _mm512_slli_epi32(_mm512_srli_epi32(v, 24), 16));
          _mm512_store_si512(tile + (2 * d) * 16, pair_to_bf16(p0));
          _mm512_store_si512(tile + (2 * d + 1) * 16, pair_to_bf16(p1));
        }
      }
    }
  }
}

// Scales (or biases) of rows [r0, r0 + 32) as float32 in [group][32 rows], zero past the matrix.
void transpose_scales(const QuantMatrix& w, const void* src, int64_t r0, float* out) {
  const int64_t gpr = w.cols / w.group_size;
  for (int64_t i = 0; i < 32; ++i) {
    const int64_t r = r0 + i;
    const int64_t first = r * gpr;
    if (r >= w.rows) {
      for (int64_t g = 0; g < gpr; ++g) out[g * 32 + i] = 0.0f;
    } else if (w.scale_type == ScaleType::bf16) {
      const auto* p = static_cast<const uint16_t*>(src) + first;
      for (int64_t g = 0; g < gpr; ++g) out[g * 32 + i] = bf16_bits_to_f32(p[g]);
    } else if (w.scale_type == ScaleType::f16) {
      const auto* p = static_cast<const uint16_t*>(src) + first;
      for (int64_t g = 0; g < gpr; ++g) out[g * 32 + i] = f16_bits_to_f32(p[g]);
    } else {
      const auto* p = static_cast<const float*>(src) + first;
      for (int64_t g = 0; g < gpr; ++g) out[g * 32 + i] = p[g];
    }
  }
}

// Per-thread buffers of one call.
struct AmxScratch {
  Scratch weights, scales, biases, acc, sums;
};

// Weight rows go through the matrix unit in blocks of 32 (two tiles), kBlocks blocks per pass:
// the token tiles of one group (12 KiB) then stay in L1 while every block's weight tiles stream
// from L2, instead of the activations being fetched from L2 again for each block.
constexpr int64_t kBlocks = 4;

// kTiles (1 or 2) token tiles starting at tile tt against n_blocks blocks of 32 converted weight
// rows starting at r0 (block b's tiles at wt + b * n_kc * 512, its scales and biases at
// sv/bv + b * gpr * 32): writes y for the tokens < xs.rows() and rows < re.
template <int kTiles>
void token_block(const QuantMatrix& w, const SplitActivation& xs, int64_t tt, const uint32_t* wt,
                 const float* sv, const float* bv, int64_t n_blocks, int64_t r0, int64_t re,
                 float* y, int64_t ys, float* acc, float* sums) {
  const int64_t n_kc = w.cols / kSplitK;
  const int64_t gpr = w.cols / w.group_size;
  const int64_t kc_per_group = w.group_size / kSplitK;
  const int64_t tile_stride = n_kc * 3 * 512;  // uint16 per token tile
  const uint16_t* a0 = xs.tiles() + tt * tile_stride;
  const uint16_t* a1 = a0 + tile_stride;
  const int64_t n_tok = kTiles * 16;
  alignas(64) float cbuf[4 * 256];
  for (int64_t i = 0; i < n_blocks * n_tok * 32; i += 16)
    _mm512_store_ps(acc + i, _mm512_setzero_ps());
  for (int64_t g = 0; g < gpr; ++g) {
    // Group sums of x (the per-block sums added in order, as the scalar reference does); zero
    // for the padding rows of the last tile.
    for (int64_t i = 0; i < n_tok; ++i) {
      const int64_t t = tt * 16 + i;
      float s = 0.0f;
      if (t < xs.rows()) {
        const float* bs = xs.block_sums() + t * n_kc + g * kc_per_group;
        for (int64_t b = 0; b < kc_per_group; ++b) s += bs[b];
      }
      sums[i] = s;
    }
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      const uint32_t* wb = wt + blk * n_kc * 512;
      memory_fence_for_tiles();
      _tile_zero(0);
      _tile_zero(1);
      if constexpr (kTiles == 2) {
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t kc = g * kc_per_group; kc < (g + 1) * kc_per_group; ++kc) {
        _tile_loadd(6, wb + kc * 512, 64);
        _tile_loadd(7, wb + kc * 512 + 256, 64);
        for (int part = 0; part < 3; ++part) {
          _tile_loadd(4, a0 + kc * 1536 + part * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          if constexpr (kTiles == 2) {
            _tile_loadd(5, a1 + kc * 1536 + part * 512, 64);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
      }
      _tile_stored(0, cbuf, 64);
      _tile_stored(1, cbuf + 256, 64);
      if constexpr (kTiles == 2) {
        _tile_stored(2, cbuf + 512, 64);
        _tile_stored(3, cbuf + 768, 64);
      }
      memory_fence_for_tiles();
      const float* svb = sv + blk * gpr * 32 + g * 32;
      const float* bvb = bv + blk * gpr * 32 + g * 32;
      const __m512 s0 = _mm512_load_ps(svb);
      const __m512 s1 = _mm512_load_ps(svb + 16);
      const __m512 b0 = _mm512_load_ps(bvb);
      const __m512 b1 = _mm512_load_ps(bvb + 16);
      float* accb = acc + blk * n_tok * 32;
      for (int64_t i = 0; i < n_tok; ++i) {
        const float* c = cbuf + (i / 16) * 512 + (i % 16) * 16;
        const __m512 sx = _mm512_set1_ps(sums[i]);
        float* a = accb + i * 32;
        const __m512 t0 = _mm512_fmadd_ps(b0, sx, _mm512_mul_ps(s0, _mm512_load_ps(c)));
        const __m512 t1 = _mm512_fmadd_ps(b1, sx, _mm512_mul_ps(s1, _mm512_load_ps(c + 256)));
        _mm512_store_ps(a, _mm512_add_ps(_mm512_load_ps(a), t0));
        _mm512_store_ps(a + 16, _mm512_add_ps(_mm512_load_ps(a + 16), t1));
      }
    }
  }
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const int64_t rb0 = r0 + blk * 32;
    const __mmask16 m0 = first_lanes(re - rb0);
    const __mmask16 m1 = first_lanes(re - rb0 - 16);
    const float* accb = acc + blk * n_tok * 32;
    for (int64_t i = 0; i < n_tok; ++i) {
      const int64_t t = tt * 16 + i;
      if (t >= xs.rows()) break;
      float* yt = y + t * ys + rb0;
      _mm512_mask_storeu_ps(yt, m0, _mm512_load_ps(accb + i * 32));
      if (m1 != 0) _mm512_mask_storeu_ps(yt + 16, m1, _mm512_load_ps(accb + i * 32 + 16));
    }
  }
}

template <int kBits>
void amx_rows(const QuantMatrix& w, const SplitActivation& xs, float* y, int64_t ys, int64_t rb,
              int64_t re) {
  thread_local AmxScratch scratch;
  const int64_t n_kc = w.cols / kSplitK;
  const int64_t gpr = w.cols / w.group_size;
  auto* wt = reinterpret_cast<uint32_t*>(
      scratch.weights.floats(static_cast<size_t>(kBlocks * n_kc * 512)));
  float* sv = scratch.scales.floats(static_cast<size_t>(kBlocks * gpr * 32));
  float* bv = scratch.biases.floats(static_cast<size_t>(kBlocks * gpr * 32));
  float* acc = scratch.acc.floats(kBlocks * 32 * 32);
  float* sums = scratch.sums.floats(32);
  const int64_t n_tiles = (xs.rows() + 15) / 16;
  configure_tiles();
  for (int64_t r0 = rb; r0 < re; r0 += kBlocks * 32) {
    // (No std::min here: a template instantiated in this target region could be a weak symbol
    // with AVX-512 code in it, kernels_impl.h.)
    const int64_t left = (re - r0 + 31) / 32;
    const int64_t n_blocks = left < kBlocks ? left : kBlocks;
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      convert_weights<kBits>(w, r0 + blk * 32, wt + blk * n_kc * 512);
      // Scales and biases transposed to [group][32 rows], zero past the matrix.
      transpose_scales(w, w.scales, r0 + blk * 32, sv + blk * gpr * 32);
      transpose_scales(w, w.biases, r0 + blk * 32, bv + blk * gpr * 32);
    }
    memory_fence_for_tiles();
    int64_t tt = 0;
    for (; tt + 2 <= n_tiles; tt += 2)
      token_block<2>(w, xs, tt, wt, sv, bv, n_blocks, r0, re, y, ys, acc, sums);
    if (tt < n_tiles) token_block<1>(w, xs, tt, wt, sv, bv, n_blocks, r0, re, y, ys, acc, sums);
  }
  // Hands the tile state back, so that context switches stop saving it.
  _tile_release();
}

void qmatmul_split_amx(const QuantMatrix& w, const SplitActivation& xs, float* y, int64_t ys,
                       int64_t rb, int64_t re) {
  if (w.bits == 4) {
    amx_rows<4>(w, xs, y, ys, rb, re);
  } else {
    amx_rows<8>(w, xs, y, ys, rb, re);
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
namespace {

// qmatmul through the matrix unit: the rows of X are split here, by every call (the CPU backend
// splits once per product and calls qmatmul_split instead). Outside the target region, so that
// the std::vector code SplitActivation brings in is compiled for every CPU (kernels_impl.h).
void qmatmul_amx(const QuantMatrix& w, const float* x, int64_t n_x, int64_t xs, float* y,
                 int64_t ys, int64_t rb, int64_t re) {
  thread_local SplitActivation split;
  split.split(x, n_x, xs, w.cols);
  qmatmul_split_amx(w, split, y, ys, rb, re);
}

}  // namespace

const KernelTable& amx_kernels() {
  static const KernelTable table = [] {
    KernelTable t = avx512_kernels();
    t.qmatmul = qmatmul_amx;
    t.qmatmul_split = qmatmul_split_amx;
    return t;
  }();
  return table;
}

}  // namespace redwing::cpu

#endif  // REDWING_HAVE_AVX2
