// CPU backend ops against direct formulas: RoPE, attention (causal, sliding, ring, GQA, f16),
// MoE routing, gather/scatter.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"

using namespace redwing;

namespace {

std::unique_ptr<Buffer> upload(Backend& b, const std::vector<float>& v) {
  auto buf = b.alloc(v.size() * 4);
  b.upload(*buf, 0, v.data(), v.size() * 4);
  return buf;
}

std::vector<float> download(Backend& b, const Buffer& buf, size_t n) {
  std::vector<float> v(n);
  b.download(buf, 0, v.data(), n * 4);
  return v;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST_CASE("rope matches the direct formula, including unrotated pairs and linear scaling") {
  auto b = make_cpu_backend(2);
  const int heads = 3, d = 32, half = d / 2;
  const int64_t T = 5, pos0 = 4093;
  for (RopeParams p : {RopeParams{10000, 16, 32, 1.0}, RopeParams{1e6, 4, 32, 1.0},
                       RopeParams{1e6, 16, 32, 8.0}}) {
    auto x = randn(static_cast<size_t>(T * heads * d), 7);
    auto buf = upload(*b, x);
    Mat m{buf.get(), 0, T, heads * d, heads * d};
    b->rope(m, heads, d, p, pos0);
    auto y = download(*b, *buf, x.size());
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < half; ++j) {
          const size_t i1 = static_cast<size_t>((t * heads + h) * d + j), i2 = i1 + half;
          if (j >= p.rotary_pairs) {
            CHECK(y[i1] == x[i1]);  // pairs past rotary_pairs pass through exactly
            CHECK(y[i2] == x[i2]);
            continue;
          }
          // The angle is a float32 product of position and inv_freq (as transformers computes
          // it); everything else in double.
          const float inv = static_cast<float>(std::pow(p.theta, -2.0 * j / p.freq_dim) / p.scale);
          const double a = static_cast<float>(pos0 + t) * inv;
          const double e1 = x[i1] * std::cos(a) - x[i2] * std::sin(a);
          const double e2 = x[i2] * std::cos(a) + x[i1] * std::sin(a);
          CHECK(y[i1] == doctest::Approx(e1).epsilon(1e-4).scale(1.0));
          CHECK(y[i2] == doctest::Approx(e2).epsilon(1e-4).scale(1.0));
        }
  }
}

namespace {

// Naive attention over the whole history (keys at positions 0..), double precision.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t pos0, int64_t T, int heads,
                                    int kv_heads, int d, int64_t window, float scale) {
  std::vector<double> out(static_cast<size_t>(T * heads * d), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h) {
      const int g = h / (heads / kv_heads);
      const int64_t qp = pos0 + t;
      std::vector<double> s;
      std::vector<int64_t> ks;
      for (int64_t kp = 0; kp <= qp + 5; ++kp) {
        if (!kv_visible(qp, kp, window)) continue;
        double dot = 0;
        for (int i = 0; i < d; ++i)
          dot += static_cast<double>(q[static_cast<size_t>((t * heads + h) * d + i)]) *
                 k[static_cast<size_t>((kp * kv_heads + g) * d + i)];
        s.push_back(dot * scale);
        ks.push_back(kp);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - mx));
      for (size_t j = 0; j < s.size(); ++j)
        for (int i = 0; i < d; ++i)
          out[static_cast<size_t>((t * heads + h) * d + i)] +=
              s[j] / z * v[static_cast<size_t>((ks[j] * kv_heads + g) * d + i)];
    }
  return out;
}

}  // namespace

