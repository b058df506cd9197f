// Chooses the kernel implementation at run time (CPU features, REDWING_ISA) and forwards the
// public kernel API (kernels.h) to it. Also holds the kernels that have a single implementation.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace redwing::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c",
// and the sanitizer and fuzzing build (native/build-asan) is compiled with clang.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
#endif

bool cpu_has_avx2_fma_f16c() {
#if defined(REDWING_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(REDWING_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return cpu_has_avx2_fma_f16c() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

}  // namespace

bool cpu_has_avx512_vnni() {
#if defined(REDWING_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

namespace {

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return cpu_has_avx2_fma_f16c();
    case Isa::avx512:
      return cpu_has_avx512();
    case Isa::amx:
#if defined(REDWING_HAVE_AVX2)
      return cpu_has_avx512() && cpu_has_amx();
#else
      return false;
#endif
    case Isa::neon:
#if defined(REDWING_HAVE_NEON)
      return true;  // Advanced SIMD is mandatory on AArch64
#else
      return false;
#endif
  }
  return false;
}

const KernelTable& table_for(Isa isa) {
  switch (isa) {
#if defined(REDWING_HAVE_AVX2)
    case Isa::avx2:
      return avx2_kernels();
    case Isa::avx512:
      return avx512_kernels();
    case Isa::amx:
      return amx_kernels();
#endif
#if defined(REDWING_HAVE_NEON)
    case Isa::neon:
      return neon_kernels();
#endif
    default:
      return scalar_kernels();
  }
}

// The ISA at start-up: REDWING_ISA if set and supported, otherwise the best one detected.
Isa initial_isa() {
  const Isa detected = detect_isa();
  const char* env = std::getenv("REDWING_ISA");
  if (env == nullptr || *env == '\0') return detected;
  const std::string want(env);
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::amx, Isa::neon}) {
    if (want != isa_name(isa)) continue;
    if (isa_supported(isa)) return isa;
    std::fprintf(stderr, "redwing: REDWING_ISA=%s is not supported by this CPU/build; using %s\n",
                 env, isa_name(detected));
    return detected;
  }
  std::fprintf(
      stderr,
      "redwing: unknown REDWING_ISA=%s (expected scalar, avx2, avx512, amx or neon); using %s\n",
      env, isa_name(detected));
  return detected;
}

struct ActiveState {
  std::atomic<Isa> isa;
  std::atomic<const KernelTable*> table;
  ActiveState() {
    const Isa start = initial_isa();
    isa.store(start);
    table.store(&table_for(start));
  }
};

ActiveState& state() {
  static ActiveState s;
  return s;
}

const KernelTable& kernels() { return *state().table.load(std::memory_order_relaxed); }

void check_quant_matrix(const QuantMatrix& w, const char* kernel) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string("redwing::cpu::") + kernel + ": " + what);
  };
  if (w.bits != 4 && w.bits != 8) fail("bits must be 4 or 8, got " + std::to_string(w.bits));
  if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128) {
    fail("group_size must be 32, 64 or 128, got " + std::to_string(w.group_size));
  }
  if (w.rows < 0 || w.cols <= 0 || w.cols % w.group_size != 0) {
    fail("shape [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
         "] does not have whole groups of " + std::to_string(w.group_size));
  }
  if (w.packed == nullptr || w.scales == nullptr || w.biases == nullptr) {
    fail("null packed, scales or biases pointer");
  }
  if (w.row_group != 1 && (w.row_group != kRowGroup || w.rows % kRowGroup != 0))
    fail("row_group " + std::to_string(w.row_group) + " with " + std::to_string(w.rows) +
         " rows (1, or " + std::to_string(kRowGroup) + " with whole groups of rows)");
}

