// Internal to the CPU backend: the table of kernel implementations that dispatch.cpp switches
// between, and small scalar helpers shared by every implementation.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "backend/cpu/kernels.h"

// Put on the line before a loop over an array of vector registers (a tile's accumulators, its
// unpacked weights): unrolls it early in compilation, so that GCC keeps the array in registers.
// Without it GCC 12 at -O3 unrolled such loops too late and kept a copy of the array on the
// stack, storing every accumulator on each pass of the enclosing loop: 8 stores per key in the
// attention tiles and per 128 columns in the exact prefill tile (docs/cpu.md, session 29).
#define REDWING_UNROLL _Pragma("GCC unroll 16")

namespace redwing::cpu {

// qmatvec's integer method (kernels.h) on 4-bit weights, both null where the ISA lacks it.
// prepare: x's limbs (384 bytes per 128 columns, 64-byte aligned), lane units (16 floats per 128
// columns) and group sums (padded to 16 with zeros); false on inf or NaN. product: rows
// [row_begin, row_end) from a prepared x.
struct X24Kernels {
  bool (*prepare)(const float* x, int64_t cols, int group_size, int8_t* limbs, float* units,
                  float* sums) = nullptr;
  void (*product)(const QuantMatrix& w, const int8_t* limbs, const float* units, const float* sums,
                  float* y, int64_t row_begin, int64_t row_end) = nullptr;
  // n_x prepared rows, row t's parts at limbs + t * limb_stride (bytes), units + t * unit_stride
  // and sums + t * sum_stride (floats): Y[t * y_stride + r] for r in [row_begin, row_end).
  void (*product_rows)(const QuantMatrix& w, const int8_t* limbs, int64_t limb_stride,
                       const float* units, int64_t unit_stride, const float* sums,
                       int64_t sum_stride, int64_t n_x, float* y, int64_t y_stride,
                       int64_t row_begin, int64_t row_end) = nullptr;
};

// One entry per dispatched kernel. Implementations that do not provide a kernel copy the
// scalar entry, so every pointer is always valid (except the optional ones that default to null).
struct KernelTable {
  void (*qmatvec)(const QuantMatrix& w, const float* x, float* y, int64_t row_begin,
                  int64_t row_end);
  void (*qmatmul)(const QuantMatrix& w, const float* x, int64_t n_rows_x, int64_t x_stride,
                  float* y, int64_t y_stride, int64_t row_begin, int64_t row_end);
  void (*qdequant_row)(const QuantMatrix& w, int64_t row, float* out);
  // Y[t * y_stride + r] for t < n_x: the 8-bit-activation product of row r with xa[t].
  void (*qmatmul_q8)(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y,
                     int64_t y_stride, int64_t row_begin, int64_t row_end);
  void (*qmatmul_split)(const QuantMatrix& w, const SplitActivation& xs, float* y, int64_t y_stride,
                        int64_t row_begin, int64_t row_end);
  void (*rms_norm)(const float* x, const float* weight, float weight_offset, float eps, int64_t n,
                   float* y);
  void (*gelu_tanh_mul)(const float* gate, const float* up, int64_t n, float* out);
  void (*softcap)(float* x, int64_t n, float cap);
  void (*rope_neox)(float* x, int64_t n_heads, int64_t head_dim, const float* cos,
                    const float* sin);
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  float (*dot_f16)(const float* a, const uint16_t* b, int64_t n);
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n);
  void (*axpy_f16)(float a, const uint16_t* x, float* y, int64_t n);
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);
  void (*f16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*bf16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*softmax)(float* x, int64_t n);
  // The two halves of attention_partial over one block of n keys, key j's row of K or V at
  // element rows[j] of kv.k or kv.v. attention_scores: s[i * n + j] = scale * q_i . k_j for the
  // group's query heads (q_i at q + i * q_stride). attention_values: o[i * head_dim + c] =
  // sum_j p[i * n + j] v_j[c], summed in key order from zero. nullptr (the default) builds them
  // from dot_f16/dot_f32 and axpy_f16/axpy_f32 (dispatch.cpp); an implementation of its own
  // reads each key's row once for all the group's heads.
  void (*attention_scores)(const float* q, int64_t q_stride, int group, int head_dim, float scale,
                           const AttentionKv& kv, const int64_t* rows, int64_t n,
                           float* s) = nullptr;
  void (*attention_values)(const float* p, int group, int head_dim, const AttentionKv& kv,
                           const int64_t* rows, int64_t n, float* o) = nullptr;
  // qmatvec's integer method where the ISA has it (qmatvec tries it first unless
  // set_integer_exact_product(false)).
  X24Kernels x24;
  // The entries that read row-grouped matrices (QuantMatrix::row_group) themselves; dispatch.cpp
  // hands the others row-major copies of the groups they need. A table built from another
  // resets the flags of the entries it replaces.
  struct RowGroupReaders {
    bool qmatvec = false;
    bool q8 = false;  // qmatmul_q8
    bool x24 = false;
  } row_groups;
};

