// Tests of the CPU kernels (backend/cpu/kernels.h). Every kernel runs under each implementation
// this CPU supports (scalar, and AVX2 or NEON) and is checked against straightforward
// double-precision math written here, independently of the kernels' own helpers (the packing is
// built byte by byte, half floats are decoded with ldexp). Tolerances come from the float32
// summation error bound: a sum of n terms computed in any order is within about n * 2^-24 * sum|t|
// of the exact value, so each check states the number of additions it allows for.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"

using namespace redwing::cpu;

namespace {

constexpr double kEps = 1.0 / (1 << 24);  // float32 unit roundoff

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  const Isa before = active_isa();
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::amx, Isa::neon}) {
    if (set_active_isa(isa)) out.push_back(isa);
  }
  set_active_isa(before);
  return out;
}

// Every available ISA with qmatvec's integer method off, and again with it on where the ISA has
// it (kernels.h).
std::vector<std::pair<Isa, bool>> isa_and_product_pairs() {
  std::vector<std::pair<Isa, bool>> out;
  const Isa before = active_isa();
  const bool was = set_integer_exact_product(true);
  for (Isa isa : available_isas()) {
    out.emplace_back(isa, false);
    set_active_isa(isa);
    if (integer_exact_product_active()) out.emplace_back(isa, true);
  }
  set_integer_exact_product(was);
  set_active_isa(before);
  return out;
}

// Switches the implementation for one scope.
struct IsaScope {
  Isa saved = active_isa();
  explicit IsaScope(Isa isa) { REQUIRE(set_active_isa(isa)); }
  ~IsaScope() { set_active_isa(saved); }
};

// Turns qmatvec's integer method (kernels.h) on or off for one scope.
struct IntegerProductScope {
  bool saved;
  explicit IntegerProductScope(bool on) : saved(set_integer_exact_product(on)) {}
  ~IntegerProductScope() { set_integer_exact_product(saved); }
};

// ---- independent references for the 16-bit float formats -----------------------------------

double half_to_double(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  return sign * std::ldexp(1024.0 + m, e - 25);
}

double bf16_to_double(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  return static_cast<double>(std::bit_cast<float>(bits));
}

// The half nearest to v (ties to even), by searching the ordered encodings.
uint16_t nearest_half(double v) {
  if (std::isnan(v)) return 0x7e00;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (a >= 65520.0) return sign | 0x7c00;  // 65504 + half an ulp (16) and above: infinity
  uint16_t lo = 0;
  uint16_t hi = 0x7bff;
  while (lo < hi) {  // largest encoding with value <= a
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (half_to_double(mid) <= a) {
      lo = mid;
    } else {
      hi = static_cast<uint16_t>(mid - 1);
    }
  }
  const double below = half_to_double(lo);
  if (below == a || lo == 0x7bff) return sign | lo;
  const double above = half_to_double(static_cast<uint16_t>(lo + 1));
  const double d_lo = a - below;
  const double d_hi = above - a;
  if (d_lo < d_hi || (d_lo == d_hi && (lo & 1) == 0)) return sign | lo;
  return sign | static_cast<uint16_t>(lo + 1);
}

uint16_t nearest_bf16(float v) {
  // bf16 values are the float32 values with 16 zero low bits: pick the nearer of the two
  // truncations around v (ties to an even bf16 mantissa).
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double d_down = std::fabs(static_cast<double>(v) - bf16_to_double(down));
  const double d_up = std::fabs(bf16_to_double(up) - static_cast<double>(v));
  if (d_down < d_up || (d_down == d_up && (down & 1) == 0)) return down;
  return up;
}

// ---- quantized matrices built by hand -------------------------------------------------------

struct TestMatrix {
  int bits;
  int group_size;
  int64_t rows;
  int64_t cols;
  ScaleType type;
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales16, biases16;
  std::vector<float> scales32, biases32;
  std::vector<uint8_t> q;    // [rows, cols]
  std::vector<double> s, b;  // decoded scales and biases [rows, groups]
  QuantMatrix view() const {
    QuantMatrix m;
    m.packed = packed.data();
    m.scales = type == ScaleType::f32 ? static_cast<const void*>(scales32.data()) : scales16.data();
    m.biases = type == ScaleType::f32 ? static_cast<const void*>(biases32.data()) : biases16.data();
    m.scale_type = type;
    m.bits = bits;
    m.group_size = group_size;
    m.rows = rows;
    m.cols = cols;
    return m;
  }
  double w(int64_t r, int64_t c) const {
    const int64_t g = r * (cols / group_size) + c / group_size;
    return s[g] * q[r * cols + c] + b[g];
  }
  // The float32 value s * q + b, as the format defines it.
  float wf(int64_t r, int64_t c) const {
    const int64_t g = r * (cols / group_size) + c / group_size;
    return static_cast<float>(s[g]) * static_cast<float>(q[r * cols + c]) +
           static_cast<float>(b[g]);
  }
};

TestMatrix make_matrix(int bits, int group_size, int64_t rows, int64_t cols, ScaleType type,
                       uint32_t seed) {
  std::mt19937 rng(seed);
  TestMatrix m{bits, group_size, rows, cols, type, {}, {}, {}, {}, {}, {}, {}, {}};
  const int qmax = (1 << bits) - 1;
  std::uniform_int_distribution<int> qdist(0, qmax);
  m.q.resize(static_cast<size_t>(rows * cols));
  for (auto& v : m.q) v = static_cast<uint8_t>(qdist(rng));
  // Pack byte by byte: 4-bit puts element 2k in the low nibble of byte k, 8-bit element k in
  // byte k; on a little-endian machine that is the low-bits-first uint32 layout.
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols * bits / 8), 0);
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (bits == 8) {
      bytes[i] = m.q[i];
    } else {
      bytes[i / 2] |= static_cast<uint8_t>(m.q[i] << ((i % 2) * 4));
    }
  }
  m.packed.resize(bytes.size() / 4);
  std::memcpy(m.packed.data(), bytes.data(), bytes.size());

  // Scales of both signs (MLX negates s when the group's extreme is negative) and biases of
  // either sign, rounded to the scale type.
  const int64_t n_groups = rows * (cols / group_size);
  std::uniform_real_distribution<float> sdist(0.001f, 0.05f);
  std::uniform_real_distribution<float> bdist(-0.4f, 0.4f);
  for (int64_t i = 0; i < n_groups; ++i) {
    float s = sdist(rng) * ((rng() & 1) ? -1.0f : 1.0f);
    float b = bdist(rng);
    switch (type) {
      case ScaleType::bf16:
        m.scales16.push_back(nearest_bf16(s));
        m.biases16.push_back(nearest_bf16(b));
        m.s.push_back(bf16_to_double(m.scales16.back()));
        m.b.push_back(bf16_to_double(m.biases16.back()));
        break;
      case ScaleType::f16:
        m.scales16.push_back(nearest_half(s));
        m.biases16.push_back(nearest_half(b));
        m.s.push_back(half_to_double(m.scales16.back()));
        m.b.push_back(half_to_double(m.biases16.back()));
        break;
      case ScaleType::f32:
        m.scales32.push_back(s);
        m.biases32.push_back(b);
        m.s.push_back(s);
        m.b.push_back(b);
        break;
    }
  }
  return m;
}

std::vector<float> random_vector(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Error allowed for a float32 computation of sum_c w(r, c) x_c: every product and addition may
// round once, and the sum has at most group_size + groups + 4 additions on any path to the
// result, each adding at most eps times the magnitudes involved.
double row_tolerance(const TestMatrix& m, int64_t r, const float* x) {
  double mag = 0.0;
  for (int64_t c = 0; c < m.cols; ++c) {
    const int64_t g = r * (m.cols / m.group_size) + c / m.group_size;
    mag += (std::fabs(m.s[g] * m.q[r * m.cols + c]) + std::fabs(m.b[g])) * std::fabs(x[c]);
  }
  const double steps = m.group_size + m.cols / m.group_size + 4;
  return steps * kEps * mag + 1e-30;
}

// What the integer method (kernels.h) may add to row r's error besides float32's: each value of
// x is off by at most 2^-22 of the largest |x| among its 8, times |s q| of its weight.
double x24_unit_bound(const TestMatrix& m, int64_t r, const float* x) {
  double bound = 0.0;
  for (int64_t c = 0; c < m.cols; ++c) {
    double lane_max = 0.0;
    for (int64_t j = c / 8 * 8; j < c / 8 * 8 + 8; ++j)
      lane_max = std::max(lane_max, std::fabs(double{x[j]}));
    const int64_t g = r * (m.cols / m.group_size) + c / m.group_size;
    bound += std::fabs(m.s[g] * m.q[r * m.cols + c]) * std::ldexp(lane_max, -22);
  }
  return bound;
}

const char* type_name(ScaleType t) {
  return t == ScaleType::bf16 ? "bf16" : t == ScaleType::f16 ? "f16" : "f32";
}

}  // namespace