// For kernels that read rows one after another: product(view, lo, hi, first) for row-major
// copies of the groups of a row-grouped w that cover [row_begin, row_end), up to 64 rows at a
// time. view is rows [first, first + view.rows) of w, [lo, hi) the wanted ones among them, and
// the product writes its row r to the caller's row first + r (y + first). A row-major w is
// passed through as it is (first 0).
template <typename Product>
void by_rows(const QuantMatrix& w, int64_t row_begin, int64_t row_end, Product&& product) {
  if (w.row_group != kRowGroup) {
    product(w, row_begin, row_end, int64_t{0});
    return;
  }
  constexpr int64_t kGroupsAtOnce = 16;
  thread_local Scratch words;
  const int64_t wpr = w.cols * w.bits / 32;
  const int64_t gpr = w.cols / w.group_size;
  const int64_t esize = w.scale_type == ScaleType::f32 ? 4 : 2;
  uint32_t* plain = reinterpret_cast<uint32_t*>(
      words.floats(static_cast<size_t>(kGroupsAtOnce * kRowGroup * wpr)));
  for (int64_t g = row_begin / kRowGroup; g * kRowGroup < row_end; g += kGroupsAtOnce) {
    const int64_t first = g * kRowGroup;
    const int64_t n_groups = std::min(kGroupsAtOnce, (row_end - first + kRowGroup - 1) / kRowGroup);
    ungroup_rows(w.packed + first * wpr, plain, n_groups, wpr);
    QuantMatrix view = w;
    view.packed = plain;
    view.scales = static_cast<const char*>(w.scales) + first * gpr * esize;
    view.biases = static_cast<const char*>(w.biases) + first * gpr * esize;
    view.rows = n_groups * kRowGroup;
    view.row_group = 1;
    product(view, std::max(row_begin, first) - first, std::min(row_end, first + view.rows) - first,
            first);
  }
}

// by_rows for a kernel that may read row groups itself (native: the table's flag for it): w as
// it is where it does.
template <typename Product>
void by_rows_unless_native(bool native, const QuantMatrix& w, int64_t row_begin, int64_t row_end,
                           Product&& product) {
  if (native)
    product(w, row_begin, row_end, int64_t{0});
  else
    by_rows(w, row_begin, row_end, product);
}

void check_row_range(const QuantMatrix& w, int64_t row_begin, int64_t row_end, const char* kernel) {
  if (row_begin < 0 || row_end > w.rows || row_begin > row_end) {
    throw std::invalid_argument(std::string("redwing::cpu::") + kernel + ": row range [" +
                                std::to_string(row_begin) + ", " + std::to_string(row_end) +
                                ") outside [0, " + std::to_string(w.rows) + ")");
  }
}

}  // namespace

Isa detect_isa() {
  if (isa_supported(Isa::amx)) return Isa::amx;
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  if (isa_supported(Isa::neon)) return Isa::neon;
  return Isa::scalar;
}

Isa active_isa() { return state().isa.load(); }

bool set_active_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  state().table.store(&table_for(isa));
  state().isa.store(isa);
  return true;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::neon:
      return "neon";
    case Isa::avx512:
      return "avx512";
    case Isa::amx:
      return "amx";
  }
  return "unknown";
}

const char* cpu_features() {
  static const std::string features = [] {
    std::string out;
    auto add = [&](const char* name) {
      if (!out.empty()) out += ' ';
      out += name;
    };
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) add("sse4.2");
    if (__builtin_cpu_supports("avx")) add("avx");
    if (__builtin_cpu_supports("avx2")) add("avx2");
    if (__builtin_cpu_supports("fma")) add("fma");
    if (cpu_has_f16c()) add("f16c");
    if (__builtin_cpu_supports("avx512f")) add("avx512f");
    if (__builtin_cpu_supports("avx512bw")) add("avx512bw");
    if (__builtin_cpu_supports("avx512dq")) add("avx512dq");
    if (__builtin_cpu_supports("avx512vl")) add("avx512vl");
    if (__builtin_cpu_supports("avx512vnni")) add("avx512vnni");
#if defined(REDWING_HAVE_AVX2)
    if (cpu_has_amx()) add("amx-tile amx-bf16");
#endif
#elif defined(__aarch64__)
    add("neon");
#endif
    return out;
  }();
  return features.c_str();
}

// ---- the row-group layout ------------------------------------------------------------------