using Q8Kernel = void (*)(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y,
                          int64_t y_stride, int64_t row_begin, int64_t row_end);

const KernelTable& scalar_kernels();
// Whether the CPU has AVX512_VNNI (the avx512 table then uses kernels_avx512vnni.cpp's product).
bool cpu_has_avx512_vnni();
#if defined(REDWING_HAVE_AVX2)
const KernelTable& avx2_kernels();
// The AVX2 qmatmul before the blocked one (dot products over whole rows), for
// redwing-bench-prefill's A/B only.
decltype(KernelTable::qmatmul) avx2_previous_qmatmul();
const KernelTable& avx512_kernels();  // kernels_avx512.cpp: the AVX2 table plus wider kernels
Q8Kernel avx512_vnni_qmatmul_q8();    // kernels_avx512vnni.cpp
X24Kernels avx512_vnni_x24();         // kernels_avx512vnni.cpp
// Whether the CPU has AMX-TILE and AMX-BF16 and the OS lets this process use the tile registers
// (asked once, on Linux with arch_prctl). kernels_amx.cpp.
bool cpu_has_amx();
const KernelTable& amx_kernels();  // the avx512 table with the products on the matrix unit
#endif
#if defined(REDWING_HAVE_NEON)
const KernelTable& neon_kernels();
#endif

// Everything below has internal linkage on purpose. These helpers are compiled into files built
// with -mavx2 (or an AVX-512 target pragma); an out-of-line copy of an ordinary inline function
// from such a file is a weak symbol that the linker may keep for the whole program, which would
// then run AVX instructions on CPUs without them. Each file gets its own copy instead.
namespace {

// ---- scalar conversions, inline so every implementation can use them for tails ----------
// (__builtin_bit_cast rather than std::bit_cast: the latter is a function template, which an
// unoptimized build emits as a weak symbol.)

inline float bf16_bits_to_f32(uint16_t h) { return __builtin_bit_cast(float, uint32_t{h} << 16); }

inline uint16_t f32_to_bf16_bits(float x) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the sign and the top of the payload, and force it quiet so it stays a NaN.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return __builtin_bit_cast(float, sign | 0x7f800000u | (mantissa << 13));
  return __builtin_bit_cast(float, sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t f32_to_f16_bits(float x) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {
    if (magnitude == 0x7f800000u) return sign | 0x7c00u;                          // inf
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));  // quiet NaN
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal count of 2^-24 units.
    const uint32_t exponent = magnitude >> 23;
    const uint32_t shift = 126u - exponent;  // value = mantissa * 2^-shift units
    if (shift > 24u) return sign;            // less than half a unit (or a float subnormal)
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (magnitude >> 13) - (112u << 10);
  const uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
  return static_cast<uint16_t>(sign | h);
}

// Scale or bias i of a quantized matrix, as float32.
inline float load_scale(const void* p, ScaleType type, int64_t i) {
  switch (type) {
    case ScaleType::bf16:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case ScaleType::f16:
      return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case ScaleType::f32:
      return static_cast<const float*>(p)[i];
  }
  return 0.0f;
}