TEST_CASE("attention matches a naive masked softmax: full, sliding ring, GQA, f32 and f16") {
  auto b = make_cpu_backend(2);
  const int heads = 4, kv_heads = 2, d = 8;
  const int64_t total = 23;
  const int64_t width = kv_heads * d;
  for (int64_t window : {0, 5}) {
    for (KvDType dt : {KvDType::f32, KvDType::f16}) {
      for (int64_t chunk : {1, 4, 7}) {
        CAPTURE(window);
        CAPTURE(chunk);
        auto kall = randn(static_cast<size_t>(total * width), 11);
        auto vall = randn(static_cast<size_t>(total * width), 12);
        auto qall = randn(static_cast<size_t>(total * heads * d), 13);
        if (dt == KvDType::f16) {  // the reference sees what the cache holds
          for (auto* vec : {&kall, &vall})
            for (float& x : *vec) x = cpu::f16_to_f32(cpu::f32_to_f16(x));
        }
        KvLayerView kv;
        kv.window = window;
        kv.capacity = window > 0 ? window + chunk : total;
        kv.ring = window > 0;
        kv.num_kv_heads = kv_heads;
        kv.head_dim = d;
        kv.dtype = dt;
        const size_t elem = dt == KvDType::f32 ? 4 : 2;
        auto kb = b->alloc(static_cast<size_t>(kv.capacity * width) * elem);
        auto vb = b->alloc(static_cast<size_t>(kv.capacity * width) * elem);
        kv.k = kb.get();
        kv.v = vb.get();
        const float scale = 0.3f;
        for (int64_t p0 = 0; p0 < total; p0 += chunk) {
          const int64_t n = std::min(chunk, total - p0);
          std::vector<float> kc(kall.begin() + p0 * width, kall.begin() + (p0 + n) * width);
          std::vector<float> vc(vall.begin() + p0 * width, vall.begin() + (p0 + n) * width);
          std::vector<float> qc(qall.begin() + p0 * heads * d, qall.begin() + (p0 + n) * heads * d);
          auto kbuf = upload(*b, kc), vbuf = upload(*b, vc), qbuf = upload(*b, qc);
          auto obuf = b->alloc(qc.size() * 4);
          b->kv_store(kv, Mat{kbuf.get(), 0, n, width, width}, Mat{vbuf.get(), 0, n, width, width},
                      p0);
          b->attention(Mat{qbuf.get(), 0, n, heads * d, heads * d}, kv, p0, heads, scale,
                       Mat{obuf.get(), 0, n, heads * d, heads * d});
          auto got = download(*b, *obuf, qc.size());
          auto want = naive_attention(qc, kall, vall, p0, n, heads, kv_heads, d, window, scale);
          double worst = 0;
          for (size_t i = 0; i < got.size(); ++i)
            worst = std::max(worst, std::abs(got[i] - want[i]));
          CHECK(worst < 1e-5);
        }
      }
    }
  }
}

TEST_CASE(
    "attention over several key blocks: the naive softmax, the same bits for any chunking "
    "and thread count") {
  // 700 positions: several blocks of cpu::kAttentionBlock keys per query, a window of 300 in a
  // ring (so the blocks wrap), and GQA groups of 4.
  const int heads = 8, kv_heads = 2, d = 16;
  const int64_t total = 700;
  const int64_t width = kv_heads * d;
  const float scale = 0.2f;
  for (int64_t window : {0, 300}) {
    for (KvDType dt : {KvDType::f32, KvDType::f16}) {
      CAPTURE(window);
      auto kall = randn(static_cast<size_t>(total * width), 21);
      auto vall = randn(static_cast<size_t>(total * width), 22);
      auto qall = randn(static_cast<size_t>(total * heads * d), 23);
      if (dt == KvDType::f16)
        for (auto* vec : {&kall, &vall})
          for (float& x : *vec) x = cpu::f16_to_f32(cpu::f32_to_f16(x));
      std::vector<std::vector<float>> runs;  // each run's outputs for every position
      for (const auto& setting : {std::pair<int, int64_t>{1, 1}, {3, 1}, {2, 128}, {3, 100}}) {
        // Plain variables, not a structured binding: CAPTURE's lambda cannot name a binding
        // before C++20 support in clang 15.
        const int threads = setting.first;
        const int64_t chunk = setting.second;
        CAPTURE(threads);
        CAPTURE(chunk);
        auto b = make_cpu_backend(threads);
        KvLayerView kv;
        kv.window = window;
        kv.capacity = window > 0 ? window + chunk : total;
        kv.ring = window > 0;
        kv.num_kv_heads = kv_heads;
        kv.head_dim = d;
        kv.dtype = dt;
        const size_t elem = dt == KvDType::f32 ? 4 : 2;
        auto kb = b->alloc(static_cast<size_t>(kv.capacity * width) * elem);
        auto vb = b->alloc(static_cast<size_t>(kv.capacity * width) * elem);
        kv.k = kb.get();
        kv.v = vb.get();
        std::vector<float> all;
        for (int64_t p0 = 0; p0 < total; p0 += chunk) {
          const int64_t n = std::min(chunk, total - p0);
          std::vector<float> kc(kall.begin() + p0 * width, kall.begin() + (p0 + n) * width);
          std::vector<float> vc(vall.begin() + p0 * width, vall.begin() + (p0 + n) * width);
          std::vector<float> qc(qall.begin() + p0 * heads * d, qall.begin() + (p0 + n) * heads * d);
          auto kbuf = upload(*b, kc), vbuf = upload(*b, vc), qbuf = upload(*b, qc);
          auto obuf = b->alloc(qc.size() * 4);
          b->kv_store(kv, Mat{kbuf.get(), 0, n, width, width}, Mat{vbuf.get(), 0, n, width, width},
                      p0);
          b->attention(Mat{qbuf.get(), 0, n, heads * d, heads * d}, kv, p0, heads, scale,
                       Mat{obuf.get(), 0, n, heads * d, heads * d});
          auto got = download(*b, *obuf, qc.size());
          all.insert(all.end(), got.begin(), got.end());
        }
        runs.push_back(std::move(all));
      }
      for (size_t r = 1; r < runs.size(); ++r) CHECK(runs[r] == runs[0]);
      // Against the naive reference at a few positions, late ones (many blocks) included.
      for (int64_t p : {int64_t{0}, int64_t{127}, int64_t{128}, int64_t{400}, total - 1}) {
        std::vector<float> qp(qall.begin() + p * heads * d, qall.begin() + (p + 1) * heads * d);
        auto want = naive_attention(qp, kall, vall, p, 1, heads, kv_heads, d, window, scale);
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i)
          worst =
              std::max(worst, std::abs(runs[0][static_cast<size_t>(p * heads * d) + i] - want[i]));
        CAPTURE(p);
        CHECK(worst < 1e-5);
      }
    }
  }
}