bool row_groups_pay() {
  static const bool allowed = [] {
    const char* env = std::getenv("REDWING_ROW_GROUPS");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  // The decode products: the exact one (the integer method where on) and the 8-bit one.
  const KernelTable& t = kernels();
  const bool exact = integer_exact_product_active() ? t.row_groups.x24 : t.row_groups.qmatvec;
  return allowed && exact && t.row_groups.q8;
}

void group_rows(const uint32_t* src, uint32_t* dst, int64_t rows, int64_t words_per_row) {
  if (rows % kRowGroup != 0)
    throw std::invalid_argument("redwing::cpu::group_rows: " + std::to_string(rows) +
                                " rows are not whole groups of " + std::to_string(kRowGroup));
  const int64_t full = words_per_row / 16, tail = words_per_row % 16;
  const int64_t group_words = kRowGroup * words_per_row;
  std::vector<uint32_t> rows_of_group(static_cast<size_t>(group_words));
  for (int64_t g = 0; g < rows / kRowGroup; ++g) {
    // Through a copy of the group's rows, so that dst may be src.
    std::memcpy(rows_of_group.data(), src + g * group_words,
                static_cast<size_t>(group_words) * sizeof(uint32_t));
    uint32_t* out = dst + g * group_words;
    for (int64_t b = 0; b <= full; ++b) {
      const int64_t n = b < full ? 16 : tail;
      for (int64_t i = 0; i < kRowGroup; ++i, out += n)
        std::memcpy(out, rows_of_group.data() + i * words_per_row + b * 16,
                    static_cast<size_t>(n) * sizeof(uint32_t));
    }
  }
}

void ungroup_rows(const uint32_t* src, uint32_t* dst, int64_t n_groups, int64_t words_per_row) {
  const int64_t full = words_per_row / 16, tail = words_per_row % 16;
  const int64_t group_words = kRowGroup * words_per_row;
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint32_t* in = src + g * group_words;
    uint32_t* rows = dst + g * group_words;
    for (int64_t b = 0; b <= full; ++b) {
      const int64_t n = b < full ? 16 : tail;
      for (int64_t i = 0; i < kRowGroup; ++i, in += n)
        std::memcpy(rows + i * words_per_row + b * 16, in,
                    static_cast<size_t>(n) * sizeof(uint32_t));
    }
  }
}

// ---- forwarding --------------------------------------------------------------------------

namespace {
// REDWING_EXACT_PRODUCT=float turns the integer method off at start-up (A/B runs).
std::atomic<bool>& integer_exact_product() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("REDWING_EXACT_PRODUCT");
    if (env == nullptr || *env == '\0' || std::strcmp(env, "integer") == 0) return true;
    if (std::strcmp(env, "float") == 0) return false;
    std::fprintf(stderr,
                 "redwing: unknown REDWING_EXACT_PRODUCT=%s (expected integer or float); using "
                 "integer\n",
                 env);
    return true;
  }();
  return on;
}
}  // namespace

bool set_integer_exact_product(bool on) { return integer_exact_product().exchange(on); }

bool integer_exact_product_active() {
  return integer_exact_product().load(std::memory_order_relaxed) &&
         kernels().x24.product != nullptr;
}

bool X24Buffer::resize(int64_t n_rows, int64_t cols, int group_size) {
  cols_ = 0;
  if (!integer_exact_product_active()) return false;
  if (cols <= 0 || (group_size != 32 && group_size != 64 && group_size != 128) ||
      cols % group_size != 0)
    throw std::invalid_argument("redwing::cpu::X24Buffer: " + std::to_string(cols) +
                                " columns are not whole groups of " + std::to_string(group_size));
  if (n_rows < 1)
    throw std::invalid_argument("redwing::cpu::X24Buffer: " + std::to_string(n_rows) + " rows");
  const int64_t blocks = (cols + 127) / 128;
  const int64_t groups = cols / group_size;
  // One allocation: every row's limbs, then every row's units, then every row's sums, each row
  // at a 64-byte boundary.
  limb_stride_ = blocks * 384;
  unit_stride_ = blocks * 16;
  sum_stride_ = (groups + 15) / 16 * 16;
  const size_t limb_bytes = static_cast<size_t>(n_rows * limb_stride_);
  const size_t unit_bytes = static_cast<size_t>(n_rows * unit_stride_) * sizeof(float);
  const size_t sum_bytes = static_cast<size_t>(n_rows * sum_stride_) * sizeof(float);
  storage_.resize(limb_bytes + unit_bytes + sum_bytes + 64);
  auto* base =
      reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(storage_.data()) + 63) / 64 * 64);
  limbs_ = reinterpret_cast<int8_t*>(base);
  units_ = reinterpret_cast<float*>(base + limb_bytes);
  sums_ = reinterpret_cast<float*>(base + limb_bytes + unit_bytes);
  rows_ = n_rows;
  cols_ = cols;
  group_size_ = group_size;
  return true;
}

