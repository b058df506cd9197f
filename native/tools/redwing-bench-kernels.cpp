// redwing-bench-kernels: measures the memory bandwidth of this machine and the speed of the
// quantized matrix-vector product (decode) at Gemma 4 26B-A4B shapes, and prints JSON on stdout
// (progress goes to stderr). bench/kernels.ts runs it and formats the table.
//
//   redwing-bench-kernels [--threads 1,2] [--runs 9] [--quick] [--only ROWSxCOLS[:BITS]]
//
// Throughput is GB/s of weight bytes read (packed + scales + biases). The small matrices would
// fit in the last-level cache, which a real decode step never sees (30 layers of weights pass
// through it per token), so each timed run cycles through enough copies of the matrix to exceed
// the cache several times over.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "bench_median.h"

using namespace redwing;
using namespace redwing::cpu;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

using bench::median;

// 64-byte aligned, zero-initialised storage that is freed on scope exit.
struct AlignedBuffer {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr;
  size_t bytes = 0;
  explicit AlignedBuffer(size_t n) : bytes((n + 63) / 64 * 64) {
    ptr.reset(std::aligned_alloc(64, bytes));
    if (!ptr) throw std::runtime_error("out of memory allocating " + std::to_string(n) + " bytes");
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr.get());
  }
};

// Fills bytes with a fast xorshift stream: random nibbles, so no branch predictor or
// compression effect flatters the kernels.
void fill_random(void* p, size_t bytes, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto* w = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < bytes / 8; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    w[i] = s;
  }
}

// ---- bandwidth probe ---------------------------------------------------------------------------

#if defined(__x86_64__)
__attribute__((target("avx2"))) double sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  double t = 0;
  for (float v : out) t += v;
  return t;
}
#endif

double sum_plain(const float* p, size_t n) {
  float acc[16] = {};
  for (size_t i = 0; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += p[i + j];
  }
  double t = 0;
  for (float v : acc) t += v;
  return t;
}

// Best-of-`runs` read bandwidth in GB/s over a buffer far larger than the caches, the buffer
// split across the pool's threads as a qmatvec's rows are.
double measure_bandwidth(ThreadPool& pool, const AlignedBuffer& buf, int runs) {
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2");
#endif
  const size_t n = buf.bytes / sizeof(float);
  const size_t chunk_floats = 1 << 16;  // 256 KiB chunks
  const int64_t n_chunks = static_cast<int64_t>(n / chunk_floats);
  double best = 0;
  std::vector<double> sink(static_cast<size_t>(n_chunks));
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(n_chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const float* p = buf.as<float>() + c * chunk_floats;
#if defined(__x86_64__)
        if (avx2) {
          sink[static_cast<size_t>(c)] = sum_avx2(p, chunk_floats);
          continue;
        }
#endif
        sink[static_cast<size_t>(c)] = sum_plain(p, chunk_floats);
      }
    });
    const double s = seconds_since(t0);
    best = std::max(best, static_cast<double>(n_chunks * chunk_floats * sizeof(float)) / s / 1e9);
  }
  double keep = 0;
  for (double v : sink) keep += v;
  if (keep == 12345.678) std::fprintf(stderr, " ");  // keeps the sums observable
  return best;
}

// ---- quantized matrices ------------------------------------------------------------------------

struct BenchMatrix {
  AlignedBuffer packed, scales, biases;
  QuantMatrix view;
  BenchMatrix(int64_t rows, int64_t cols, int bits, int group, uint64_t seed)
      : packed(static_cast<size_t>(rows * cols * bits / 8)),
        scales(static_cast<size_t>(rows * (cols / group) * 2)),
        biases(static_cast<size_t>(rows * (cols / group) * 2)) {
    fill_random(packed.as<void>(), packed.bytes, seed);
    // Plausible bf16 scales (|s| ~ 0.01, both signs) and biases (~ -0.1).
    auto* s = scales.as<uint16_t>();
    auto* b = biases.as<uint16_t>();
    const int64_t n = rows * (cols / group);
    for (int64_t i = 0; i < n; ++i) {
      s[i] = f32_to_bf16((i % 3 ? 0.01f : -0.012f) * (1.0f + 0.001f * static_cast<float>(i % 97)));
      b[i] = f32_to_bf16(-0.1f + 0.0005f * static_cast<float>(i % 101));
    }
    view.packed = packed.as<uint32_t>();
    view.scales = scales.as<void>();
    view.biases = biases.as<void>();
    view.scale_type = ScaleType::bf16;
    view.bits = bits;
    view.group_size = group;
    view.rows = rows;
    view.cols = cols;
  }
};

struct Result {
  int64_t rows, cols;
  int bits, threads;
  std::string isa;
  double ms, gbps, fraction;
};

