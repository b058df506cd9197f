// redwing-bench-prefill: an interleaved A/B of the exact prefill product alone, at Gemma 4
// 26B-A4B shapes: the float32 qmatmul of the best SIMD ISA without matrix units (A) against the
// matrix-unit path the CPU backend takes on AMX CPUs (B: the input split into bfloat16 parts
// once, counted in the time, then qmatmul_split), or with --x24 against the integer method the
// backend takes on AVX512-VNNI CPUs without AMX (B: the input prepared as 24-bit limbs once,
// counted in the time, then qmatmul_x24). Both run on the same thread pool with the same row
// chunks as the backend. Each round times A and B back to back, alternating which goes
// first, so that a shared machine's load hits both alike; it prints the median time of each, the
// median of the per-round ratios, and every ratio.
//
//   redwing-bench-prefill [--threads 2] [--rounds 5] [--tokens 128,512] [--base avx512]
//                         [--cpu-time] [--avx2-previous] [--x24]
//
// --avx2-previous compares the AVX2 qmatmuls instead (no AMX needed): A is the previous kernel
// (dot products over whole dequantized rows), B the blocked outer-product one the avx2 table now
// has (docs/cpu.md).
//
// --cpu-time measures the process's CPU time instead of wall time: on a loaded machine that
// tracks the kernels' own cost much more steadily (with 1 thread; with more, waiting threads
// spin and count too).
//
// Expert products run at the tokens each expert gets on average (tokens * 8 / 128).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_impl.h"
#include "backend/cpu/thread_pool.h"
#include "bench_median.h"

using namespace redwing;
using namespace redwing::cpu;