bool X24Buffer::prepare_row(int64_t t, const float* x) {
  if (cols_ == 0 || t < 0 || t >= rows_)
    throw std::logic_error("redwing::cpu::X24Buffer::prepare_row: row " + std::to_string(t) +
                           " of " + std::to_string(rows()));
  return kernels().x24.prepare(x, cols_, group_size_, limbs_ + t * limb_stride_,
                               units_ + t * unit_stride_, sums_ + t * sum_stride_);
}

bool X24Buffer::prepare(const float* x, int64_t cols, int group_size) {
  if (!resize(1, cols, group_size)) return false;
  if (prepare_row(0, x)) return true;
  cols_ = 0;
  return false;
}

namespace {
void check_x24_input(const QuantMatrix& w, const X24Buffer& xa, int64_t row_begin, int64_t row_end,
                     const char* what) {
  check_quant_matrix(w, what);
  check_row_range(w, row_begin, row_end, what);
  if (w.bits != 4 || xa.cols() != w.cols || xa.group_size() != w.group_size)
    throw std::invalid_argument(
        std::string("redwing::cpu::") + what + ": the input was prepared for " +
        std::to_string(xa.cols()) + " columns in groups of " + std::to_string(xa.group_size()) +
        ", the matrix has " + std::to_string(w.cols) + " in groups of " +
        std::to_string(w.group_size) + " (" + std::to_string(w.bits) + "-bit)");
  if (kernels().x24.product == nullptr)
    throw std::logic_error(std::string("redwing::cpu::") + what +
                           ": the active ISA has no integer method");
}
}  // namespace

void qmatvec_x24(const QuantMatrix& w, const X24Buffer& xa, float* y, int64_t row_begin,
                 int64_t row_end) {
  check_x24_input(w, xa, row_begin, row_end, "qmatvec_x24");
  if (row_begin == row_end) return;
  by_rows_unless_native(kernels().row_groups.x24, w, row_begin, row_end,
                        [&](const QuantMatrix& v, int64_t lo, int64_t hi, int64_t first) {
                          kernels().x24.product(v, xa.limbs_, xa.units_, xa.sums_, y + first, lo,
                                                hi);
                        });
}

void qmatmul_x24(const QuantMatrix& w, const X24Buffer& xs, float* y, int64_t y_stride,
                 int64_t row_begin, int64_t row_end) {
  check_x24_input(w, xs, row_begin, row_end, "qmatmul_x24");
  if (xs.rows() > 1 && y_stride < row_end)
    throw std::invalid_argument("redwing::cpu::qmatmul_x24: output stride " +
                                std::to_string(y_stride) + " is under the row end " +
                                std::to_string(row_end));
  if (row_begin == row_end) return;
  by_rows_unless_native(kernels().row_groups.x24, w, row_begin, row_end,
                        [&](const QuantMatrix& v, int64_t lo, int64_t hi, int64_t first) {
                          kernels().x24.product_rows(v, xs.limbs_, xs.limb_stride_, xs.units_,
                                                     xs.unit_stride_, xs.sums_, xs.sum_stride_,
                                                     xs.rows(), y + first, y_stride, lo, hi);
                        });
}

void qmatvec(const QuantMatrix& w, const float* x, float* y, int64_t row_begin, int64_t row_end) {
  check_quant_matrix(w, "qmatvec");
  check_row_range(w, row_begin, row_end, "qmatvec");
  if (row_begin == row_end) return;
  thread_local X24Buffer prepared;  // this call's own x (the backend shares one per product)
  if (w.bits == 4 && prepared.prepare(x, w.cols, w.group_size)) {
    by_rows_unless_native(kernels().row_groups.x24, w, row_begin, row_end,
                          [&](const QuantMatrix& v, int64_t lo, int64_t hi, int64_t first) {
                            kernels().x24.product(v, prepared.limbs_, prepared.units_,
                                                  prepared.sums_, y + first, lo, hi);
                          });
    return;
  }
  by_rows_unless_native(kernels().row_groups.qmatvec, w, row_begin, row_end,
                        [&](const QuantMatrix& v, int64_t lo, int64_t hi, int64_t first) {
                          kernels().qmatvec(v, x, y + first, lo, hi);
                        });
}