TEST_CASE("isa selection") {
  CHECK(set_active_isa(Isa::scalar));
  CHECK(active_isa() == Isa::scalar);
  CHECK(std::string(isa_name(Isa::scalar)) == "scalar");
  CHECK(std::string(isa_name(Isa::avx2)) == "avx2");
  CHECK(std::string(isa_name(Isa::neon)) == "neon");
  CHECK(std::string(isa_name(Isa::avx512)) == "avx512");
  CHECK(std::string(isa_name(Isa::amx)) == "amx");
  CHECK(set_active_isa(detect_isa()));
#if defined(__x86_64__)
  CHECK_FALSE(set_active_isa(Isa::neon));
  const std::string features = cpu_features();
  const bool has_avx2 = features.find("avx2") != std::string::npos &&
                        features.find("fma") != std::string::npos &&
                        features.find("f16c") != std::string::npos;
  const bool has_avx512 = has_avx2 && features.find("avx512bw") != std::string::npos &&
                          features.find("avx512dq") != std::string::npos &&
                          features.find("avx512vl") != std::string::npos;
  CHECK(set_active_isa(Isa::avx2) == has_avx2);
  CHECK(set_active_isa(Isa::avx512) == has_avx512);
  // cpu_features lists the matrix unit only when the OS granted the tile state too.
  const bool has_amx = has_avx512 && features.find("amx-bf16") != std::string::npos;
  CHECK(set_active_isa(Isa::amx) == has_amx);
  CHECK(has_matrix_product() == has_amx);
  CHECK(detect_isa() == (has_amx      ? Isa::amx
                         : has_avx512 ? Isa::avx512
                         : has_avx2   ? Isa::avx2
                                      : Isa::scalar));
  CHECK(set_active_isa(detect_isa()));
#endif
#if defined(__aarch64__)
  CHECK(detect_isa() == Isa::neon);
  CHECK_FALSE(set_active_isa(Isa::avx2));
  CHECK_FALSE(set_active_isa(Isa::avx512));
  CHECK_FALSE(set_active_isa(Isa::amx));
#endif
}

TEST_CASE("scalar float conversions match independent rounding") {
  SUBCASE("every half decodes exactly and round-trips") {
    for (uint32_t h = 0; h < 65536; ++h) {
      const auto bits = static_cast<uint16_t>(h);
      const float f = f16_to_f32(bits);
      const double want = half_to_double(bits);
      if (std::isnan(want)) {
        REQUIRE(std::isnan(f));
        REQUIRE(std::isnan(f16_to_f32(f32_to_f16(f))));
        continue;
      }
      REQUIRE(static_cast<double>(f) == want);
      REQUIRE(f32_to_f16(f) == bits);
      REQUIRE(bf16_to_f32(static_cast<uint16_t>(h)) == static_cast<float>(bf16_to_double(bits)));
    }
  }
  SUBCASE("f32 to f16 and bf16 round to nearest even") {
    std::vector<float> values = {0.0f,           -0.0f,          1.0f,          65504.0f,  65519.0f,
                                 65520.0f,       -65520.0f,      1e9f,          5.96e-8f,  2.98e-8f,
                                 2.9802322e-8f,  2.99e-8f,       6.1035156e-5f, 6.1e-5f,   1e-10f,
                                 1.00048828125f, 1.00146484375f, HUGE_VALF,     -HUGE_VALF};
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> bitsdist;
    for (int i = 0; i < 200000; ++i) {
      // Random bit patterns cover every exponent, including halfway cases near subnormals.
      float v = std::bit_cast<float>(bitsdist(rng));
      if (std::isnan(v)) continue;
      values.push_back(v);
      values.push_back(std::ldexp(v, -std::ilogb(v) + static_cast<int>(rng() % 40) - 26));
    }
    for (float v : values) {
      if (std::isnan(v) || std::isinf(v)) {
        if (std::isinf(v)) REQUIRE(f32_to_f16(v) == (v > 0 ? 0x7c00 : 0xfc00));
        continue;
      }
      INFO("v = " << v);
      REQUIRE(f32_to_f16(v) == nearest_half(v));
      if (std::fabs(v) < 3.38e38f) REQUIRE(f32_to_bf16(v) == nearest_bf16(v));
    }
    CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  }
}

TEST_CASE("array conversions agree with the scalar ones under every ISA") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bitsdist;
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {0, 1, 7, 8, 9, 31, 1000, 4099}) {
      CAPTURE(std::string(isa_name(isa)));
      CAPTURE(n);
      std::vector<float> f(static_cast<size_t>(n));
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        float v = std::bit_cast<float>(bitsdist(rng));
        if (std::isnan(v)) v = 1.5f;
        f[i] = std::ldexp(v, -std::ilogb(v) + static_cast<int>(rng() % 50) - 30);
        h[i] = static_cast<uint16_t>(rng());
      }
      std::vector<uint16_t> h_out(static_cast<size_t>(n));
      f32_to_f16(f.data(), h_out.data(), n);
      for (int64_t i = 0; i < n; ++i) REQUIRE(h_out[i] == f32_to_f16(f[i]));
      std::vector<float> f_out(static_cast<size_t>(n));
      f16_to_f32(h.data(), f_out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = f16_to_f32(h[i]);
        if (std::isnan(want)) {
          REQUIRE(std::isnan(f_out[i]));
        } else {
          REQUIRE(f_out[i] == want);
        }
      }
      bf16_to_f32(h.data(), f_out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = bf16_to_f32(h[i]);
        if (std::isnan(want)) {
          REQUIRE(std::isnan(f_out[i]));
        } else {
          REQUIRE(f_out[i] == want);
        }
      }
    }
  }
}