namespace {

using Clock = std::chrono::steady_clock;

using bench::median;

uint64_t next_random(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// A 4-bit, group-64 matrix with random codes and bf16 scales and biases of model-like size.
struct BenchMatrix {
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases;
  QuantMatrix view;
  BenchMatrix(int64_t rows, int64_t cols, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    packed.resize(static_cast<size_t>(rows * cols / 8));
    for (auto& w : packed) w = static_cast<uint32_t>(next_random(s));
    scales.resize(static_cast<size_t>(rows * cols / 64));
    biases.resize(scales.size());
    for (size_t i = 0; i < scales.size(); ++i) {
      scales[i] = f32_to_bf16(0.001f + 0.01f * static_cast<float>(next_random(s) % 100) / 100.0f);
      biases[i] = f32_to_bf16(-0.05f + 0.1f * static_cast<float>(next_random(s) % 100) / 100.0f);
    }
    view = {packed.data(), scales.data(), biases.data(), ScaleType::bf16, 4, 64, rows, cols};
  }
};

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  int rounds = 5;
  std::vector<int> token_counts{128, 512};
  Isa base = Isa::avx512;
  bool cpu_time = false;
  bool avx2_previous = false;
  bool x24 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--tokens" && i + 1 < argc) {
      token_counts = parse_list(argv[++i]);
    } else if (a == "--cpu-time") {
      cpu_time = true;
    } else if (a == "--avx2-previous") {
      avx2_previous = true;
    } else if (a == "--x24") {
      x24 = true;
    } else if (a == "--base" && i + 1 < argc) {
      const std::string b = argv[++i];
      base = b == "avx2" ? Isa::avx2 : b == "scalar" ? Isa::scalar : Isa::avx512;
    } else {
      std::fprintf(stderr,
                   "usage: redwing-bench-prefill [--threads 2] [--rounds 5] [--tokens 128,512] "
                   "[--base avx512|avx2|scalar] [--cpu-time] [--avx2-previous] [--x24]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (avx2_previous && !set_active_isa(Isa::avx2)) {
    std::fprintf(stderr, "redwing-bench-prefill: this CPU has no AVX2; nothing to do\n");
    return 1;
  }
  if (x24 && (!set_active_isa(Isa::avx512) || !integer_exact_product_active())) {
    std::fprintf(stderr, "redwing-bench-prefill: this CPU has no AVX512-VNNI; nothing to do\n");
    return 1;
  }
  if (!avx2_previous && !x24 && (!set_active_isa(Isa::amx) || !set_active_isa(base))) {
    std::fprintf(stderr, "redwing-bench-prefill: this CPU has no AMX (or no %s); nothing to do\n",
                 isa_name(base));
    return 1;
  }
  struct Shape {
    const char* name;
    int64_t rows, cols;
    bool expert;
  };
  const Shape shapes[] = {
      {"q/k/v stacked", 8192, 2816, false},   {"o", 2816, 4096, false},
      {"gate/up stacked", 4224, 2816, false}, {"down", 2816, 2112, false},
      {"expert gate/up", 1408, 2816, true},   {"expert down", 2816, 704, true},
  };
  ThreadPool pool(threads);
  if (avx2_previous)
    std::printf("A = previous avx2 qmatmul, B = avx2 qmatmul; %d thread(s), %d rounds, %s\n",
                threads, rounds, cpu_time ? "CPU time" : "wall time");
  else if (x24)
    std::printf(
        "A = avx512 qmatmul, B = x24 (prepare + qmatmul_x24); %d thread(s), %d rounds, %s\n",
        threads, rounds, cpu_time ? "CPU time" : "wall time");
  else
    std::printf("A = %s qmatmul, B = amx (split + qmatmul_split); %d thread(s), %d rounds, %s\n",
                isa_name(base), threads, rounds, cpu_time ? "CPU time" : "wall time");
  std::printf("%-16s %6s %11s %11s %8s  per-round B/A speed-up\n", "product", "tokens", "A ms",
              "B ms", "A/B");
  for (int n_tokens : token_counts) {
    for (const Shape& sh : shapes) {
      const int64_t n = sh.expert ? std::max<int64_t>(1, int64_t{n_tokens} * 8 / 128) : n_tokens;
      BenchMatrix m(sh.rows, sh.cols, static_cast<uint64_t>(sh.rows + sh.cols));
      std::vector<float> x(static_cast<size_t>(n * sh.cols));
      uint64_t s = 7;
      for (auto& v : x) v = static_cast<float>(next_random(s) % 2001) / 1000.0f - 1.0f;
      std::vector<float> ya(static_cast<size_t>(n * sh.rows)), yb(ya.size());
      const int64_t grain = std::max<int64_t>(4, 65536 / sh.cols);
      const int64_t split_grain = (std::max<int64_t>(32, 65536 / sh.cols) + 31) / 32 * 32;
      SplitActivation xs;
      X24Buffer xq;
      const QuantMatrix& w = m.view;
#if defined(REDWING_HAVE_AVX2)
      const auto previous = avx2_previous_qmatmul();
#else
      const decltype(KernelTable::qmatmul) previous = nullptr;  // unreachable: no avx2 table
#endif
      auto run_a = [&] {
        if (avx2_previous) {
          // Directly, with the argument checks qmatmul would make already passed by B's calls.
          pool.parallel_for(w.rows, grain, [&](int64_t b, int64_t e) {
            previous(w, x.data(), n, w.cols, ya.data(), w.rows, b, e);
          });
          return;
        }
        set_active_isa(x24 ? Isa::avx512 : base);
        pool.parallel_for(w.rows, grain, [&](int64_t b, int64_t e) {
          qmatmul(w, x.data(), n, w.cols, ya.data(), w.rows, b, e);
        });
      };
      auto run_b = [&] {
        if (avx2_previous) {
          pool.parallel_for(w.rows, grain, [&](int64_t b, int64_t e) {
            qmatmul(w, x.data(), n, w.cols, yb.data(), w.rows, b, e);
          });
          return;
        }
        if (x24) {
          xq.resize(n, w.cols, static_cast<int>(w.group_size));
          pool.parallel_for(n, 4, [&](int64_t b, int64_t e) {
            for (int64_t t = b; t < e; ++t) xq.prepare_row(t, x.data() + t * w.cols);
          });
          pool.parallel_for(w.rows, grain, [&](int64_t b, int64_t e) {
            qmatmul_x24(w, xq, yb.data(), w.rows, b, e);
          });
          return;
        }
        set_active_isa(Isa::amx);
        xs.resize(n, w.cols);
        pool.parallel_for(n, 4, [&](int64_t b, int64_t e) {
          for (int64_t t = b; t < e; ++t) xs.split_row(t, x.data() + t * w.cols);
        });
        pool.parallel_for(w.rows, split_grain, [&](int64_t b, int64_t e) {
          qmatmul_split(w, xs, yb.data(), w.rows, b, e);
        });
      };
      // Enough repetitions per timing for about 20 ms of work on the slower path.
      run_a();
      run_b();
      auto now = [&] {
        if (!cpu_time)
          return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
        timespec ts{};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
      };
      auto time = [&](auto&& fn, int reps) {
        const double t0 = now();
        for (int r = 0; r < reps; ++r) fn();
        return (now() - t0) / reps;
      };
      const double probe = time(run_a, 1);
      const int reps = std::max(1, static_cast<int>(0.02 / std::max(probe, 1e-6)));
      std::vector<double> ta, tb, ratio;
      for (int r = 0; r < rounds; ++r) {
        double a = 0, b = 0;
        if (r % 2 == 0) {
          a = time(run_a, reps);
          b = time(run_b, reps);
        } else {
          b = time(run_b, reps);
          a = time(run_a, reps);
        }
        ta.push_back(a);
        tb.push_back(b);
        ratio.push_back(a / b);
      }
      // The two paths must agree (float32 accuracy; a gross error means a broken kernel).
      double worst = 0, scale = 0;
      for (size_t i = 0; i < ya.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(ya[i] - yb[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(ya[i])));
      }
      std::printf("%-16s %6lld %11.3f %11.3f %7.2fx ", sh.name, static_cast<long long>(n),
                  median(ta) * 1e3, median(tb) * 1e3, median(ratio));
      for (double q : ratio) std::printf(" %.2f", q);
      std::printf("   (max |A-B| %.2g of max |A| %.3g)\n", worst, scale);
      std::fflush(stdout);
    }
  }
  set_active_isa(detect_isa());
  return 0;
}