void qmatmul(const QuantMatrix& w, const float* x, int64_t n_rows_x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t row_begin, int64_t row_end) {
  check_quant_matrix(w, "qmatmul");
  check_row_range(w, row_begin, row_end, "qmatmul");
  if (n_rows_x < 0 || (n_rows_x > 1 && (x_stride < w.cols || y_stride < row_end))) {
    throw std::invalid_argument("redwing::cpu::qmatmul: bad n_rows_x or strides");
  }
  if (row_begin == row_end || n_rows_x == 0) return;
  by_rows(w, row_begin, row_end, [&](const QuantMatrix& v, int64_t lo, int64_t hi, int64_t first) {
    kernels().qmatmul(v, x, n_rows_x, x_stride, y + first, y_stride, lo, hi);
  });
}

// ---- exact products on matrix units ------------------------------------------------------

void split_bf16x3(float x, uint16_t& hi, uint16_t& mid, uint16_t& lo) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, x);
  if ((bits & 0x7f800000u) == 0x7f800000u) {
    // inf keeps its bits; a NaN is made quiet so that clearing the low bits cannot make it inf.
    hi = static_cast<uint16_t>((bits >> 16) | ((bits & 0x7fffffu) != 0 ? 0x0040u : 0u));
    mid = lo = 0;
    return;
  }
  hi = static_cast<uint16_t>(bits >> 16);
  // Both subtractions are exact: the remainder has at most 16, then 8, significant bits.
  const float r1 = x - bf16_bits_to_f32(hi);
  mid = static_cast<uint16_t>(__builtin_bit_cast(uint32_t, r1) >> 16);
  const float r2 = r1 - bf16_bits_to_f32(mid);
  lo = static_cast<uint16_t>(__builtin_bit_cast(uint32_t, r2) >> 16);
}

void SplitActivation::resize(int64_t n_rows, int64_t cols) {
  if (cols <= 0 || cols % kSplitK != 0 || n_rows < 0)
    throw std::invalid_argument(
        "redwing::cpu::SplitActivation: cols must be a positive multiple of " +
        std::to_string(kSplitK) + ", got " + std::to_string(cols));
  rows_ = n_rows;
  cols_ = cols;
  const int64_t padded = (n_rows + kSplitTile - 1) / kSplitTile * kSplitTile;
  // Rows past n_rows must read as zero (the matrix unit multiplies whole tiles).
  tiles_.assign(static_cast<size_t>(padded * cols * 3), 0);
  sums_.resize(static_cast<size_t>(n_rows * (cols / kSplitK)));
}

void SplitActivation::split_row(int64_t t, const float* x) {
  const int64_t n_kc = cols_ / kSplitK;
  uint16_t* row = tiles_.data() + (t / kSplitTile) * n_kc * 3 * 512 + (t % kSplitTile) * kSplitK;
  float* sums = sums_.data() + t * n_kc;
  for (int64_t kc = 0; kc < n_kc; ++kc) {
    uint16_t* tile = row + kc * 3 * 512;
    float sum = 0.0f;
    for (int j = 0; j < kSplitK; ++j) {
      const float v = x[kc * kSplitK + j];
      split_bf16x3(v, tile[j], tile[512 + j], tile[1024 + j]);
      sum += v;
    }
    sums[kc] = sum;
  }
}

void SplitActivation::split(const float* x, int64_t n_rows, int64_t x_stride, int64_t cols) {
  if (n_rows > 1 && x_stride < cols)
    throw std::invalid_argument("redwing::cpu::SplitActivation: row stride shorter than a row");
  resize(n_rows, cols);
  for (int64_t t = 0; t < n_rows; ++t) split_row(t, x + t * x_stride);
}

void qmatmul_split(const QuantMatrix& w, const SplitActivation& xs, float* y, int64_t y_stride,
                   int64_t row_begin, int64_t row_end) {
  check_quant_matrix(w, "qmatmul_split");
  check_row_range(w, row_begin, row_end, "qmatmul_split");
  if (xs.cols() != w.cols)
    throw std::invalid_argument("redwing::cpu::qmatmul_split: input of " +
                                std::to_string(xs.cols()) + " columns for a matrix of " +
                                std::to_string(w.cols));
  if (xs.rows() > 1 && y_stride < row_end)
    throw std::invalid_argument("redwing::cpu::qmatmul_split: bad y_stride");
  if (xs.rows() == 0 || row_begin == row_end) return;
  by_rows(w, row_begin, row_end, [&](const QuantMatrix& v, int64_t lo, int64_t hi, int64_t first) {
    kernels().qmatmul_split(v, xs, y + first, y_stride, lo, hi);
  });
}