TEST_CASE("route: softmax over all experts, top-k, renormalized, times per-expert scale") {
  auto b = make_cpu_backend(1);
  const int T = 3, E = 8, K = 3;
  auto logits = randn(T * E, 5, 2.0f);
  auto pes = randn(E, 6);
  auto lbuf = upload(*b, logits), pbuf = upload(*b, pes);
  std::vector<int32_t> idx(T * K);
  std::vector<float> w(T * K);
  b->route(Mat{lbuf.get(), 0, T, E, E}, K, *pbuf, idx.data(), w.data());
  for (int t = 0; t < T; ++t) {
    std::vector<double> p(E);
    double z = 0;
    for (int e = 0; e < E; ++e)
      z += p[static_cast<size_t>(e)] = std::exp(logits[static_cast<size_t>(t * E + e)]);
    for (double& x : p) x /= z;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) {
      return p[static_cast<size_t>(a)] > p[static_cast<size_t>(c)];
    });
    double top = 0;
    for (int j = 0; j < K; ++j) top += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
    for (int j = 0; j < K; ++j) {
      const int e = order[static_cast<size_t>(j)];
      CHECK(idx[static_cast<size_t>(t * K + j)] == e);
      CHECK(w[static_cast<size_t>(t * K + j)] ==
            doctest::Approx(p[static_cast<size_t>(e)] / top * pes[static_cast<size_t>(e)])
                .epsilon(1e-5));
    }
  }
}

TEST_CASE("gather_rows and scatter_add_rows") {
  auto b = make_cpu_backend(1);
  std::vector<float> src = {1, 2, 3, 4, 5, 6};  // 3 rows of 2
  auto sbuf = upload(*b, src);
  auto gbuf = b->alloc(4 * 4);
  std::vector<int32_t> rows = {2, 0};
  b->gather_rows(Mat{sbuf.get(), 0, 3, 2, 2}, rows, Mat{gbuf.get(), 0, 2, 2, 2});
  CHECK(download(*b, *gbuf, 4) == std::vector<float>{5, 6, 1, 2});
  auto dbuf = upload(*b, {10, 10, 10, 10, 10, 10});
  std::vector<float> wts = {2.0f, -1.0f};
  b->scatter_add_rows(Mat{gbuf.get(), 0, 2, 2, 2}, rows, wts, Mat{dbuf.get(), 0, 3, 2, 2});
  CHECK(download(*b, *dbuf, 6) == std::vector<float>{9, 8, 10, 10, 20, 22});
}