TEST_CASE("qdequant_row matches the hand-built packing") {
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (int bits : {4, 8}) {
      for (int gs : {32, 64, 128}) {
        for (ScaleType type : {ScaleType::bf16, ScaleType::f16, ScaleType::f32}) {
          CAPTURE(std::string(isa_name(isa)));
          CAPTURE(bits);
          CAPTURE(gs);
          CAPTURE(std::string(type_name(type)));
          const TestMatrix m = make_matrix(bits, gs, 5, gs * 5, type, 100 + bits + gs);
          std::vector<float> out(static_cast<size_t>(m.cols));
          for (int64_t r = 0; r < m.rows; ++r) {
            qdequant_row(m.view(), r, out.data());
            for (int64_t c = 0; c < m.cols; ++c) {
              // s * q + b with one or two roundings (FMA or not).
              const double tol = 2 * kEps *
                                 (std::fabs(m.s[r * (m.cols / gs) + c / gs] * m.q[r * m.cols + c]) +
                                  std::fabs(m.w(r, c)));
              REQUIRE(std::fabs(out[c] - m.w(r, c)) <= tol);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("qmatvec matches double-precision math on odd row ranges") {
  for (const auto& pair : isa_and_product_pairs()) {
    // (Named copies: clang 14 cannot capture structured bindings in CAPTURE's lambdas.)
    const Isa isa = pair.first;
    const bool integer = pair.second;
    IsaScope scope(isa);
    IntegerProductScope product(integer);
    CAPTURE(integer);
    for (int bits : {4, 8}) {
      for (int gs : {32, 64, 128}) {
        for (ScaleType type : {ScaleType::bf16, ScaleType::f16, ScaleType::f32}) {
          CAPTURE(std::string(isa_name(isa)));
          CAPTURE(bits);
          CAPTURE(gs);
          CAPTURE(std::string(type_name(type)));
          const int64_t rows = 37;
          const int64_t cols = gs * 7;
          const TestMatrix m = make_matrix(bits, gs, rows, cols, type, 1000 + bits * gs);
          const std::vector<float> x = random_vector(cols, 5);
          std::vector<float> y(static_cast<size_t>(rows), -12345.0f);
          // Several ranges, so row blocks of any SIMD width start and end unaligned.
          const std::pair<int64_t, int64_t> ranges[] = {{3, 4}, {5, 17}, {17, 17}, {18, 37}};
          for (auto [b, e] : ranges) qmatvec(m.view(), x.data(), y.data(), b, e);
          for (int64_t r = 0; r < rows; ++r) {
            const bool written = (r >= 3 && r < 4) || (r >= 5 && r < 17) || r >= 18;
            if (!written) {
              REQUIRE(y[r] == -12345.0f);  // rows outside every range stay untouched
              continue;
            }
            double want = 0.0;
            for (int64_t c = 0; c < cols; ++c) want += m.w(r, c) * x[c];
            CAPTURE(r);
            REQUIRE(std::fabs(y[r] - want) <= row_tolerance(m, r, x.data()));
          }
        }
      }
    }
  }
}

TEST_CASE("qmatvec SIMD agrees with scalar at a model shape") {
  // A shape like Gemma 4's attention projections, large enough to use every unrolled path.
  for (int bits : {4, 8}) {
    const TestMatrix m = make_matrix(bits, 64, 203, 2816, ScaleType::bf16, 77 + bits);
    const std::vector<float> x = random_vector(m.cols, 9, -3.0f, 3.0f);
    std::vector<float> want(static_cast<size_t>(m.rows));
    {
      IsaScope scope(Isa::scalar);
      qmatvec(m.view(), x.data(), want.data(), 0, m.rows);
    }
    for (const auto& pair : isa_and_product_pairs()) {
      // (Named copies: clang 14 cannot capture structured bindings in CAPTURE's lambdas.)
      const Isa isa = pair.first;
      const bool integer = pair.second;
      IsaScope scope(isa);
      IntegerProductScope product(integer);
      CAPTURE(integer);
      std::vector<float> y(static_cast<size_t>(m.rows));
      qmatvec(m.view(), x.data(), y.data(), 0, m.rows);
      for (int64_t r = 0; r < m.rows; ++r) {
        CAPTURE(std::string(isa_name(isa)));
        CAPTURE(bits);
        CAPTURE(r);
        // Both are within the bound of the exact value, so within twice it of each other.
        REQUIRE(std::fabs(y[r] - want[r]) <= 2 * row_tolerance(m, r, x.data()));
      }
    }
  }
}

TEST_CASE("qmatvec's integer method stays within float32 rounding on activations of any range") {
  // Values spread over 10^-6..10^6 next to each other, zeros, a lane of 8 zeros, values far
  // below float32's normal range, a row whose width ends in half a 128-value block (704 columns)
  // and all three group sizes: the error stays within 2^-22 of the largest |x| among each
  // value's 8 (the integer unit's bound) plus the float32 path's own bound.
  int checked = 0;
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    IntegerProductScope product(true);
    if (!integer_exact_product_active()) continue;
    for (int gs : {32, 64, 128}) {
      for (int64_t cols : {int64_t{gs} * 7, int64_t{704}}) {
        if (cols % gs != 0) continue;
        CAPTURE(std::string(isa_name(isa)));
        CAPTURE(gs);
        CAPTURE(cols);
        const TestMatrix m = make_matrix(4, gs, 29, cols, ScaleType::bf16, 300 + gs);
        std::vector<float> x = random_vector(cols, 11);
        const std::vector<float> spread = random_vector(cols, 12, -6.0f, 6.0f);
        for (int64_t c = 0; c < cols; ++c) x[c] *= std::pow(10.0f, spread[c]);
        for (int64_t c = 8; c < 16; ++c) x[c] = 0.0f;
        x[17] = 0.0f;
        x[18] = 1e-38f;
        x[19] = -3e-41f;  // subnormal
        std::vector<float> y(static_cast<size_t>(m.rows), -12345.0f);
        qmatvec(m.view(), x.data(), y.data(), 0, m.rows);
        for (int64_t r = 0; r < m.rows; ++r) {
          double want = 0.0;
          for (int64_t c = 0; c < cols; ++c) want += m.w(r, c) * x[c];
          CAPTURE(r);
          REQUIRE(std::fabs(y[r] - want) <=
                  x24_unit_bound(m, r, x.data()) + row_tolerance(m, r, x.data()));
          ++checked;
        }
        // inf or NaN anywhere in x reaches every row, as on the float32 path.
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), HUGE_VALF}) {
          std::vector<float> xb = x;
          xb[static_cast<size_t>(cols) - 3] = bad;
          qmatvec(m.view(), xb.data(), y.data(), 0, m.rows);
          for (int64_t r = 0; r < m.rows; ++r) REQUIRE(!std::isfinite(y[r]));
        }
      }
    }
  }
  if (checked == 0) MESSAGE("skipped: no ISA here has the integer method (AVX512-VNNI)");
}

TEST_CASE("qmatvec's integer method is off when asked, and tells") {
  IntegerProductScope product(false);
  CHECK_FALSE(integer_exact_product_active());
  CHECK_FALSE(set_integer_exact_product(false));
}

TEST_CASE("qmatmul_x24 gives every row of X the bits of qmatvec_x24, near double precision") {
  // Tokens 1, 3 and 50: one register tile, a tile and a remainder, and more than one token tile
  // (kernels_avx512vnni.cpp); rows in ranges that start and end inside the 4-row register tiles;
  // 704 columns end in half a 128-column block. Each token's row must have the bits the
  // single-row product gives it (prefill and decode agree), whichever range computed it, and
  // lie within the integer method's bound of double-precision math (as in the qmatvec test).
  int checked = 0;
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    IntegerProductScope product(true);
    if (!integer_exact_product_active()) continue;
    for (int gs : {32, 64, 128})
      for (int64_t cols : {int64_t{gs} * 5, int64_t{704}})
        for (ScaleType type : {ScaleType::bf16, ScaleType::f16, ScaleType::f32})
          for (int64_t n_x : {1, 3, 50}) {
            if (cols % gs != 0) continue;
            CAPTURE(std::string(isa_name(isa)));
            CAPTURE(gs);
            CAPTURE(cols);
            CAPTURE(std::string(type_name(type)));
            CAPTURE(n_x);
            const int64_t rows = 23, x_stride = cols + 5, y_stride = rows + 2;
            const TestMatrix m = make_matrix(4, gs, rows, cols, type, 900 + gs);
            std::vector<float> x = random_vector(n_x * x_stride, 41, -2.0f, 2.0f);
            // Values over many magnitudes, so the lanes' units differ.
            const std::vector<float> spread = random_vector(n_x * x_stride, 42, -4.0f, 4.0f);
            for (size_t i = 0; i < x.size(); ++i) x[i] *= std::pow(10.0f, spread[i]);
            X24Buffer xs;
            REQUIRE(xs.resize(n_x, cols, gs));
            for (int64_t t = 0; t < n_x; ++t) REQUIRE(xs.prepare_row(t, x.data() + t * x_stride));
            REQUIRE(xs.rows() == n_x);
            std::vector<float> y(static_cast<size_t>(n_x * y_stride), -7.0f);
            const std::pair<int64_t, int64_t> ranges[] = {{1, 6}, {6, 6}, {6, 19}, {19, 22}};
            for (auto [b, e] : ranges) qmatmul_x24(m.view(), xs, y.data(), y_stride, b, e);
            for (int64_t t = 0; t < n_x; ++t) {
              const float* xt = x.data() + t * x_stride;
              X24Buffer one;
              REQUIRE(one.prepare(xt, cols, gs));
              std::vector<float> want(static_cast<size_t>(rows));
              qmatvec_x24(m.view(), one, want.data(), 0, rows);
              for (int64_t r = 0; r < y_stride; ++r) {
                CAPTURE(t);
                CAPTURE(r);
                const float got = y[t * y_stride + r];
                if (r < 1 || r >= 22) {
                  REQUIRE(got == -7.0f);  // rows outside every range stay untouched
                  continue;
                }
                REQUIRE(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want[r]));
                double exact = 0.0;
                for (int64_t c = 0; c < cols; ++c) exact += m.w(r, c) * xt[c];
                REQUIRE(std::fabs(got - exact) <=
                        x24_unit_bound(m, r, xt) + row_tolerance(m, r, xt));
                ++checked;
              }
            }
          }
  }
  if (checked == 0) MESSAGE("skipped: no ISA here has the integer method (AVX512-VNNI)");
}