bool has_matrix_product() { return active_isa() == Isa::amx; }

void qdequant_row(const QuantMatrix& w, int64_t row, float* out) {
  check_quant_matrix(w, "qdequant_row");
  if (row < 0 || row >= w.rows) {
    throw std::out_of_range("redwing::cpu::qdequant_row: row " + std::to_string(row) +
                            " outside [0, " + std::to_string(w.rows) + ")");
  }
  by_rows(w, row, row + 1, [&](const QuantMatrix& v, int64_t lo, int64_t, int64_t) {
    kernels().qdequant_row(v, lo, out);
  });
}

// ---- 8-bit activations --------------------------------------------------------------------

void Q8Buffer::resize(int64_t n_rows, int64_t cols, int bits) {
  if (bits != 4 && bits != 8)
    throw std::invalid_argument("redwing::cpu::Q8Buffer: bits must be 4 or 8");
  if (cols <= 0 || cols % kQ8Block != 0 || n_rows < 0)
    throw std::invalid_argument("redwing::cpu::Q8Buffer: cols must be a positive multiple of " +
                                std::to_string(kQ8Block) + ", got " + std::to_string(cols));
  rows_ = n_rows;
  cols_ = cols;
  padded_ = (cols + 127) / 128 * 128;
  bits_ = bits;
  // The padding must read as zero; quantize_row writes only [0, cols).
  q_.assign(static_cast<size_t>(n_rows * padded_), 0);
  scale_.resize(static_cast<size_t>(n_rows * (cols / kQ8Block)));
  block_sum_.resize(static_cast<size_t>(n_rows * (cols / kQ8Block)));
}