// Unsigned `bits`-wide element c of a packed row (low bits first in little-endian words).
inline uint32_t quant_at(const uint32_t* row, int bits, int64_t c) {
  const int64_t bit = c * bits;
  return (row[bit >> 5] >> (bit & 31)) & ((1u << bits) - 1u);
}

inline int64_t words_per_row(const QuantMatrix& w) { return w.cols * w.bits / 32; }
inline int64_t groups_per_row(const QuantMatrix& w) { return w.cols / w.group_size; }

// Where value c of a quantized activation sits in Q8Activation::q (see kernels.h).
inline int64_t q8_index(int bits, int64_t c) {
  if (bits == 8) return c;
  const int64_t block = c & ~int64_t{127};
  const int64_t i = c & 127;
  return block + (i & 1) * 64 + (i >> 1);
}

// Float32 sums of x over each weight group, from the activation's per-block sums (in order).
inline void q8_group_sums(const Q8Activation& xa, int group_size, float* out) {
  const int64_t per_group = group_size / kQ8Block;
  for (int64_t g = 0; g * group_size < xa.cols; ++g) {
    float s = 0.0f;
    for (int64_t b = 0; b < per_group; ++b) s += xa.block_sum[g * per_group + b];
    out[g] = s;
  }
}

// Calls fn.template operator()<kBits, kGroup>() with w's bits (4 or 8) and group size (32, 64 or
// 128) as constants: the SIMD products are templates over both, and every file picks them the
// same way.
template <class Fn>
inline void with_quant_shape(const QuantMatrix& w, Fn&& fn) {
  auto by_group = [&]<int kBits>() {
    switch (w.group_size) {
      case 32:
        return fn.template operator()<kBits, 32>();
      case 64:
        return fn.template operator()<kBits, 64>();
      default:
        return fn.template operator()<kBits, 128>();
    }
  };
  if (w.bits == 4)
    by_group.template operator()<4>();
  else
    by_group.template operator()<8>();
}

// Growable, 64-byte aligned per-thread scratch memory for the SIMD files (instead of
// std::vector<float>, whose instantiations there would be weak symbols, see above).
// Where the packed words of rows r0, r0 + 1, ... (up to the end of r0's row group when grouped)
// lie, block by block: at(blk, i) is row r0 + i's block blk (16 words; the last block of a row
// that is not whole blocks has tail words).
struct RowBlocks {
  const uint32_t* base;
  int64_t blk_stride;   // words from a block to the next (per row, or per group)
  int64_t row_stride;   // words from a row's full block to the next row's
  int64_t tail_stride;  // the same in the last, partial block
  int64_t full_blocks;  // blocks of 16 words in a row
  int64_t first;        // r0's place in its group (0 in row-major matrices)
  const uint32_t* at(int64_t blk, int64_t i) const {
    return base + blk * blk_stride + (first + i) * (blk < full_blocks ? row_stride : tail_stride);
  }
  // Row r0 + i's words from word w on, up to the end of w's 16-word block (the AVX2 kernels
  // read 8 words at a time, w a multiple of 8).
  const uint32_t* word(int64_t i, int64_t w) const { return at(w / 16, i) + w % 16; }
};

inline RowBlocks row_blocks(const QuantMatrix& w, int64_t r0) {
  const int64_t wpr = w.cols * w.bits / 32;
  if (w.row_group == kRowGroup) {
    const int64_t g = r0 / kRowGroup;
    return {
        w.packed + g * kRowGroup * wpr, 16 * kRowGroup, 16, wpr % 16, wpr / 16, r0 - g * kRowGroup};
  }
  return {w.packed + r0 * wpr, 16, wpr, wpr, wpr / 16, 0};
}

// Rows [rb, re) as quad(r) for 4 rows from r and single(r) for one: quads start on a row group
// in row-grouped matrices (RowBlocks reads at most to the end of r's group). Every kernel gives
// a row the same bits whichever it took.
template <typename Quad, typename Single>
inline void for_row_tiles(const QuantMatrix& w, int64_t rb, int64_t re, Quad&& quad,
                          Single&& single) {
  int64_t r = rb;
  if (w.row_group == kRowGroup)
    for (; r < re && r % kRowGroup != 0; ++r) single(r);
  for (; r + 4 <= re; r += 4) quad(r);
  for (; r < re; ++r) single(r);
}