TEST_CASE("X24Buffer rows: inf and NaN refused per row, bad shapes and inputs refused") {
  IntegerProductScope product(true);
  const std::vector<float> x = random_vector(3 * 64, 8);
  X24Buffer xs;
  CHECK_THROWS_AS(xs.resize(2, 48, 32), std::invalid_argument);  // not whole groups
  CHECK_THROWS_AS(xs.resize(0, 64, 32), std::invalid_argument);
  if (!integer_exact_product_active()) {
    CHECK_FALSE(xs.resize(3, 64, 32));  // no integer method here: the caller uses float32
    CHECK(xs.rows() == 0);
    MESSAGE("skipped the rest: no ISA here has the integer method (AVX512-VNNI)");
    return;
  }
  REQUIRE(xs.resize(3, 64, 32));
  CHECK_THROWS_AS(xs.prepare_row(3, x.data()), std::logic_error);
  CHECK(xs.prepare_row(0, x.data()));
  std::vector<float> bad(x.begin() + 64, x.begin() + 128);
  bad[17] = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(xs.prepare_row(1, bad.data()));
  bad[17] = -HUGE_VALF;
  CHECK_FALSE(xs.prepare_row(1, bad.data()));
  const TestMatrix four = make_matrix(4, 32, 4, 64, ScaleType::bf16, 1);
  const TestMatrix eight = make_matrix(8, 32, 4, 64, ScaleType::bf16, 1);
  const TestMatrix wide = make_matrix(4, 32, 4, 128, ScaleType::bf16, 1);
  const TestMatrix other_group = make_matrix(4, 64, 4, 64, ScaleType::bf16, 1);
  std::vector<float> y(3 * 4);
  CHECK_THROWS_AS(qmatmul_x24(eight.view(), xs, y.data(), 4, 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(qmatmul_x24(wide.view(), xs, y.data(), 4, 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(qmatmul_x24(other_group.view(), xs, y.data(), 4, 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(qmatmul_x24(four.view(), xs, y.data(), 3, 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(qmatmul_x24(four.view(), xs, y.data(), 4, 2, 5), std::invalid_argument);
  xs.clear();
  CHECK(xs.rows() == 0);
  CHECK_THROWS_AS(qmatmul_x24(four.view(), xs, y.data(), 4, 0, 4), std::invalid_argument);
}

TEST_CASE("qmatmul matches double-precision math for every row of X") {
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (int bits : {4, 8}) {
      for (int gs : {32, 128}) {
        for (int64_t n_x : {1, 3, 7, 20}) {
          CAPTURE(std::string(isa_name(isa)));
          CAPTURE(bits);
          CAPTURE(gs);
          CAPTURE(n_x);
          const int64_t rows = 23;
          const int64_t cols = gs * 5;
          const TestMatrix m = make_matrix(bits, gs, rows, cols, ScaleType::f16, 31 + bits + gs);
          const int64_t x_stride = cols + 3;
          const int64_t y_stride = rows + 2;
          const std::vector<float> x = random_vector(n_x * x_stride, 17);
          std::vector<float> y(static_cast<size_t>(n_x * y_stride), -7.0f);
          qmatmul(m.view(), x.data(), n_x, x_stride, y.data(), y_stride, 2, 21);
          for (int64_t t = 0; t < n_x; ++t) {
            for (int64_t r = 0; r < y_stride; ++r) {
              const float got = y[t * y_stride + r];
              if (r < 2 || r >= 21) {
                REQUIRE(got == -7.0f);
                continue;
              }
              const float* xt = x.data() + t * x_stride;
              double want = 0.0;
              double mag = 0.0;
              for (int64_t c = 0; c < cols; ++c) {
                // qmatmul dequantizes s * q + b in float32 first (like MLX's qmm), so the
                // reference uses the float32 weights and the bound covers the dot product.
                want += static_cast<double>(m.wf(r, c)) * xt[c];
                mag += std::fabs(static_cast<double>(m.wf(r, c)) * xt[c]);
              }
              CAPTURE(t);
              CAPTURE(r);
              REQUIRE(std::fabs(got - want) <= (cols + 2) * kEps * mag + 1e-30);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("qmatmul's blocks and tiles: odd rows, tokens and columns under every ISA") {
  // Shapes that cut every block of the AVX2 kernel (kernels_avx2.cpp): two 256-column K blocks
  // and a narrower one (128, 64 or 96 columns: the 96 ends in half of a 4-bit 64-column chunk);
  // 150 rows, in ranges that start and end inside 16-row panels and cross a 128-row block; 13
  // tokens are two 6-token tiles and one more, and the first 1, 5, 6 and 7 of them every other
  // remainder. Each ISA must be within float32 summation error of double-precision math and
  // give a row the same bits whichever range computed it (the backend's row chunks vary with
  // the thread count and batch).
  const int64_t rows = 150;
  const int64_t n_x = 13;
  const int64_t y_stride = rows + 3;
  const std::pair<int64_t, int64_t> ranges[] = {{0, 1}, {1, 19}, {19, 147}, {147, 150}};
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      const int64_t cols = gs == 128 ? 640 : gs == 64 ? 576 : 608;
      const int64_t x_stride = cols + 5;
      const std::vector<float> x = random_vector(n_x * x_stride, 23, -2.0f, 2.0f);
      for (ScaleType type : {ScaleType::bf16, ScaleType::f16, ScaleType::f32}) {
        const TestMatrix m = make_matrix(bits, gs, rows, cols, type, 300 + bits + gs);
        std::vector<double> want(static_cast<size_t>(n_x * rows)), mag(want.size());
        for (int64_t t = 0; t < n_x; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < cols; ++c) {
              const double p = static_cast<double>(m.wf(r, c)) * x[t * x_stride + c];
              want[t * rows + r] += p;
              mag[t * rows + r] += std::fabs(p);
            }
          }
        }
        for (Isa isa : available_isas()) {
          IsaScope scope(isa);
          for (int64_t n : {1, 5, 6, 7, 13}) {
            std::vector<float> whole(static_cast<size_t>(n_x * y_stride), -7.0f);
            std::vector<float> parts(whole);
            qmatmul(m.view(), x.data(), n, x_stride, whole.data(), y_stride, 0, rows);
            for (auto [b, e] : ranges)
              qmatmul(m.view(), x.data(), n, x_stride, parts.data(), y_stride, b, e);
            for (int64_t t = 0; t < n_x; ++t) {
              for (int64_t r = 0; r < y_stride; ++r) {
                const float got = whole[t * y_stride + r];
                CAPTURE(std::string(isa_name(isa)));
                CAPTURE(bits);
                CAPTURE(gs);
                CAPTURE(static_cast<int>(type));
                CAPTURE(n);
                CAPTURE(t);
                CAPTURE(r);
                REQUIRE(std::bit_cast<uint32_t>(parts[t * y_stride + r]) ==
                        std::bit_cast<uint32_t>(got));
                if (t >= n || r >= rows) {
                  REQUIRE(got == -7.0f);  // tokens and rows past the product stay untouched
                  continue;
                }
                const size_t i = static_cast<size_t>(t * rows + r);
                REQUIRE(std::fabs(got - want[i]) <= (cols + 2) * kEps * mag[i] + 1e-30);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("split_bf16x3: three bfloat16 parts add up to every float32 exactly") {
  std::mt19937 rng(5);
  auto check = [](float x) {
    uint16_t hi = 0, mid = 0, lo = 0;
    split_bf16x3(x, hi, mid, lo);
    CAPTURE(x);
    // The sum in double is exact (three values within 2^48 of each other's scale). Below 2^-110
    // the last part would need bits under bfloat16's smallest subnormal (2^-133) and is cut.
    const double sum = bf16_to_double(hi) + bf16_to_double(mid) + bf16_to_double(lo);
    if (std::fabs(x) >= 0x1p-110f)
      REQUIRE(sum == static_cast<double>(x));
    else
      REQUIRE(std::fabs(sum - static_cast<double>(x)) < 0x1p-133);
  };
  for (int i = 0; i < 200000; ++i) {
    // Every finite bit pattern is equally likely: all exponents, subnormals, both signs.
    const uint32_t bits = static_cast<uint32_t>(rng());
    const float x = std::bit_cast<float>(bits);
    if (!std::isfinite(x)) continue;
    check(x);
  }
  for (float x : {0.0f, -0.0f, 1.0f, 1.0f + 0x1p-23f, -3.0f - 0x1p-22f,
                  std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                  std::nextafter(1.0f, 2.0f), std::nextafter(0.5f, 0.0f)})
    check(x);
  uint16_t hi = 1, mid = 1, lo = 1;
  split_bf16x3(std::numeric_limits<float>::infinity(), hi, mid, lo);
  CHECK(hi == 0x7f80);
  CHECK((mid | lo) == 0);
  // A NaN whose payload sits in the low 16 bits must not become inf when they are cleared.
  split_bf16x3(std::bit_cast<float>(0x7f800001u), hi, mid, lo);
  CHECK(std::isnan(bf16_to_double(hi)));
  CHECK((mid | lo) == 0);
}

TEST_CASE("qmatmul_split matches double-precision math under every ISA, odd shapes") {
  // 45 rows and ranges that are not multiples of the 16- or 32-row blocks of the matrix unit;
  // token counts below, at and past its 16-token tiles.
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      for (ScaleType type : {ScaleType::bf16, ScaleType::f16, ScaleType::f32}) {
        const int64_t rows = 45;
        const int64_t cols = gs * (gs == 128 ? 3 : 5);
        const TestMatrix m = make_matrix(bits, gs, rows, cols, type, 7 + bits + gs);
        for (int64_t n_x : {1, 5, 16, 33}) {
          CAPTURE(bits);
          CAPTURE(gs);
          CAPTURE(type_name(type));
          CAPTURE(n_x);
          const int64_t x_stride = cols + 3;
          const int64_t y_stride = rows + 2;
          // Magnitudes from 1e-3 to 1e3 in one row, so that mid and lo carry real bits.
          std::vector<float> x = random_vector(n_x * x_stride, 19 + static_cast<uint32_t>(n_x));
          for (size_t i = 0; i < x.size(); ++i)
            x[i] *= std::pow(10.0f, static_cast<float>(i % 7) - 3);
          SplitActivation xs;
          xs.split(x.data(), n_x, x_stride, cols);
          // The exact products and their float32 bounds, once for every range below.
          std::vector<double> want(static_cast<size_t>(n_x * rows)), bound(want.size());
          for (int64_t t = 0; t < n_x; ++t) {
            const float* xt = x.data() + t * x_stride;
            for (int64_t r = 0; r < rows; ++r) {
              double sum = 0.0;
              for (int64_t c = 0; c < cols; ++c) sum += m.w(r, c) * xt[c];
              want[static_cast<size_t>(t * rows + r)] = sum;
              bound[static_cast<size_t>(t * rows + r)] = row_tolerance(m, r, xt);
            }
          }
          for (Isa isa : available_isas()) {
            IsaScope scope(isa);
            CAPTURE(std::string(isa_name(isa)));
            // Plain loop variables: clang 14 (the sanitizer build) cannot CAPTURE a structured
            // binding.
            for (const std::pair<int64_t, int64_t>& range :
                 {std::pair<int64_t, int64_t>{0, rows}, {3, 42}, {17, 18}}) {
              const int64_t rb = range.first;
              const int64_t re = range.second;
              CAPTURE(rb);
              CAPTURE(re);
              std::vector<float> y(static_cast<size_t>(n_x * y_stride), -7.0f);
              qmatmul_split(m.view(), xs, y.data(), y_stride, rb, re);
              for (int64_t t = 0; t < n_x; ++t) {
                for (int64_t r = 0; r < y_stride; ++r) {
                  const float got = y[t * y_stride + r];
                  if (r < rb || r >= re) {
                    REQUIRE(got == -7.0f);
                    continue;
                  }
                  CAPTURE(t);
                  CAPTURE(r);
                  const size_t i = static_cast<size_t>(t * rows + r);
                  REQUIRE(std::fabs(got - want[i]) <= bound[i]);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("qmatmul_split: every ISA within summation order of the scalar reference") {
  // A Gemma width (2816 columns; 150 rows: more than one pass of the matrix unit's 128-row
  // blocks, and a partial block) at 36 tokens (token tiles in a pair and alone), with inputs of
  // very different sizes; each ISA against the scalar version of the same sums.
  const int64_t rows = 150;
  const TestMatrix m = make_matrix(4, 64, rows, 2816, ScaleType::bf16, 3);
  const int64_t n_x = 36;
  std::vector<float> x = random_vector(n_x * 2816, 23);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, static_cast<int>(i % 61) - 30);
  SplitActivation xs;
  xs.split(x.data(), n_x, 2816, 2816);
  std::vector<float> want(static_cast<size_t>(n_x * rows));
  {
    IsaScope scalar(Isa::scalar);
    qmatmul_split(m.view(), xs, want.data(), rows, 0, rows);
  }
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    CAPTURE(std::string(isa_name(isa)));
    std::vector<float> got(want.size(), 0.0f);
    qmatmul_split(m.view(), xs, got.data(), rows, 0, rows);
    for (int64_t t = 0; t < n_x; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        CAPTURE(t);
        CAPTURE(r);
        REQUIRE(std::fabs(got[t * rows + r] - want[t * rows + r]) <=
                2 * row_tolerance(m, r, x.data() + t * 2816));
      }
    }
    // The qmatmul entry point gives the same products on the matrix unit (it splits itself).
    if (isa == Isa::amx) {
      std::vector<float> via_qmatmul(want.size(), 0.0f);
      qmatmul(m.view(), x.data(), n_x, 2816, via_qmatmul.data(), rows, 0, rows);
      REQUIRE(via_qmatmul == got);
    }
  }
}

TEST_CASE("qmatmul_split: inf and NaN inputs give non-finite rows, subnormals are harmless") {
  const TestMatrix m = make_matrix(4, 32, 20, 64, ScaleType::bf16, 9);
  std::vector<float> x = random_vector(3 * 64, 4);
  x[5] = std::numeric_limits<float>::infinity();                   // token 0
  x[64 + 40] = std::numeric_limits<float>::quiet_NaN();            // token 1
  for (int c = 0; c < 64; ++c) x[128 + c] = 1e-40f * (c % 3 - 1);  // token 2: subnormal
  SplitActivation xs;
  xs.split(x.data(), 3, 64, 64);
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    CAPTURE(std::string(isa_name(isa)));
    std::vector<float> y(3 * 20, 0.0f);
    qmatmul_split(m.view(), xs, y.data(), 20, 0, 20);
    for (int r = 0; r < 20; ++r) {
      CHECK_FALSE(std::isfinite(y[r]));
      CHECK(std::isnan(y[20 + r]));
      CHECK(std::fabs(y[40 + r]) <= 1e-30f);
    }
  }
}

TEST_CASE("qmatmul_split refuses mismatched inputs") {
  const TestMatrix m = make_matrix(4, 32, 4, 64, ScaleType::bf16, 3);
  SplitActivation xs;
  CHECK_THROWS_AS(xs.resize(2, 48), std::invalid_argument);
  std::vector<float> x(128, 1.0f), y(8);  // room for 2 rows of 64
  xs.split(x.data(), 1, 96, 96);
  CHECK_THROWS_AS(qmatmul_split(m.view(), xs, y.data(), 4, 0, 4), std::invalid_argument);
  xs.split(x.data(), 2, 64, 64);
  CHECK_THROWS_AS(qmatmul_split(m.view(), xs, y.data(), 4, 0, 5), std::invalid_argument);
  CHECK_THROWS_AS(qmatmul_split(m.view(), xs, y.data(), 3, 0, 4), std::invalid_argument);
}

TEST_CASE("quantized kernels reject bad matrices and ranges") {
  const TestMatrix m = make_matrix(4, 32, 4, 64, ScaleType::bf16, 3);
  std::vector<float> x(64, 1.0f), y(4);
  QuantMatrix bad = m.view();
  bad.bits = 3;
  CHECK_THROWS_AS(qmatvec(bad, x.data(), y.data(), 0, 4), std::invalid_argument);
  bad = m.view();
  bad.group_size = 48;
  CHECK_THROWS_AS(qmatvec(bad, x.data(), y.data(), 0, 4), std::invalid_argument);
  bad = m.view();
  bad.cols = 80;
  CHECK_THROWS_AS(qmatmul(bad, x.data(), 1, 80, y.data(), 4, 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(qmatvec(m.view(), x.data(), y.data(), 0, 5), std::invalid_argument);
  CHECK_THROWS_AS(qmatvec(m.view(), x.data(), y.data(), 3, 2), std::invalid_argument);
  CHECK_THROWS_AS(qdequant_row(m.view(), 4, x.data()), std::out_of_range);
}

TEST_CASE("dot and axpy, f32 and f16") {
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {0, 1, 5, 8, 15, 16, 33, 257, 2816}) {
      CAPTURE(std::string(isa_name(isa)));
      CAPTURE(n);
      const std::vector<float> a = random_vector(n, 1);
      const std::vector<float> bf = random_vector(n, 2, -4.0f, 4.0f);
      std::vector<uint16_t> bh(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) bh[i] = nearest_half(bf[i]);
      double want32 = 0.0, want16 = 0.0, mag32 = 0.0, mag16 = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        want32 += static_cast<double>(a[i]) * bf[i];
        mag32 += std::fabs(static_cast<double>(a[i]) * bf[i]);
        want16 += a[i] * half_to_double(bh[i]);
        mag16 += std::fabs(a[i] * half_to_double(bh[i]));
      }
      CHECK(std::fabs(dot_f32(a.data(), bf.data(), n) - want32) <= (n + 1) * kEps * mag32);
      CHECK(std::fabs(dot_f16(a.data(), bh.data(), n) - want16) <= (n + 1) * kEps * mag16);

      std::vector<float> y32 = random_vector(n, 3);
      std::vector<float> y16 = y32;
      const std::vector<float> y0 = y32;
      axpy_f32(-0.75f, bf.data(), y32.data(), n);
      axpy_f16(1.25f, bh.data(), y16.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double w32 = y0[i] - 0.75 * bf[i];
        const double w16 = y0[i] + 1.25 * half_to_double(bh[i]);
        REQUIRE(std::fabs(y32[i] - w32) <= 2 * kEps * (std::fabs(y0[i]) + 0.75 * std::fabs(bf[i])));
        REQUIRE(std::fabs(y16[i] - w16) <=
                2 * kEps * (std::fabs(y0[i]) + 1.25 * std::fabs(half_to_double(bh[i]))));
      }
    }
  }
}

TEST_CASE("rms_norm with and without weights, in place") {
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (int64_t n : {1, 7, 256, 2816}) {
      for (float offset : {0.0f, 1.0f}) {
        for (bool with_weight : {true, false}) {
          CAPTURE(std::string(isa_name(isa)));
          CAPTURE(n);
          CAPTURE(offset);
          CAPTURE(with_weight);
          const std::vector<float> x = random_vector(n, 4, -5.0f, 5.0f);
          const std::vector<float> wt = random_vector(n, 6, -2.0f, 2.0f);
          double ss = 0.0;
          for (float v : x) ss += static_cast<double>(v) * v;
          const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
          std::vector<float> y = x;  // aliasing x and y is allowed
          rms_norm(y.data(), with_weight ? wt.data() : nullptr, offset, 1e-6f, n, y.data());
          for (int64_t i = 0; i < n; ++i) {
            const double scale = with_weight ? offset + static_cast<double>(wt[i]) : 1.0;
            const double want = x[i] * inv * scale;
            // The sum of squares errs by up to n eps relative; halved by the square root, plus
            // a few roundings for the multiplications.
            REQUIRE(std::fabs(y[i] - want) <= (n / 2.0 + 6) * kEps * std::fabs(want) + 1e-30);
          }
        }
      }
    }
  }
}

TEST_CASE("gelu_tanh_mul, softcap, softmax and rope") {
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    CAPTURE(std::string(isa_name(isa)));
    const int64_t n = 1037;
    std::vector<float> gate = random_vector(n, 8, -6.0f, 6.0f);
    gate[0] = 0.0f;
    gate[1] = -20.0f;
    gate[2] = 20.0f;
    const std::vector<float> up = random_vector(n, 9, -3.0f, 3.0f);
    std::vector<float> out(static_cast<size_t>(n));
    gelu_tanh_mul(gate.data(), up.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i];
      const double want =
          0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * up[i];
      // tanh approximations are allowed a few ulps; 1e-6 absolute covers cancellation near -x.
      REQUIRE(std::fabs(out[i] - want) <= 16 * kEps * std::fabs(g * up[i]) + 1e-6);
    }

    std::vector<float> logits = random_vector(n, 10, -80.0f, 80.0f);
    const std::vector<float> raw = logits;
    softcap(logits.data(), n, 30.0f);
    for (int64_t i = 0; i < n; ++i) {
      const double want = 30.0 * std::tanh(raw[i] / 30.0);
      REQUIRE(std::fabs(logits[i] - want) <=
              16 * kEps * 30.0 * std::fabs(std::tanh(raw[i] / 30.0)) + 1e-6);
    }
    // NaN stays NaN (as std::tanh), so a broken model's logits are caught, not capped to 30.
    std::vector<float> nan_row(16, std::nanf(""));
    softcap(nan_row.data(), 16, 30.0f);
    for (float x : nan_row) REQUIRE(std::isnan(x));

    for (int64_t len : {1, 8, 13, 128, 1037}) {
      std::vector<float> p = random_vector(len, 12, -30.0f, 30.0f);
      const std::vector<float> p0 = p;
      softmax(p.data(), len);
      const double m = *std::max_element(p0.begin(), p0.end());
      double z = 0.0;
      for (float v : p0) z += std::exp(v - m);
      for (int64_t i = 0; i < len; ++i) {
        const double want = std::exp(p0[i] - m) / z;
        REQUIRE(std::fabs(p[i] - want) <= (len + 16) * kEps * want + 1e-12);
      }
    }

    const int64_t heads = 3, head_dim = 512;
    std::vector<float> v = random_vector(heads * head_dim, 13);
    const std::vector<float> v0 = v;
    std::vector<float> c(head_dim / 2), s(head_dim / 2);
    for (int64_t j = 0; j < head_dim / 2; ++j) {
      c[j] = static_cast<float>(std::cos(0.37 * j));
      s[j] = static_cast<float>(std::sin(0.37 * j));
    }
    rope_neox(v.data(), heads, head_dim, c.data(), s.data());
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < head_dim / 2; ++j) {
        const double a = v0[h * head_dim + j], b = v0[h * head_dim + j + head_dim / 2];
        const double w1 = a * c[j] - b * s[j];
        const double w2 = b * c[j] + a * s[j];
        const double tol = 3 * kEps * (std::fabs(a) + std::fabs(b));
        REQUIRE(std::fabs(v[h * head_dim + j] - w1) <= tol);
        REQUIRE(std::fabs(v[h * head_dim + j + head_dim / 2] - w2) <= tol);
      }
    }
  }
}

TEST_CASE("top_k orders by score, ties by index, NaN last") {
  std::mt19937 rng(21);
  for (int64_t n : {1, 8, 128, 5000}) {
    for (int k : {1, 4, 8, 40}) {
      if (k > n) continue;
      std::vector<float> scores(static_cast<size_t>(n));
      // Few distinct values, so ties are common.
      for (auto& v : scores) v = static_cast<float>(static_cast<int>(rng() % 50)) * 0.5f;
      if (n > 3) scores[2] = std::numeric_limits<float>::quiet_NaN();
      std::vector<int32_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        const bool na = std::isnan(scores[a]), nb = std::isnan(scores[b]);
        if (na || nb) return !na && nb;
        return scores[a] > scores[b];
      });
      std::vector<int32_t> got(static_cast<size_t>(k));
      top_k(scores.data(), n, k, got.data());
      CAPTURE(n);
      CAPTURE(k);
      for (int i = 0; i < k; ++i) REQUIRE(got[i] == order[i]);
    }
  }
  std::vector<float> s(4, 0.0f);
  int32_t idx[8];
  CHECK_THROWS_AS(top_k(s.data(), 4, 5, idx), std::invalid_argument);
}

// ---- 8-bit activations ------------------------------------------------------------------------

namespace {

// The 8-bit-activation product as kernels.h defines it, in double precision from the test's own
// quantization of x: d = max|x| / 127 per block of 32, a = nearest integer of x * (127 / max|x|)
// (computed in float32, as the definition says), then
// sum_g s_g * sum_blocks d * sum(q * a) + b_g * sum_{c in g} x_c.
struct Q8Reference {
  std::vector<int> a;
  std::vector<double> d;
  explicit Q8Reference(const std::vector<float>& x) {
    a.resize(x.size());
    for (size_t b = 0; b * kQ8Block < x.size(); ++b) {
      float amax = 0.0f;
      for (int i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(x[b * kQ8Block + i]));
      d.push_back(static_cast<double>(amax / 127.0f));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int i = 0; i < kQ8Block; ++i)
        a[b * kQ8Block + i] = static_cast<int>(std::nearbyint(x[b * kQ8Block + i] * inv));
    }
  }
  // The value and the magnitude of its terms (for the float32 rounding tolerance).
  std::pair<double, double> row(const TestMatrix& m, int64_t r, const std::vector<float>& x) const {
    double value = 0.0, mag = 0.0;
    const int64_t gpr = m.cols / m.group_size;
    for (int64_t g = 0; g < gpr; ++g) {
      double sq = 0.0, sx = 0.0, sx_mag = 0.0;
      for (int64_t c = g * m.group_size; c < (g + 1) * m.group_size; ++c) {
        sq += d[static_cast<size_t>(c / kQ8Block)] * m.q[r * m.cols + c] * a[c];
        sx += x[c];
        sx_mag += std::fabs(x[c]);
        mag += std::fabs(m.s[r * gpr + g] * d[static_cast<size_t>(c / kQ8Block)] *
                         m.q[r * m.cols + c] * a[c]);
      }
      value += m.s[r * gpr + g] * sq + m.b[r * gpr + g] * sx;
      mag += std::fabs(m.b[r * gpr + g]) * sx_mag;
    }
    return {value, mag};
  }
};

}  // namespace

TEST_CASE("qmatvec_q8 computes the 8-bit-activation product on odd row ranges") {
  for (Isa isa : available_isas()) {
    IsaScope scope(isa);
    for (int bits : {4, 8}) {
      for (int gs : {32, 64, 128}) {
        for (ScaleType type : {ScaleType::bf16, ScaleType::f32}) {
          CAPTURE(std::string(isa_name(isa)));
          CAPTURE(bits);
          CAPTURE(gs);
          CAPTURE(std::string(type_name(type)));
          // 7 groups: partial 128-value blocks for every group size below 128.
          const int64_t rows = 37, cols = gs * 7;
          const TestMatrix m = make_matrix(bits, gs, rows, cols, type, 3000 + bits * gs);
          std::vector<float> x = random_vector(cols, 11, -2.0f, 2.0f);
          for (int64_t c = 0; c < kQ8Block; ++c) x[c] = 0.0f;  // an all-zero block (d = 0)
          Q8Buffer xa;
          xa.quantize(x.data(), 1, cols, cols, bits);
          const Q8Reference ref(x);
          std::vector<float> y(static_cast<size_t>(rows), -12345.0f);
          const std::pair<int64_t, int64_t> ranges[] = {{3, 4}, {5, 17}, {17, 17}, {18, 37}};
          for (auto [b, e] : ranges) qmatvec_q8(m.view(), xa.row(0), y.data(), b, e);
          for (int64_t r = 0; r < rows; ++r) {
            const bool written = (r >= 3 && r < 4) || (r >= 5 && r < 17) || r >= 18;
            if (!written) {
              REQUIRE(y[r] == -12345.0f);
              continue;
            }
            const auto [want, mag] = ref.row(m, r, x);
            CAPTURE(r);
            // Integer sums are exact; float32 adds at most a few roundings per term.
            REQUIRE(std::fabs(y[r] - want) <= (gs + cols / 8 + 8) * kEps * mag + 1e-30);
          }
        }
      }
    }
  }
}

TEST_CASE("qmatvec_q8 stays within the int8 rounding of the exact product") {
  for (int bits : {4, 8}) {
    const TestMatrix m = make_matrix(bits, 64, 64, 2816, ScaleType::bf16, 91 + bits);
    const std::vector<float> x = random_vector(m.cols, 12, -3.0f, 3.0f);
    Q8Buffer xa;
    xa.quantize(x.data(), 1, m.cols, m.cols, bits);
    const Q8Reference ref(x);
    std::vector<float> y(static_cast<size_t>(m.rows));
    qmatvec_q8(m.view(), xa.row(0), y.data(), 0, m.rows);
    double worst_ratio = 0.0;
    for (int64_t r = 0; r < m.rows; ++r) {
      double exact = 0.0, bound = 0.0;
      for (int64_t c = 0; c < m.cols; ++c) {
        const int64_t g = r * (m.cols / m.group_size) + c / m.group_size;
        exact += m.w(r, c) * x[c];
        // |x - d a| <= d / 2, and only s * q multiplies the rounded value.
        bound += std::fabs(m.s[g] * m.q[r * m.cols + c]) * ref.d[c / kQ8Block] / 2;
      }
      CAPTURE(r);
      REQUIRE(std::fabs(y[r] - exact) <= bound * 1.001 + 1e-4);
      worst_ratio = std::max(worst_ratio, std::fabs(y[r] - exact) / bound);
    }
    // Random rounding errors cancel: the typical error is far below the worst-case bound.
    CHECK(worst_ratio < 0.2);
  }
}

TEST_CASE("qmatvec_q8 SIMD agrees with scalar at model shapes") {
  for (int bits : {4, 8}) {
    for (int64_t cols : {2816, 704, 256, 128}) {
      const TestMatrix m = make_matrix(bits, 64, 203, cols, ScaleType::bf16, 177 + bits);
      const std::vector<float> x = random_vector(m.cols, 19, -3.0f, 3.0f);
      Q8Buffer xa;
      xa.quantize(x.data(), 1, m.cols, m.cols, bits);
      const Q8Reference ref(x);
      std::vector<float> want(static_cast<size_t>(m.rows));
      {
        IsaScope scope(Isa::scalar);
        qmatvec_q8(m.view(), xa.row(0), want.data(), 0, m.rows);
      }
      for (Isa isa : available_isas()) {
        IsaScope scope(isa);
        std::vector<float> y(static_cast<size_t>(m.rows));
        qmatvec_q8(m.view(), xa.row(0), y.data(), 0, m.rows);
        for (int64_t r = 0; r < m.rows; ++r) {
          CAPTURE(std::string(isa_name(isa)));
          CAPTURE(bits);
          CAPTURE(cols);
          CAPTURE(r);
          const double mag = ref.row(m, r, x).second;
          REQUIRE(std::fabs(y[r] - want[r]) <= 2 * (64 + cols / 8 + 8) * kEps * mag);
        }
      }
    }
  }
}

TEST_CASE("qmatmul_q8 gives every row of X the bits of qmatvec_q8") {
  for (Isa isa : available_isas())
    for (int bits : {4, 8})
      for (int gs : {32, 64})
        for (int64_t n_x : {7, 130})
          for (int64_t cols : {704, 256, 128}) {
            IsaScope scope(isa);
            CAPTURE(bits);
            CAPTURE(gs);
            CAPTURE(n_x);
            CAPTURE(cols);
            const TestMatrix m = make_matrix(bits, gs, 50, cols, ScaleType::bf16, 5);
            const int64_t x_stride = 720, y_stride = 53;
            const std::vector<float> x = random_vector(n_x * x_stride, 6);
            Q8Buffer xa;
            xa.quantize(x.data(), n_x, x_stride, m.cols, bits);
            REQUIRE(xa.rows() == n_x);
            std::vector<float> y(static_cast<size_t>(n_x * y_stride), -1.0f);
            qmatmul_q8(m.view(), xa, y.data(), y_stride, 2, 47);
            for (int64_t t = 0; t < n_x; ++t) {
              std::vector<float> want(static_cast<size_t>(m.rows), -1.0f);
              qmatvec_q8(m.view(), xa.row(t), want.data(), 2, 47);
              for (int64_t r = 0; r < m.rows; ++r) {
                CAPTURE(std::string(isa_name(isa)));
                CAPTURE(t);
                CAPTURE(r);
                REQUIRE(y[t * y_stride + r] == want[r]);
              }
            }
          }
}

TEST_CASE("row groups: the layout round-trips, in place too, and bad groupings are refused") {
  // 4 rows of 20 words: a row is one block of 16 words and a tail of 4.
  const int64_t rows = 8, wpr = 20;
  std::vector<uint32_t> plain(static_cast<size_t>(rows * wpr));
  for (size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<uint32_t>(i);
  std::vector<uint32_t> grouped(plain.size()), back(plain.size());
  group_rows(plain.data(), grouped.data(), rows, wpr);
  // Group 0: block 0 of rows 0..3 (16 words each), then the tails (4 words each).
  for (int64_t i = 0; i < 4; ++i) {
    CHECK(grouped[static_cast<size_t>(16 * i)] == static_cast<uint32_t>(i * wpr));
    CHECK(grouped[static_cast<size_t>(64 + 4 * i)] == static_cast<uint32_t>(i * wpr + 16));
  }
  CHECK(grouped[80] == static_cast<uint32_t>(4 * wpr));  // group 1 starts with row 4
  ungroup_rows(grouped.data(), back.data(), rows / 4, wpr);
  CHECK(back == plain);
  std::vector<uint32_t> in_place = plain;
  group_rows(in_place.data(), in_place.data(), rows, wpr);
  CHECK(in_place == grouped);
  CHECK_THROWS_AS(group_rows(plain.data(), grouped.data(), 6, wpr), std::invalid_argument);

  const TestMatrix m = make_matrix(4, 32, 6, 64, ScaleType::bf16, 3);
  std::vector<float> x(64, 1.0f), y(6);
  QuantMatrix bad = m.view();
  bad.row_group = 4;  // 6 rows are not whole groups
  CHECK_THROWS_AS(qmatvec(bad, x.data(), y.data(), 0, 4), std::invalid_argument);
  bad.rows = 4;
  bad.row_group = 3;
  CHECK_THROWS_AS(qmatvec(bad, x.data(), y.data(), 0, 4), std::invalid_argument);
}

TEST_CASE("row groups: every quantized product gives a row-grouped matrix the row-major bits") {
  // Under every ISA (the kernels that read groups themselves, and the others through row-major
  // copies), 4- and 8-bit, rows of whole and partial 64-byte blocks (160 columns of 4 bits in
  // groups of 32 end in half a group's pair, which the AVX2 float product takes element by
  // element), ranges that start and end inside groups. Each product must give exactly the bits it
  // gives the row-major matrix.
  int checked = 0;
  for (const auto& pair : isa_and_product_pairs())
    for (int bits : {4, 8})
      for (int gs : {32, 64, 128})
        for (int64_t cols : {int64_t{704}, int64_t{256}, int64_t{2816}, int64_t{160}}) {
          if (cols % gs != 0) continue;
          // Not structured bindings: CAPTURE and the lambdas below copy them.
          const Isa isa = pair.first;
          const bool integer = pair.second;
          IsaScope scope(isa);
          IntegerProductScope product(integer);
          CAPTURE(std::string(isa_name(isa)));
          CAPTURE(integer);
          CAPTURE(bits);
          CAPTURE(gs);
          CAPTURE(cols);
          const int64_t rows = 12, n_x = 3, y_stride = rows + 1;
          const TestMatrix m = make_matrix(bits, gs, rows, cols, ScaleType::bf16, 77 + gs);
          const QuantMatrix plain = m.view();
          std::vector<uint32_t> grouped_words(m.packed.size());
          group_rows(m.packed.data(), grouped_words.data(), rows, cols * bits / 32);
          QuantMatrix grouped = plain;
          grouped.packed = grouped_words.data();
          grouped.row_group = kRowGroup;
          const std::vector<float> x = random_vector(n_x * cols, 5 + static_cast<uint32_t>(cols));
          X24Buffer x24;
          const bool have_x24 = bits == 4 && x24.resize(n_x, cols, gs);
          if (have_x24)
            for (int64_t t = 0; t < n_x; ++t) REQUIRE(x24.prepare_row(t, x.data() + t * cols));
          Q8Buffer x8;
          x8.quantize(x.data(), n_x, cols, cols, bits);
          SplitActivation split;
          split.split(x.data(), n_x, cols, cols);
          // Each product on both layouts into outputs prefilled alike; all must match.
          auto same = [&](const char* what, auto&& run) {
            for (const auto& range :
                 {std::pair<int64_t, int64_t>{0, 12}, {1, 6}, {3, 9}, {5, 5}, {6, 12}, {9, 10}}) {
              const int64_t rb = range.first, re = range.second;
              CAPTURE(what);
              CAPTURE(rb);
              CAPTURE(re);
              // Room for a dequantized row too.
              std::vector<float> want(static_cast<size_t>(std::max(n_x * y_stride, cols)), -3.0f);
              std::vector<float> got = want;
              run(plain, want.data(), rb, re);
              run(grouped, got.data(), rb, re);
              REQUIRE(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
              ++checked;
            }
          };
          same("qmatvec", [&](const QuantMatrix& w, float* y, int64_t rb, int64_t re) {
            qmatvec(w, x.data(), y, rb, re);
          });
          same("qmatmul", [&](const QuantMatrix& w, float* y, int64_t rb, int64_t re) {
            qmatmul(w, x.data(), n_x, cols, y, y_stride, rb, re);
          });
          same("qmatmul_split", [&](const QuantMatrix& w, float* y, int64_t rb, int64_t re) {
            qmatmul_split(w, split, y, y_stride, rb, re);
          });
          same("qmatvec_q8", [&](const QuantMatrix& w, float* y, int64_t rb, int64_t re) {
            qmatvec_q8(w, x8.row(1), y, rb, re);
          });
          same("qmatmul_q8", [&](const QuantMatrix& w, float* y, int64_t rb, int64_t re) {
            qmatmul_q8(w, x8, y, y_stride, rb, re);
          });
          same("qdequant_row", [&](const QuantMatrix& w, float* y, int64_t rb, int64_t re) {
            if (rb < re) qdequant_row(w, rb, y);  // cols floats: the output holds them
          });
          if (have_x24) {
            same("qmatvec_x24", [&](const QuantMatrix& w, float* y, int64_t rb, int64_t re) {
              X24Buffer one;
              REQUIRE(one.prepare(x.data() + cols, cols, gs));
              qmatvec_x24(w, one, y, rb, re);
            });
            same("qmatmul_x24", [&](const QuantMatrix& w, float* y, int64_t rb, int64_t re) {
              qmatmul_x24(w, x24, y, y_stride, rb, re);
            });
          }
        }
  CHECK(checked > 1000);
}

TEST_CASE("q8 products refuse mismatched inputs") {
  const TestMatrix m = make_matrix(4, 32, 4, 64, ScaleType::bf16, 1);
  const std::vector<float> x = random_vector(128, 2);
  std::vector<float> y(4);
  Q8Buffer wrong_bits, wrong_cols;
  wrong_bits.quantize(x.data(), 1, 64, 64, 8);
  wrong_cols.quantize(x.data(), 1, 128, 128, 4);
  CHECK_THROWS_AS(qmatvec_q8(m.view(), wrong_bits.row(0), y.data(), 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(qmatvec_q8(m.view(), wrong_cols.row(0), y.data(), 0, 4), std::invalid_argument);
  Q8Buffer bad;
  CHECK_THROWS_AS(bad.quantize(x.data(), 1, 48, 48, 4), std::invalid_argument);
  CHECK_THROWS_AS(bad.quantize(x.data(), 1, 64, 64, 3), std::invalid_argument);
}

namespace {

// Softmax attention of one query over keys/values given as doubles (rows of d values).
std::vector<double> softmax_attention(const float* q, const std::vector<double>& k,
                                      const std::vector<double>& v, int64_t n, int d,
                                      double scale) {
  std::vector<double> s(static_cast<size_t>(n));
  double top = -HUGE_VAL;
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int c = 0; c < d; ++c) dot += q[c] * k[static_cast<size_t>(j * d + c)];
    s[static_cast<size_t>(j)] = dot * scale;
    top = std::max(top, dot * scale);
  }
  double z = 0;
  for (double& e : s) z += (e = std::exp(e - top));
  std::vector<double> out(static_cast<size_t>(d), 0.0);
  for (int64_t j = 0; j < n; ++j)
    for (int c = 0; c < d; ++c)
      out[static_cast<size_t>(c)] +=
          s[static_cast<size_t>(j)] / z * v[static_cast<size_t>(j * d + c)];
  return out;
}

}  // namespace

TEST_CASE("attention_partial and attention_combine: blocks merge into the whole softmax") {
  // Two KV heads interleaved in each row (the second is used), a ring of 300 rows holding
  // positions 200..499 (so the keys wrap), `group` query heads sharing the KV head; f32 and
  // f16. Head sizes that end in a partial 16- or 8-lane vector and group sizes that leave
  // remainders in the AVX2 and AVX-512 tiles (4 and 2 heads at a time), blocks of 128, 128 and
  // 44 keys.
  struct Shape {
    int d;
    int group;
  };
  for (const Shape shape :
       {Shape{40, 4}, Shape{7, 3}, Shape{261, 8}, Shape{33, 1}, Shape{256, 2}, Shape{512, 7}}) {
    const int d = shape.d, group = shape.group, kv_heads = 2, g = 1;
    CAPTURE(d);
    CAPTURE(group);
    const int64_t capacity = 300, first = 200, end = 500, n = end - first;
    const int64_t stride = kv_heads * d;
    const std::vector<float> kf = random_vector(capacity * stride, 71, -2.0f, 2.0f);
    const std::vector<float> vf = random_vector(capacity * stride, 72);
    const std::vector<float> q = random_vector(group * d, 73, -1.5f, 1.5f);
    std::vector<uint16_t> kh(kf.size()), vh(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) kh[i] = nearest_half(kf[i]), vh[i] = nearest_half(vf[i]);
    const float scale = 0.35f;
    // Float32 error grows with the length of the dot products.
    const double tolerance = 1e-5 * (1 + d / 64.0);
    std::vector<std::vector<float>> by_isa;
    for (bool f16 : {false, true}) {
      // The keys and values of positions first..end-1 in order, as the cache holds them.
      std::vector<double> k(static_cast<size_t>(n * d)), v(k.size());
      for (int64_t j = 0; j < n; ++j)
        for (int c = 0; c < d; ++c) {
          const size_t at = static_cast<size_t>((first + j) % capacity * stride + g * d + c);
          k[static_cast<size_t>(j * d + c)] = f16 ? half_to_double(kh[at]) : kf[at];
          v[static_cast<size_t>(j * d + c)] = f16 ? half_to_double(vh[at]) : vf[at];
        }
      AttentionKv kv;
      kv.k = f16 ? static_cast<const void*>(kh.data() + g * d) : kf.data() + g * d;
      kv.v = f16 ? static_cast<const void*>(vh.data() + g * d) : vf.data() + g * d;
      kv.f16 = f16;
      kv.row_stride = stride;
      kv.capacity = capacity;
      kv.ring = true;
      kv.fetch_ahead = f16;  // the decode path's prefetches (f16 runs), which change no result
      const int blocks = static_cast<int>((n + kAttentionBlock - 1) / kAttentionBlock);
      REQUIRE(blocks == 3);  // two full blocks and a partial one
      for (Isa isa : available_isas()) {
        IsaScope scope(isa);
        CAPTURE(std::string(isa_name(isa)));
        CAPTURE(f16);
        std::vector<float> m(static_cast<size_t>(blocks * group)), w(m.size());
        std::vector<float> o(m.size() * d);
        std::vector<float> scratch(static_cast<size_t>(group * kAttentionBlock));
        for (int b = 0; b < blocks; ++b) {
          const int64_t p0 = first + b * kAttentionBlock;
          attention_partial(q.data(), d, group, d, scale, kv, p0,
                            std::min(p0 + kAttentionBlock, end), m.data() + b * group,
                            w.data() + b * group, o.data() + b * group * d, scratch.data());
        }
        std::vector<float> got(static_cast<size_t>(group * d));
        for (int i = 0; i < group; ++i)
          attention_combine(m.data() + i, w.data() + i, o.data() + i * d, group, blocks, d,
                            got.data() + i * d);
        for (int i = 0; i < group; ++i) {
          const auto want = softmax_attention(q.data() + i * d, k, v, n, d, scale);
          double worst = 0;
          for (int c = 0; c < d; ++c)
            worst = std::max(worst, std::fabs(got[static_cast<size_t>(i * d + c)] - want[c]));
          CHECK(worst < tolerance);
        }
        // One block alone is its own softmax: combine copies it.
        std::vector<float> one(static_cast<size_t>(d));
        attention_combine(m.data(), w.data(), o.data(), group, 1, d, one.data());
        CHECK(std::equal(one.begin(), one.end(), o.begin()));
        by_isa.push_back(got);
      }
    }
    // Every ISA close to the scalar reference (by_isa holds f32 runs, then f16 runs).
    const size_t per = by_isa.size() / 2;
    for (size_t r = 0; r < by_isa.size(); ++r)
      for (size_t c = 0; c < by_isa[r].size(); ++c)
        CHECK(std::fabs(by_isa[r][c] - by_isa[r / per * per][c]) < tolerance);
  }
  const int d = 40;
  const int64_t capacity = 300, stride = 2 * d;
  const std::vector<float> kf = random_vector(capacity * stride, 71, -2.0f, 2.0f);
  const std::vector<float> vf = random_vector(capacity * stride, 72);
  const std::vector<float> q = random_vector(d, 73, -1.5f, 1.5f);
  const float scale = 0.35f;
  std::vector<float> m(1), w(1), o(static_cast<size_t>(d)), scratch(kAttentionBlock);
  AttentionKv kv;
  kv.k = kf.data(), kv.v = vf.data(), kv.row_stride = stride, kv.capacity = capacity;
  CHECK_THROWS_AS(attention_partial(q.data(), d, 1, d, scale, kv, 5, 5, m.data(), w.data(),
                                    o.data(), scratch.data()),
                  std::invalid_argument);
  CHECK_THROWS_AS(attention_partial(q.data(), d, 1, d, scale, kv, 0, kAttentionBlock + 1, m.data(),
                                    w.data(), o.data(), scratch.data()),
                  std::invalid_argument);
}