TEST_CASE("rows_of: the source itself for all of its rows in order, else the gathered rows") {
  auto b = make_cpu_backend(1);
  auto sbuf = upload(*b, {1, 2, 3, 4, 5, 6});  // 3 rows of 2
  const Mat src{sbuf.get(), 0, 3, 2, 2};
  auto gbuf = upload(*b, {0, 0, 0, 0, 0, 0});
  const Mat dst{gbuf.get(), 0, 3, 2, 2};
  const std::vector<int32_t> all = {0, 1, 2};
  const Mat same = b->rows_of(src, all, dst);
  CHECK(same.buf == sbuf.get());
  CHECK(same.offset == 0);
  CHECK(same.rows == 3);
  CHECK(download(*b, *gbuf, 6) == std::vector<float>(6, 0.0f));  // nothing copied
  // One row of a one-row matrix (a decode step's routed expert) is the matrix too.
  const Mat row{sbuf.get(), 2, 1, 2, 2};
  const std::vector<int32_t> first = {0};
  CHECK(b->rows_of(row, first, dst.row_range(0, 1)).offset == 2);
  // Any other choice is gathered: a permutation, a subset, a repeat.
  for (const std::vector<int32_t>& rows :
       {std::vector<int32_t>{1, 0, 2}, std::vector<int32_t>{0, 1}, std::vector<int32_t>{2, 2, 0}}) {
    CAPTURE(rows.size());
    const Mat got = b->rows_of(src, rows, dst.row_range(0, static_cast<int64_t>(rows.size())));
    CHECK(got.buf == gbuf.get());
    CHECK(got.rows == static_cast<int64_t>(rows.size()));
    const auto values = download(*b, *gbuf, 6);
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t c = 0; c < 2; ++c)
        CHECK(values[i * 2 + c] == static_cast<float>(rows[i] * 2 + static_cast<int32_t>(c) + 1));
  }
}

namespace {

// A random 4-bit matrix with f32 scales and biases, and its dequantized values.
struct RandomQuant {
  std::vector<uint32_t> packed;
  std::vector<float> scales, biases, dense;
  HostQuantMatrix host;
  RandomQuant(int64_t rows, int64_t cols, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const int64_t groups = cols / 64;
    packed.assign(static_cast<size_t>(rows * cols / 8), 0);
    scales = randn(static_cast<size_t>(rows * groups), seed + 1, 0.05f);
    biases = randn(static_cast<size_t>(rows * groups), seed + 2, 0.1f);
    dense.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint32_t q = static_cast<uint32_t>(rng() & 15);
        packed[static_cast<size_t>((r * cols + c) / 8)] |= q << (4 * ((r * cols + c) % 8));
        const size_t g = static_cast<size_t>(r * groups + c / 64);
        dense[static_cast<size_t>(r * cols + c)] = scales[g] * static_cast<float>(q) + biases[g];
      }
    host = {packed.data(), scales.data(), biases.data(), DType::f32, 4, 64, rows, cols};
  }
};

}  // namespace

TEST_CASE("qmatmul_batch: the same bits as one qmatmul per product, for 1 and several rows") {
  auto b = make_cpu_backend(2);
  // Different shapes and inputs; row counts that do not divide the chunking evenly.
  const RandomQuant w0(37, 128, 11), w1(130, 256, 12), w2(5, 128, 13);
  const RandomQuant* ws[] = {&w0, &w1, &w2};
  for (int64_t T : {1, 3}) {
    std::vector<std::unique_ptr<QWeight>> q;
    std::vector<std::unique_ptr<Buffer>> xs, batched, single;
    std::vector<Backend::QProduct> products;
    for (size_t i = 0; i < 3; ++i) {
      const auto& w = *ws[i];
      q.push_back(b->import_qweight(w.host));
      xs.push_back(upload(*b, randn(static_cast<size_t>(T * w.host.cols), 20 + i)));
      batched.push_back(b->alloc(static_cast<size_t>(T * w.host.rows) * 4));
      single.push_back(b->alloc(static_cast<size_t>(T * w.host.rows) * 4));
      const Mat x{xs[i].get(), 0, T, w.host.cols, w.host.cols};
      products.push_back({q[i].get(), x, Mat{batched[i].get(), 0, T, w.host.rows, w.host.rows}});
      b->qmatmul(*q[i], x, Mat{single[i].get(), 0, T, w.host.rows, w.host.rows});
    }
    b->qmatmul_batch(products);
    for (size_t i = 0; i < 3; ++i) {
      const auto& w = *ws[i];
      const size_t n = static_cast<size_t>(T * w.host.rows);
      const auto got = download(*b, *batched[i], n);
      const auto want = download(*b, *single[i], n);
      CHECK(std::memcmp(got.data(), want.data(), n * 4) == 0);
      // And both against the dequantized product, computed in double.
      std::vector<float> x(static_cast<size_t>(T * w.host.cols));
      b->download(*xs[i], 0, x.data(), x.size() * 4);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < w.host.rows; ++r) {
          double ref = 0;
          for (int64_t c = 0; c < w.host.cols; ++c)
            ref += static_cast<double>(w.dense[static_cast<size_t>(r * w.host.cols + c)]) *
                   x[static_cast<size_t>(t * w.host.cols + c)];
          CHECK(got[static_cast<size_t>(t * w.host.rows + r)] ==
                doctest::Approx(ref).epsilon(1e-4).scale(1.0));
        }
    }
  }
  CHECK_THROWS_AS(b->qmatmul_batch(std::vector<Backend::QProduct>{
                      {b->import_qweight(w0.host).get(), Mat{}, Mat{}}}),
                  std::logic_error);
}