class Scratch {
 public:
  // At least n floats; contents are unspecified after growth.
  float* floats(size_t n) {
    if (n > capacity_) {
      const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
      data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      if (!data_) throw std::bad_alloc();
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t capacity_ = 0;
};

// How many keys ahead the attention tiles fetch rows of K and V. A KV head's row is a slice of
// its position's row (4 KiB apart for 8 heads of 256 f16 values), so every key starts a new
// page, where hardware prefetchers stop: without this, decode attention waits on memory for each
// row (the keys of one decode token are read once).
constexpr int64_t kKvPrefetchKeys = 8;

// Fetches the cache line at p into L1 (to_l1) or L2.
inline void prefetch_line(const char* p, bool to_l1) {
#if defined(__x86_64__)
  // An asm statement: GCC 12 at -O3 deleted loops of __builtin_prefetch (and of _mm_prefetch)
  // as having no effect.
  if (to_l1)
    asm volatile("prefetcht0 %0" : : "m"(*p));
  else
    asm volatile("prefetcht1 %0" : : "m"(*p));
#else
  if (to_l1)
    __builtin_prefetch(p, 0, 3);
  else
    __builtin_prefetch(p, 0, 2);
#endif
}

// Fetches row `at` (head_dim elements) of K or V: into L1 (to_l1, the scores read it next) or
// into L2 (the values, read after the block's scores and softmax).
inline void prefetch_kv_row(const AttentionKv& kv, bool to_l1, const void* base, int64_t at,
                            int head_dim) {
  const int64_t elem = kv.f16 ? 2 : 4;
  const char* p = static_cast<const char*>(base) + at * elem;
  for (int64_t off = 0; off < head_dim * elem; off += 64) prefetch_line(p + off, to_l1);
}

// How many row groups ahead the decode products fetch their weights (measured: 1 and 2 are
// close, 2 slightly better on the large matrices; 4 and 8 no better).
constexpr int kPrefetchGroups = 2;

// Fetches the scales and biases of groups [first_group, first_group + n_groups) into L1. They
// are small separate streams that the hardware prefetcher tends to miss (a row group touches a
// few hundred bytes of each): without this, the integer decode product waited on them for about
// a quarter of its time (perf, AMD Zen 4).
inline void prefetch_scales(const QuantMatrix& w, int64_t first_group, int64_t n_groups) {
  const int64_t esize = w.scale_type == ScaleType::f32 ? 4 : 2;
  const char* s = static_cast<const char*>(w.scales) + first_group * esize;
  const char* b = static_cast<const char*>(w.biases) + first_group * esize;
  for (int64_t off = 0; off < n_groups * esize + 63; off += 64) {  // + 63: an unaligned start
    prefetch_line(s + off, true);
    prefetch_line(b + off, true);
  }
}

// Called by the attention tiles before the scores of keys [j, j + count) of a block of n (rows
// as in KernelTable::attention_scores): fetches the K rows kKvPrefetchKeys keys ahead (from
// j = 0, the first ones too) and these keys' V rows.
inline void prefetch_kv_keys(const AttentionKv& kv, const int64_t* rows, int64_t n, int64_t j,
                             int64_t count, int head_dim) {
  const int64_t k_begin = j == 0 ? 0 : j + kKvPrefetchKeys;
  const int64_t k_end = j + count + kKvPrefetchKeys < n ? j + count + kKvPrefetchKeys : n;
  for (int64_t a = k_begin; a < k_end; ++a) prefetch_kv_row(kv, true, kv.k, rows[a], head_dim);
  for (int64_t a = j; a < j + count; ++a) prefetch_kv_row(kv, false, kv.v, rows[a], head_dim);
}

}  // namespace

}  // namespace redwing::cpu
