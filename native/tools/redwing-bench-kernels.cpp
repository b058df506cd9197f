// redwing-bench-kernels: measures the memory bandwidth of this machine and the speed of the
// quantized matrix-vector product (decode) at Gemma 4 26B-A4B shapes, and prints JSON on stdout
// (progress goes to stderr). bench/kernels.ts runs it and formats the table.
//
//   redwing-bench-kernels [--threads 1,2] [--runs 9] [--quick] [--only ROWSxCOLS[:BITS]|experts]
//
// Throughput is GB/s of weight bytes read (packed + scales + biases). The small matrices would
// fit in the last-level cache, which a real decode step never sees (30 layers of weights pass
// through it per token), so each timed run cycles through enough copies of the matrix to exceed
// the cache several times over. Beside those shapes, "experts" (also in the default run) times a
// decode step's 8 routed experts of one MoE layer as the CPU backend batches them
// (bench_expert_layer).
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
#include "platform/file.h"

using namespace redwing;
using namespace redwing::cpu;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

using bench::median;

// 64-byte aligned storage, freed on scope exit. Blocks of 2 MiB or more come from
// platform::allocate_aligned, which marks them for transparent huge pages as the engine's
// weight blocks are: with 4 KiB pages a sweep over the copies below pays a TLB miss per page,
// which on a 2-core virtual machine slowed the products by 4-17% (docs/cpu.md, session 28).
struct AlignedBuffer {
  platform::AlignedBytes ptr;
  size_t bytes = 0;
  explicit AlignedBuffer(size_t n)
      : ptr(platform::allocate_aligned((n + 63) / 64 * 64, 64)), bytes((n + 63) / 64 * 64) {
    std::memset(ptr.get(), 0, bytes);
  }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(ptr.get());
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

// A matrix's packed words, scales and biases, carved one after another from a shared arena
// (one huge-page block for all the copies of a shape, laid out as the engine's weights are).
struct BenchMatrix {
  static size_t bytes_needed(int64_t rows, int64_t cols, int bits, int group) {
    return round64(static_cast<size_t>(rows * cols * bits / 8)) +
           2 * round64(static_cast<size_t>(rows * (cols / group) * 2));
  }
  QuantMatrix view;
  BenchMatrix(std::byte* at, int64_t rows, int64_t cols, int bits, int group, uint64_t seed) {
    const size_t packed_bytes = static_cast<size_t>(rows * cols * bits / 8);
    const size_t scale_bytes = static_cast<size_t>(rows * (cols / group) * 2);
    std::byte* packed = at;
    auto* s = reinterpret_cast<uint16_t*>(packed + round64(packed_bytes));
    auto* b = reinterpret_cast<uint16_t*>(packed + round64(packed_bytes) + round64(scale_bytes));
    fill_random(packed, packed_bytes, seed);
    // Plausible bf16 scales (|s| ~ 0.01, both signs) and biases (~ -0.1).
    const int64_t n = rows * (cols / group);
    for (int64_t i = 0; i < n; ++i) {
      s[i] = f32_to_bf16((i % 3 ? 0.01f : -0.012f) * (1.0f + 0.001f * static_cast<float>(i % 97)));
      b[i] = f32_to_bf16(-0.1f + 0.0005f * static_cast<float>(i % 101));
    }
    view.packed = reinterpret_cast<const uint32_t*>(packed);
    // In the row-group layout where the engine's resident weights are (CpuBackend::
    // import_resident_qweight); the words are random either way.
    if (row_groups_pay() && rows % kRowGroup == 0) view.row_group = kRowGroup;
    view.scales = s;
    view.biases = b;
    view.scale_type = ScaleType::bf16;
    view.bits = bits;
    view.group_size = group;
    view.rows = rows;
    view.cols = cols;
  }