void Q8Buffer::quantize_row(int64_t t, const float* x) {
  const int64_t blocks = cols_ / kQ8Block;
  int8_t* qt = q_.data() + t * padded_;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.0f;
    float sum = 0.0f;
    for (int i = 0; i < kQ8Block; ++i) {
      amax = std::max(amax, std::fabs(xb[i]));
      sum += xb[i];
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int8_t v[kQ8Block];
    for (int i = 0; i < kQ8Block; ++i) {
      // Round to nearest even by adding and subtracting 1.5 * 2^23 (exact for |x| < 2^22, and
      // |x * inv| <= 127 up to rounding), which the compiler vectorizes, unlike nearbyint.
      const float r = (xb[i] * inv + 12582912.0f) - 12582912.0f;
      v[i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
    if (bits_ == 8) {
      std::memcpy(qt + b * kQ8Block, v, kQ8Block);
    } else {
      for (int i = 0; i < kQ8Block; ++i) qt[q8_index(4, b * kQ8Block + i)] = v[i];
    }
    scale_[static_cast<size_t>(t * blocks + b)] = amax / 127.0f;
    block_sum_[static_cast<size_t>(t * blocks + b)] = sum;
  }
}

void Q8Buffer::quantize(const float* x, int64_t n_rows, int64_t x_stride, int64_t cols, int bits) {
  if (n_rows > 1 && x_stride < cols)
    throw std::invalid_argument("redwing::cpu::Q8Buffer: row stride shorter than a row");
  resize(n_rows, cols, bits);
  for (int64_t t = 0; t < n_rows; ++t) quantize_row(t, x + t * x_stride);
}

Q8Activation Q8Buffer::row(int64_t t) const {
  const int64_t blocks = cols_ / kQ8Block;
  return {q_.data() + t * padded_, scale_.data() + t * blocks, block_sum_.data() + t * blocks,
          cols_, bits_};
}

namespace {
void check_q8_input(const QuantMatrix& w, const Q8Activation& xa, const char* kernel) {
  if (xa.cols != w.cols || xa.bits != w.bits || xa.q == nullptr)
    throw std::invalid_argument(std::string("redwing::cpu::") + kernel +
                                ": activation quantized for " + std::to_string(xa.cols) +
                                " columns of " + std::to_string(xa.bits) + "-bit weights, not " +
                                std::to_string(w.cols) + " of " + std::to_string(w.bits));
}

void q8_product(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y,
                int64_t y_stride, int64_t row_begin, int64_t row_end) {
  by_rows_unless_native(kernels().row_groups.q8, w, row_begin, row_end,
                        [&](const QuantMatrix& v, int64_t lo, int64_t hi, int64_t first) {
                          kernels().qmatmul_q8(v, xa, n_x, y + first, y_stride, lo, hi);
                        });
}
}  // namespace

void qmatvec_q8(const QuantMatrix& w, const Q8Activation& xa, float* y, int64_t row_begin,
                int64_t row_end) {
  check_quant_matrix(w, "qmatvec_q8");
  check_row_range(w, row_begin, row_end, "qmatvec_q8");
  check_q8_input(w, xa, "qmatvec_q8");
  if (row_begin == row_end) return;
  q8_product(w, &xa, 1, y, 0, row_begin, row_end);
}

void qmatmul_q8(const QuantMatrix& w, const Q8Buffer& xa, float* y, int64_t y_stride,
                int64_t row_begin, int64_t row_end) {
  check_quant_matrix(w, "qmatmul_q8");
  check_row_range(w, row_begin, row_end, "qmatmul_q8");
  if (xa.rows() == 0 || row_begin == row_end) return;
  check_q8_input(w, xa.row(0), "qmatmul_q8");
  if (xa.rows() > 1 && y_stride < row_end)
    throw std::invalid_argument("redwing::cpu::qmatmul_q8: bad y_stride");
  thread_local std::vector<Q8Activation> rows;
  rows.resize(static_cast<size_t>(xa.rows()));
  for (int64_t t = 0; t < xa.rows(); ++t) rows[static_cast<size_t>(t)] = xa.row(t);
  q8_product(w, rows.data(), xa.rows(), y, y_stride, row_begin, row_end);
}

void rms_norm(const float* x, const float* weight, float weight_offset, float eps, int64_t n,
              float* y) {
  if (n <= 0) return;
  kernels().rms_norm(x, weight, weight_offset, eps, n, y);
}

void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out) {
  kernels().gelu_tanh_mul(gate, up, n, out);
}

void softcap(float* x, int64_t n, float cap) { kernels().softcap(x, n, cap); }

void rope_neox(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin) {
  kernels().rope_neox(x, n_heads, head_dim, cos, sin);
}

float dot_f32(const float* a, const float* b, int64_t n) { return kernels().dot_f32(a, b, n); }
float dot_f16(const float* a, const uint16_t* b, int64_t n) { return kernels().dot_f16(a, b, n); }
void axpy_f32(float a, const float* x, float* y, int64_t n) { kernels().axpy_f32(a, x, y, n); }
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) { kernels().axpy_f16(a, x, y, n); }

void f32_to_f16(const float* x, uint16_t* y, int64_t n) { kernels().f32_to_f16(x, y, n); }
void f16_to_f32(const uint16_t* x, float* y, int64_t n) { kernels().f16_to_f32(x, y, n); }
void bf16_to_f32(const uint16_t* x, float* y, int64_t n) { kernels().bf16_to_f32(x, y, n); }
float bf16_to_f32(uint16_t x) { return bf16_bits_to_f32(x); }
uint16_t f32_to_bf16(float x) { return f32_to_bf16_bits(x); }
float f16_to_f32(uint16_t x) { return f16_bits_to_f32(x); }
uint16_t f32_to_f16(float x) { return f32_to_f16_bits(x); }

void softmax(float* x, int64_t n) { kernels().softmax(x, n); }