TEST_CASE("resident weights in the row-group layout give the borrowed weights' bits") {
  // import_resident_qweight copies a matrix into row groups where the kernels read them
  // (cpu::row_groups_pay), and lay_out_rows does the same in place for an expert source: either
  // way every product must keep the bits of the matrix as the format lays it out, exact and with
  // 8-bit activations, for a prompt and for one token. 37 rows are not whole groups (kept as
  // they are); 704 columns end inside a 64-byte block.
  auto b = make_cpu_backend(2);
  const bool grouped = cpu::row_groups_pay();
  CHECK(b->preferred_row_group() == (grouped ? cpu::kRowGroup : 1));
  for (const auto& shape : {std::pair<int64_t, int64_t>{64, 704}, {37, 256}, {2816, 704}}) {
    const int64_t rows = shape.first, cols = shape.second;  // not a binding: CAPTURE copies it
    const RandomQuant w(rows, cols, 40 + static_cast<uint64_t>(rows));
    RandomQuant laid_out(rows, cols, 40 + static_cast<uint64_t>(rows));
    if (rows % cpu::kRowGroup == 0) {
      b->lay_out_rows(laid_out.packed.data(), rows, cols / 8);
      laid_out.host.row_group = b->preferred_row_group();
    }
    CHECK((laid_out.packed != w.packed) == (grouped && rows % cpu::kRowGroup == 0));
    auto borrowed = b->import_qweight(w.host);
    auto resident = b->import_resident_qweight(w.host);
    auto in_place = b->import_qweight(laid_out.host);
    for (const ActivationPlan& plan : {ActivationPlan::exact(), ActivationPlan::all_int8()})
      for (int64_t T : {1, 5}) {
        CAPTURE(rows);
        CAPTURE(T);
        REQUIRE(b->set_activations(plan));
        auto x = upload(*b, randn(static_cast<size_t>(T * cols), 7 + static_cast<uint64_t>(T)));
        const Mat xm{x.get(), 0, T, cols, cols};
        const size_t n = static_cast<size_t>(T * rows);
        std::vector<std::vector<float>> out;
        for (const QWeight* q : {borrowed.get(), resident.get(), in_place.get()}) {
          auto y = b->alloc(n * 4);
          b->qmatmul(*q, xm, Mat{y.get(), 0, T, rows, rows});
          out.push_back(download(*b, *y, n));
        }
        CHECK(std::memcmp(out[0].data(), out[1].data(), n * 4) == 0);
        CHECK(std::memcmp(out[0].data(), out[2].data(), n * 4) == 0);
      }
  }
  REQUIRE(b->set_activations(ActivationPlan::exact()));
  RandomQuant odd(6, 64, 3);
  odd.host.row_group = cpu::kRowGroup;  // 6 rows are not whole groups
  CHECK_THROWS_AS(b->import_qweight(odd.host), std::invalid_argument);
}