std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = s.find(',', pos);
    if (next == std::string::npos) next = s.size();
    out.push_back(std::stoi(s.substr(pos, next - pos)));
    pos = next + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts = {1, 2};
  int runs = 9;
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      thread_counts = parse_list(argv[++i]);
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: redwing-bench-kernels [--threads 1,2] [--runs N] [--quick] "
                   "[--only ROWSxCOLS[:BITS]]\n"
                   "  prints JSON: bandwidth and qmatvec GB/s at Gemma 4 26B-A4B shapes\n");
      return a == "--help" ? 0 : 2;
    }
  }
  const Isa best = active_isa();
  // Working set per timed run: several times the last-level cache.
  const size_t sweep_bytes = quick ? (size_t{96} << 20) : (size_t{256} << 20);

  std::vector<double> bandwidth(thread_counts.size());
  {
    AlignedBuffer buf(quick ? (size_t{256} << 20) : (size_t{1} << 30));
    fill_random(buf.as<void>(), buf.bytes, 1);
    for (size_t t = 0; t < thread_counts.size(); ++t) {
      ThreadPool pool(thread_counts[t]);
      bandwidth[t] = measure_bandwidth(pool, buf, quick ? 3 : 7);
      std::fprintf(stderr, "bandwidth, %d thread(s): %.2f GB/s\n", thread_counts[t], bandwidth[t]);
    }
  }

  struct Shape {
    int64_t rows, cols;
    int bits;
  };
  const Shape shapes[] = {
      {2816, 2816, 4}, {704, 2816, 4}, {2816, 704, 4}, {262144, 2816, 4}, {2816, 2816, 8}};
  std::vector<Result> results;
  for (const Shape& sh : shapes) {
    const std::string name = std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
    if (!only.empty() && only != name && only != name + ":" + std::to_string(sh.bits)) continue;
    // packed bytes + bf16 scales and biases
    const size_t bytes_one =
        static_cast<size_t>(sh.rows * sh.cols * sh.bits / 8 + sh.rows * (sh.cols / 64) * 4);
    const int copies = static_cast<int>(std::max<size_t>(1, sweep_bytes / bytes_one));
    std::vector<std::unique_ptr<BenchMatrix>> mats;
    for (int c = 0; c < copies; ++c) {
      mats.push_back(std::make_unique<BenchMatrix>(sh.rows, sh.cols, sh.bits, 64, 10 + c));
    }
    AlignedBuffer xbuf(static_cast<size_t>(sh.cols) * sizeof(float));
    AlignedBuffer ybuf(static_cast<size_t>(sh.rows) * sizeof(float));
    for (int64_t c = 0; c < sh.cols; ++c) {
      xbuf.as<float>()[c] = std::sin(0.1f * static_cast<float>(c));
    }
    for (size_t t = 0; t < thread_counts.size(); ++t) {
      ThreadPool pool(thread_counts[t]);
      for (Isa isa : {Isa::scalar, Isa::neon, Isa::avx2, Isa::avx512}) {
        // Scalar, then every SIMD implementation this CPU supports (AVX2 matters on an AVX-512
        // machine too: many CPUs have only AVX2).
        if (!set_active_isa(isa)) continue;
        if (isa == Isa::scalar && best != Isa::scalar && sh.rows > 100000 && quick) continue;
        // Scalar is slow on the LM head: fewer runs keep the whole benchmark short.
        const int n_runs = (isa == Isa::scalar && copies == 1) ? std::min(runs, 3) : runs;
        // The exact float32 product, then the 8-bit-activation one (the input quantized once
        // per product, as the CPU backend does, and counted in the time).
        for (bool int8 : {false, true}) {
          if (int8 && isa == Isa::scalar && sh.rows > 100000) continue;
          std::vector<double> per_matvec;
          Q8Buffer xq;
          for (int r = 0; r < n_runs + 1; ++r) {
            const auto t0 = Clock::now();
            for (const auto& m : mats) {
              const QuantMatrix& w = m->view;
              if (int8) {
                xq.quantize(xbuf.as<float>(), 1, w.cols, w.cols, w.bits);
                pool.parallel_for(w.rows, 16, [&](int64_t b, int64_t e) {
                  qmatvec_q8(w, xq.row(0), ybuf.as<float>(), b, e);
                });
              } else {
                pool.parallel_for(w.rows, 16, [&](int64_t b, int64_t e) {
                  qmatvec(w, xbuf.as<float>(), ybuf.as<float>(), b, e);
                });
              }
            }
            if (r > 0) per_matvec.push_back(seconds_since(t0) / copies);  // run 0 warms up
          }
          const double s = median(per_matvec);
          Result res{sh.rows,
                     sh.cols,
                     sh.bits,
                     thread_counts[t],
                     std::string(isa_name(isa)) + (int8 ? "+int8" : ""),
                     s * 1e3,
                     static_cast<double>(bytes_one) / s / 1e9,
                     0};
          res.fraction = res.gbps / bandwidth[t];
          std::fprintf(stderr,
                       "qmatvec %lldx%lld %d-bit, %d thread(s), %s: %.3f ms, %.2f GB/s (%.0f%%)\n",
                       static_cast<long long>(sh.rows), static_cast<long long>(sh.cols), sh.bits,
                       thread_counts[t], res.isa.c_str(), res.ms, res.gbps, res.fraction * 100);
          results.push_back(res);
        }
      }
      set_active_isa(best);
    }
  }

  // JSON on stdout.
  std::string out = "{\n  \"cpu_features\": \"" + std::string(cpu_features()) + "\",\n";
  out += "  \"active_isa\": \"" + std::string(isa_name(best)) + "\",\n";
  out += "  \"bandwidth_gbps\": " + json_number(bandwidth.back()) + ",\n";
  out += "  \"bandwidth_gbps_by_threads\": {";
  for (size_t t = 0; t < thread_counts.size(); ++t) {
    out +=
        (t ? ", \"" : "\"") + std::to_string(thread_counts[t]) + "\": " + json_number(bandwidth[t]);
  }
  out += "},\n  \"results\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    out += "    {\"shape\": [" + std::to_string(r.rows) + ", " + std::to_string(r.cols) +
           "], \"bits\": " + std::to_string(r.bits) +
           ", \"group_size\": 64, \"threads\": " + std::to_string(r.threads) + ", \"isa\": \"" +
           r.isa + "\", \"ms\": " + json_number(r.ms) + ", \"gbps\": " + json_number(r.gbps) +
           ", \"fraction_of_bandwidth\": " + json_number(r.fraction) + "}" +
           (i + 1 < results.size() ? ",\n" : "\n");
  }
  out += "  ]\n}\n";
  std::fputs(out.c_str(), stdout);
  return 0;
}