void attention_partial(const float* q, int64_t q_stride, int group, int head_dim, float scale,
                       const AttentionKv& kv, int64_t pos_begin, int64_t pos_end, float* m,
                       float* w, float* o, float* scratch) {
  const int64_t n = pos_end - pos_begin;
  if (n <= 0 || n > kAttentionBlock || group <= 0 || head_dim <= 0)
    throw std::invalid_argument("redwing::cpu::attention_partial: bad block");
  const KernelTable& kn = kernels();
  const int64_t d = head_dim;
  float* s = scratch;  // [group, n] scores, then probabilities
  // Where position p's row of K or V starts (f16 rows are widened inside the kernels, no copy).
  int64_t rows[kAttentionBlock];
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = pos_begin + j;
    rows[j] = (kv.ring ? p % kv.capacity : p) * kv.row_stride;
  }
  if (kn.attention_scores != nullptr) {
    kn.attention_scores(q, q_stride, group, head_dim, scale, kv, rows, n, s);
  } else {
    // The group's heads read each row one after another, so it is in L1 after the first.
    const auto* k32 = static_cast<const float*>(kv.k);
    const auto* k16 = static_cast<const uint16_t*>(kv.k);
    for (int64_t j = 0; j < n; ++j)
      for (int i = 0; i < group; ++i)
        s[i * n + j] = (kv.f16 ? kn.dot_f16(q + i * q_stride, k16 + rows[j], d)
                               : kn.dot_f32(q + i * q_stride, k32 + rows[j], d)) *
                       scale;
  }
  for (int i = 0; i < group; ++i) {
    float* si = s + i * n;
    int64_t top = 0;
    for (int64_t j = 1; j < n; ++j) top = si[j] > si[top] ? j : top;
    m[i] = si[top];
    kn.softmax(si, n);
    w[i] = si[top];
  }
  if (kn.attention_values != nullptr) {
    kn.attention_values(s, group, head_dim, kv, rows, n, o);
    return;
  }
  std::fill_n(o, group * d, 0.0f);
  const auto* v32 = static_cast<const float*>(kv.v);
  const auto* v16 = static_cast<const uint16_t*>(kv.v);
  for (int64_t j = 0; j < n; ++j) {
    for (int i = 0; i < group; ++i) {
      if (kv.f16)
        kn.axpy_f16(s[i * n + j], v16 + rows[j], o + i * d, d);
      else
        kn.axpy_f32(s[i * n + j], v32 + rows[j], o + i * d, d);
    }
  }
}

void attention_combine(const float* m, const float* w, const float* o, int64_t stride, int n_blocks,
                       int head_dim, float* out) {
  if (n_blocks == 1) {  // nothing to merge: the block's softmax is the whole softmax
    std::copy_n(o, head_dim, out);
    return;
  }
  float top = m[0];
  for (int b = 1; b < n_blocks; ++b) top = std::max(top, m[b * stride]);
  // Block b's exp-sum relative to the overall max is exp(m_b - top) / w_b.
  double total = 0;
  for (int b = 0; b < n_blocks; ++b)
    total += std::exp(static_cast<double>(m[b * stride]) - top) / w[b * stride];
  std::fill_n(out, head_dim, 0.0f);
  for (int b = 0; b < n_blocks; ++b) {
    const double share = std::exp(static_cast<double>(m[b * stride]) - top) / w[b * stride] / total;
    kernels().axpy_f32(static_cast<float>(share), o + b * stride * head_dim, out, head_dim);
  }
}

void top_k(const float* scores, int64_t n, int k, int32_t* indices) {
  if (k < 0 || k > n) {
    throw std::invalid_argument("redwing::cpu::top_k: k = " + std::to_string(k) + " not in [0, " +
                                std::to_string(n) + "]");
  }
  if (k == 0) return;
  // a before b when its score is larger, or equal with a lower index. NaN ranks below every
  // number so that the order stays strict and weak (std algorithms require it).
  auto before = [scores](int32_t a, int32_t b) {
    const float sa = scores[a];
    const float sb = scores[b];
    const bool na = std::isnan(sa);
    const bool nb = std::isnan(sb);
    if (na != nb) return nb;
    if (!na && sa != sb) return sa > sb;
    return a < b;
  };
  if (k <= 32) {
    // Small k (expert routing: 8 of 128): keep a sorted list, insert only what beats its tail.
    int count = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t idx = static_cast<int32_t>(i);
      if (count == k && !before(idx, indices[k - 1])) continue;
      int pos = count < k ? count++ : k - 1;
      while (pos > 0 && before(idx, indices[pos - 1])) {
        indices[pos] = indices[pos - 1];
        --pos;
      }
      indices[pos] = idx;
    }
    return;
  }
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  std::copy(order.begin(), order.begin() + k, indices);
}

}  // namespace redwing::cpu