TEST_CASE("exact products: a prompt's rows get decode's bits; inf or NaN takes float32") {
  // Where the CPU has the integer method (AVX512-VNNI without AMX), a prefill chunk's 4-bit
  // products give each row the bits that row gets as a one-row (decode) product, alone or in a
  // batch with products sharing or not sharing its input; elsewhere the float32 paths differ in
  // rounding only, so this checks the integer method where it runs.
  auto b = make_cpu_backend(2);
  const bool integer = cpu::integer_exact_product_active() && !cpu::has_matrix_product();
  const RandomQuant w0(45, 256, 31), w1(70, 256, 32), w2(20, 128, 33);
  const int64_t T = 5;
  auto q0 = b->import_qweight(w0.host), q1 = b->import_qweight(w1.host),
       q2 = b->import_qweight(w2.host);
  const std::vector<float> x01 = randn(static_cast<size_t>(T * 256), 40);
  const std::vector<float> x2 = randn(static_cast<size_t>(T * 128), 41);
  auto bx01 = upload(*b, x01), bx2 = upload(*b, x2);
  auto y0 = b->alloc(T * 45 * 4), y1 = b->alloc(T * 70 * 4), y2 = b->alloc(T * 20 * 4);
  const Backend::QProduct batch[] = {
      {q0.get(), Mat{bx01.get(), 0, T, 256, 256}, Mat{y0.get(), 0, T, 45, 45}},
      {q1.get(), Mat{bx01.get(), 0, T, 256, 256}, Mat{y1.get(), 0, T, 70, 70}},
      {q2.get(), Mat{bx2.get(), 0, T, 128, 128}, Mat{y2.get(), 0, T, 20, 20}}};
  b->qmatmul_batch(batch);
  auto whole = b->alloc(T * 70 * 4);
  b->qmatmul(*q1, Mat{bx01.get(), 0, T, 256, 256}, Mat{whole.get(), 0, T, 70, 70});
  const std::vector<float> got1 = download(*b, *y1, T * 70);
  CHECK(std::memcmp(got1.data(), download(*b, *whole, T * 70).data(), T * 70 * 4) == 0);
  if (integer) {
    const std::pair<const QWeight*, std::pair<const Buffer*, int64_t>> ws[] = {
        {q0.get(), {y0.get(), 45}}, {q1.get(), {y1.get(), 70}}, {q2.get(), {y2.get(), 20}}};
    for (int i = 0; i < 3; ++i) {
      const int64_t rows = ws[i].second.second, cols = i == 2 ? 128 : 256;
      const std::vector<float> got =
          download(*b, *ws[i].second.first, static_cast<size_t>(T * rows));
      for (int64_t t = 0; t < T; ++t) {
        auto one = b->alloc(static_cast<size_t>(rows) * 4);
        b->qmatmul(*ws[i].first, Mat{i == 2 ? bx2.get() : bx01.get(), t * cols, 1, cols, cols},
                   Mat{one.get(), 0, 1, rows, rows});
        const std::vector<float> want = download(*b, *one, static_cast<size_t>(rows));
        CAPTURE(i);
        CAPTURE(t);
        CHECK(std::memcmp(got.data() + t * rows, want.data(), static_cast<size_t>(rows) * 4) == 0);
      }
    }
  } else {
    MESSAGE("bits against decode not checked: no integer method here, or a matrix unit (AMX)");
  }
  // A NaN in one row of the input: that row's outputs are not finite, the others are finite and
  // still the product (the float32 path, which propagates it row by row).
  std::vector<float> bad = x01;
  bad[static_cast<size_t>(2 * 256 + 77)] = std::numeric_limits<float>::quiet_NaN();
  auto bbad = upload(*b, bad);
  b->qmatmul(*q1, Mat{bbad.get(), 0, T, 256, 256}, Mat{whole.get(), 0, T, 70, 70});
  const std::vector<float> out = download(*b, *whole, T * 70);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < 70; ++r) {
      const float v = out[static_cast<size_t>(t * 70 + r)];
      CAPTURE(t);
      CAPTURE(r);
      if (t == 2) {
        CHECK_FALSE(std::isfinite(v));
        continue;
      }
      double ref = 0;
      for (int64_t c = 0; c < 256; ++c)
        ref += static_cast<double>(w1.dense[static_cast<size_t>(r * 256 + c)]) *
               bad[static_cast<size_t>(t * 256 + c)];
      CHECK(v == doctest::Approx(ref).epsilon(1e-4).scale(1.0));
    }
}