 private:
  static size_t round64(size_t n) { return (n + 63) / 64 * 64; }
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

// ---- a MoE layer's routed experts, batched as the CPU backend runs a decode step -------------

// One decode step's 8 routed experts of a Gemma 4 26B-A4B layer (gate and up 704 x 2,816, down
// 2,816 x 704, 4-bit, group 64), as CpuBackend::qmatmul_batch runs them with the exact integer
// method (the float32 product on CPUs without it) or 8-bit activations: the 16 gate and up
// products share one prepared input and run as one parallel loop over their rows, then the 8
// down products (each its own prepared input) as another. Enough layers are cycled through to
// exceed the last-level cache. Returns the medians of the ms a layer spends in each of the two
// loops, and the weight bytes each reads.
struct ExpertLayerTimes {
  double gate_up_ms, down_ms;
  double bytes_gate_up, bytes_down;
};
ExpertLayerTimes bench_expert_layer(ThreadPool& pool, int runs, size_t sweep_bytes, bool int8) {
  constexpr int kExperts = 8;
  constexpr int64_t kHidden = 2816, kInter = 704;
  const size_t up_each = BenchMatrix::bytes_needed(kInter, kHidden, 4, 64);
  const size_t down_each = BenchMatrix::bytes_needed(kHidden, kInter, 4, 64);
  const size_t layer_bytes = kExperts * (2 * up_each + down_each);
  const int layers = static_cast<int>(std::max<size_t>(2, sweep_bytes / layer_bytes));
  AlignedBuffer arena(layer_bytes * static_cast<size_t>(layers));
  struct Layer {
    std::vector<std::unique_ptr<BenchMatrix>> up, down;  // up: gate then up per expert
  };
  std::vector<Layer> all(static_cast<size_t>(layers));
  std::byte* at = arena.as<std::byte>();
  uint64_t seed = 100;
  for (Layer& l : all) {
    for (int e = 0; e < kExperts; ++e) {
      for (int k = 0; k < 2; ++k, at += up_each)
        l.up.push_back(std::make_unique<BenchMatrix>(at, kInter, kHidden, 4, 64, seed++));
      l.down.push_back(std::make_unique<BenchMatrix>(at, kHidden, kInter, 4, 64, seed++));
      at += down_each;
    }
  }
  std::vector<float> x(kHidden), g(static_cast<size_t>(2 * kExperts * kInter)),
      y(static_cast<size_t>(kExperts * kHidden));
  for (int64_t c = 0; c < kHidden; ++c) x[static_cast<size_t>(c)] = std::sin(0.1f * c);
  X24Buffer x24;
  std::vector<X24Buffer> down_x24(kExperts);
  Q8Buffer x8;
  std::vector<Q8Buffer> down_x8(kExperts);
  ExpertLayerTimes out{0, 0, 2.0 * kExperts * static_cast<double>(up_each),
                       kExperts * static_cast<double>(down_each)};
  // Exact: the integer method where the CPU has it, else the float32 product (as the backend).
  const bool integer = !int8 && x24.prepare(x.data(), kHidden, 64);
  // One parallel loop over the rows of several products of rows_each rows (the backend's batch).
  auto batch = [&](const std::vector<std::unique_ptr<BenchMatrix>>& mats, int64_t rows_each,
                   int64_t cols, auto&& product) {
    const int64_t total = rows_each * static_cast<int64_t>(mats.size());
    pool.parallel_for(total, std::max<int64_t>(4, 65536 / cols), [&](int64_t b, int64_t e) {
      for (int64_t m = b / rows_each; m * rows_each < e; ++m) {
        const int64_t lo = std::max(b, m * rows_each) - m * rows_each;
        const int64_t hi = std::min(e, (m + 1) * rows_each) - m * rows_each;
        product(static_cast<size_t>(m), mats[static_cast<size_t>(m)]->view, lo, hi);
      }
    });
  };
  std::vector<double> up_ms, down_ms;
  for (int r = 0; r < runs + 1; ++r) {
    double t_up = 0, t_down = 0;
    for (const Layer& l : all) {
      auto t0 = Clock::now();
      if (int8) x8.quantize(x.data(), 1, kHidden, kHidden, 4);  // per layer, as the backend does
      batch(l.up, kInter, kHidden, [&](size_t m, const QuantMatrix& w, int64_t lo, int64_t hi) {
        float* out_rows = g.data() + m * kInter;
        if (int8)
          qmatvec_q8(w, x8.row(0), out_rows, lo, hi);
        else if (integer)
          qmatvec_x24(w, x24, out_rows, lo, hi);
        else
          qmatvec(w, x.data(), out_rows, lo, hi);
      });
      t_up += seconds_since(t0);
      t0 = Clock::now();
      for (size_t e = 0; e < kExperts; ++e) {  // the GeGLU's output stands in: gate's values
        const float* in = g.data() + 2 * e * static_cast<size_t>(kInter);
        if (int8)
          down_x8[e].quantize(in, 1, kInter, kInter, 4);
        else if (integer)
          down_x24[e].prepare(in, kInter, 64);
      }
      batch(l.down, kHidden, kInter, [&](size_t m, const QuantMatrix& w, int64_t lo, int64_t hi) {
        float* out_rows = y.data() + m * kHidden;
        if (int8)
          qmatvec_q8(w, down_x8[m].row(0), out_rows, lo, hi);
        else if (integer)
          qmatvec_x24(w, down_x24[m], out_rows, lo, hi);
        else
          qmatvec(w, g.data() + 2 * m * kInter, out_rows, lo, hi);
      });
      t_down += seconds_since(t0);
    }
    if (r > 0) {  // run 0 warms up
      up_ms.push_back(t_up * 1e3 / layers);
      down_ms.push_back(t_down * 1e3 / layers);
    }
  }
  out.gate_up_ms = median(up_ms);
  out.down_ms = median(down_ms);
  return out;
}

// The expert layer at every thread count, exact and with 8-bit activations: a line each on
// stderr, and the JSON array's entries.
std::string expert_layer_runs(const std::vector<int>& thread_counts,
                              const std::vector<double>& bandwidth, int runs, size_t sweep_bytes) {
  std::string json;
  for (size_t t = 0; t < thread_counts.size(); ++t) {
    for (bool int8 : {false, true}) {
      ThreadPool pool(thread_counts[t]);
      const ExpertLayerTimes e = bench_expert_layer(pool, runs, sweep_bytes, int8);
      const double up_gbps = e.bytes_gate_up / (e.gate_up_ms * 1e-3) / 1e9;
      const double down_gbps = e.bytes_down / (e.down_ms * 1e-3) / 1e9;
      const double gbps =
          (e.bytes_gate_up + e.bytes_down) / ((e.gate_up_ms + e.down_ms) * 1e-3) / 1e9;
      const char* activations = int8 ? "int8" : "exact";
      std::fprintf(stderr,
                   "8 routed experts, %s, %d thread(s): gate/up %.3f ms (%.2f GB/s), down %.3f "
                   "ms (%.2f GB/s), layer %.2f GB/s (%.0f%%)\n",
                   activations, thread_counts[t], e.gate_up_ms, up_gbps, e.down_ms, down_gbps, gbps,
                   gbps / bandwidth[t] * 100);
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "%s\n    {\"activations\": \"%s\", \"threads\": %d, \"gate_up_ms\": %s, "
                    "\"down_ms\": %s, \"gbps\": %s, \"fraction_of_bandwidth\": %s}",
                    json.empty() ? "" : ",", activations, thread_counts[t],
                    json_number(e.gate_up_ms).c_str(), json_number(e.down_ms).c_str(),
                    json_number(gbps).c_str(), json_number(gbps / bandwidth[t]).c_str());
      json += buf;
    }
  }
  return json;
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
                   "[--only ROWSxCOLS[:BITS]|experts]\n"
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

  const std::string experts_json =
      (only.empty() || only == "experts")
          ? expert_layer_runs(thread_counts, bandwidth, runs, sweep_bytes)
          : "";

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
    const size_t each = BenchMatrix::bytes_needed(sh.rows, sh.cols, sh.bits, 64);
    AlignedBuffer arena(each * static_cast<size_t>(copies));
    std::vector<std::unique_ptr<BenchMatrix>> mats;
    for (int c = 0; c < copies; ++c) {
      mats.push_back(std::make_unique<BenchMatrix>(arena.as<std::byte>() + each * c, sh.rows,
                                                   sh.cols, sh.bits, 64, 10 + c));
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
  out += "},\n  \"expert_layer\": [" + experts_json + (experts_json.empty() ? "" : "\n  ") +
         "],\n  \"results\": [\n";
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