TEST_CASE("int8 activations: qmatmul and qmatmul_batch give the q8 kernels' bits") {
  auto b = make_cpu_backend(2);
  CHECK(b->activations() == ActivationPlan::exact());
  REQUIRE(b->set_activations(ActivationPlan::all_int8()));
  CHECK(b->describe().find("int8 activations") != std::string::npos);
  // w0 and w1 read the same input (as q and k do), w2 its own of the same width: a batch must
  // quantize each distinct input once and never mix them up.
  const RandomQuant w0(37, 128, 31), w1(130, 128, 32), w2(5, 128, 33);
  const RandomQuant* ws[] = {&w0, &w1, &w2};
  for (int64_t T : {1, 3}) {
    const std::vector<float> shared = randn(static_cast<size_t>(T * 128), 40);
    const std::vector<float> own = randn(static_cast<size_t>(T * 128), 41);
    const std::vector<float>* inputs[] = {&shared, &shared, &own};
    auto shared_buf = upload(*b, shared);
    auto own_buf = upload(*b, own);
    Buffer* input_bufs[] = {shared_buf.get(), shared_buf.get(), own_buf.get()};
    std::vector<std::unique_ptr<QWeight>> q;
    std::vector<std::unique_ptr<Buffer>> batched, single;
    std::vector<Backend::QProduct> products;
    for (size_t i = 0; i < 3; ++i) {
      const auto& w = *ws[i];
      q.push_back(b->import_qweight(w.host));
      batched.push_back(b->alloc(static_cast<size_t>(T * w.host.rows) * 4));
      single.push_back(b->alloc(static_cast<size_t>(T * w.host.rows) * 4));
      const Mat x{input_bufs[i], 0, T, w.host.cols, w.host.cols};
      products.push_back({q[i].get(), x, Mat{batched[i].get(), 0, T, w.host.rows, w.host.rows}});
      b->qmatmul(*q[i], x, Mat{single[i].get(), 0, T, w.host.rows, w.host.rows});
    }
    b->qmatmul_batch(products);
    for (size_t i = 0; i < 3; ++i) {
      const auto& w = *ws[i];
      const size_t n = static_cast<size_t>(T * w.host.rows);
      // The kernels called directly, on the same input quantized here.
      cpu::Q8Buffer xq;
      xq.quantize(inputs[i]->data(), T, w.host.cols, w.host.cols, 4);
      const cpu::QuantMatrix m{
          w.packed.data(), w.scales.data(), w.biases.data(), cpu::ScaleType::f32, 4, 64,
          w.host.rows,     w.host.cols};
      std::vector<float> want(n);
      cpu::qmatmul_q8(m, xq, want.data(), w.host.rows, 0, w.host.rows);
      CAPTURE(T);
      CAPTURE(i);
      CHECK(download(*b, *batched[i], n) == want);
      CHECK(download(*b, *single[i], n) == want);
    }
  }
  // Back to exact: the float32 kernel's bits again.
  REQUIRE(b->set_activations(ActivationPlan::exact()));
  auto q0 = b->import_qweight(w0.host);
  const std::vector<float> x = randn(128, 50);
  auto xb = upload(*b, x);
  auto yb = b->alloc(37 * 4);
  b->qmatmul(*q0, Mat{xb.get(), 0, 1, 128, 128}, Mat{yb.get(), 0, 1, 37, 37});
  const cpu::QuantMatrix m0{
      w0.packed.data(), w0.scales.data(), w0.biases.data(), cpu::ScaleType::f32, 4, 64, 37, 128};
  std::vector<float> want(37);
  cpu::qmatvec(m0, x.data(), want.data(), 0, 37);
  CHECK(download(*b, *yb, 37) == want);
}

TEST_CASE("activation plan: each product's kind picks its precision, in one batch too") {
  auto b = make_cpu_backend(2);
  // Only the head on the 8-bit path: the head-tagged weight gets the q8 kernel's bits, the
  // attention-tagged and the untagged ones (same matrix, same input) the float32 kernel's.
  REQUIRE(b->set_activations(parse_activation_plan("head")));
  CHECK(b->describe().find("int8 activations (head)") != std::string::npos);
  const RandomQuant w(40, 128, 61);
  const cpu::QuantMatrix m{
      w.packed.data(), w.scales.data(), w.biases.data(), cpu::ScaleType::f32, 4, 64, 40, 128};
  const std::vector<float> x = randn(128, 62);
  auto xb = upload(*b, x);
  std::vector<float> exact(40), int8(40);
  cpu::qmatvec(m, x.data(), exact.data(), 0, 40);
  cpu::Q8Buffer xq;
  xq.quantize(x.data(), 1, 128, 128, 4);
  cpu::qmatvec_q8(m, xq.row(0), int8.data(), 0, 40);
  REQUIRE(exact != int8);  // else this test could not tell them apart
  const ProductKind kinds[] = {ProductKind::head, ProductKind::attention, ProductKind::other};
  std::vector<std::unique_ptr<QWeight>> q;
  std::vector<std::unique_ptr<Buffer>> batched, single;
  std::vector<Backend::QProduct> products;
  for (ProductKind kind : kinds) {
    q.push_back(b->import_qweight(w.host));
    q.back()->kind = kind;
    batched.push_back(b->alloc(40 * 4));
    single.push_back(b->alloc(40 * 4));
    const Mat in{xb.get(), 0, 1, 128, 128};
    products.push_back({q.back().get(), in, Mat{batched.back().get(), 0, 1, 40, 40}});
    b->qmatmul(*q.back(), in, Mat{single.back().get(), 0, 1, 40, 40});
  }
  b->qmatmul_batch(products);
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const std::vector<float>& want = i == 0 ? int8 : exact;
    CHECK(download(*b, *batched[i], 40) == want);
    CHECK(download(*b, *single[i], 40) == want);
  }
  // "int8" covers every kind, untagged products included.
  REQUIRE(b->set_activations(parse_activation_plan("int8")));
  b->qmatmul(*q[2], Mat{xb.get(), 0, 1, 128, 128}, Mat{single[2].get(), 0, 1, 40, 40});
  CHECK(download(*b, *single[2], 40) == int8);
}

TEST_CASE("activation plan: names parse and print back; bad ones are refused") {
  CHECK(parse_activation_plan("exact") == ActivationPlan::exact());
  CHECK(parse_activation_plan("int8") == ActivationPlan::all_int8());
  const ActivationPlan head = parse_activation_plan("head");
  CHECK(head.int8(ProductKind::head));
  CHECK_FALSE(head.int8(ProductKind::experts));
  CHECK_FALSE(head.int8(ProductKind::other));
  const ActivationPlan two = parse_activation_plan("head,attention");
  CHECK(two == ActivationPlan::int8_on({ProductKind::attention, ProductKind::head}));
  CHECK(activation_plan_name(two) == "attention,head");
  for (const char* name : {"exact", "int8", "head", "attention,mlp,router,experts,head"})
    CHECK(activation_plan_name(parse_activation_plan(name)) == name);
  for (const char* bad : {"", "fast", "head,", ",head", "head,head", "Head", "other", "exact,head"})
    CHECK_THROWS_AS(parse_activation_plan(bad), std::invalid_argument);
}

// group_expert_rows: experts ascending, each with the rows that chose it in row order and their
// weights; experts nobody chose are absent; an id outside [0, num_experts) or routes of another
// size are refused.
TEST_CASE("group_expert_rows groups the routes by expert in order, and refuses bad ids") {
  // 4 rows, top 2, 6 experts: expert 5 by rows 0 and 3, 2 by rows 0, 1 and 2, 0 by rows 1 and 3,
  // 4 by row 2; 1 and 3 by nobody.
  const std::vector<int32_t> ids = {5, 2, 2, 0, 4, 2, 0, 5};
  const std::vector<float> w = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
  const ExpertRowGroups g = group_expert_rows(ids, w, 4, 2, 6);
  std::vector<int32_t> experts;
  for (const auto& [e, group] : g) experts.push_back(e);
  CHECK(experts == std::vector<int32_t>{0, 2, 4, 5});
  CHECK(g.at(0).first == std::vector<int32_t>{1, 3});
  CHECK(g.at(0).second == std::vector<float>{0.4f, 0.7f});
  CHECK(g.at(2).first == std::vector<int32_t>{0, 1, 2});
  CHECK(g.at(2).second == std::vector<float>{0.2f, 0.3f, 0.6f});
  CHECK(g.at(4).first == std::vector<int32_t>{2});
  CHECK(g.at(5).first == std::vector<int32_t>{0, 3});
  CHECK(g.at(5).second == std::vector<float>{0.1f, 0.8f});
  for (const int32_t bad : {-1, 6}) {
    std::vector<int32_t> b = ids;
    b[5] = bad;
    CHECK_THROWS_AS(group_expert_rows(b, w, 4, 2, 6), std::logic_error);
  }
  CHECK_THROWS_AS(group_expert_rows(ids, w, 3, 2, 6), std::logic_error);
  // The same grouping by entry (t * top_k + k), the GPU's prefill layout.
  const ExpertEntryGroups entries = group_entries_by_expert(ids, 6);
  CHECK(entries.size() == 4u);
  CHECK(entries.at(0) == std::vector<int64_t>{3, 6});
  CHECK(entries.at(2) == std::vector<int64_t>{1, 2, 5});
  CHECK(entries.at(4) == std::vector<int64_t>{4});
  CHECK(entries.at(5) == std::vector<int64_t>{0, 7});
  CHECK_THROWS_AS(group_entries_by_expert(ids, 5), std::logic_error);
}
