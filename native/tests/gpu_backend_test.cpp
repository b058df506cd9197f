// The GPU backend's kernels against the CPU backend, op by op, on random data and odd shapes,
// through Vulkan. On machines without a GPU (CI) this runs on Mesa's lavapipe: the tests force
// its driver file so the same device is tested everywhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backend/backend_select.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "lavapipe.h"
#include "platform/file.h"
#include "runtime/sampler.h"
#if defined(REDWING_HAVE_VULKAN)
#include "backend/gpu/gpu_backend.h"
#endif
#if defined(REDWING_HAVE_METAL)
#include "backend/gpu/metal/metal_device.h"
#endif

using namespace redwing;

#if defined(REDWING_HAVE_VULKAN)

namespace {

// threads: the kernels' workgroup shape (device.h's workgroup_threads); 0 takes the device's own
// choice (64 on lavapipe).
std::unique_ptr<Backend> gpu_backend(uint32_t threads = 0) {
#if defined(REDWING_HAVE_METAL)
  // On a Mac the same tests run through Metal with REDWING_GPU_TEST_API=metal (docs/macos.md);
  // otherwise through Vulkan (MoltenVK there).
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return make_gpu_backend(gpu::open_metal_device(0));
#endif
  test_support::use_lavapipe();
  const auto devices = gpu::list_vulkan_devices();
  REQUIRE_MESSAGE(!devices.empty(), "no Vulkan device (install mesa-vulkan-drivers)");
  return make_gpu_backend(gpu::open_vulkan_device(0, threads));
}

// A GPU backend created with these settings (name, value) in the environment, unset after.
std::unique_ptr<Backend> gpu_backend_with(
    std::initializer_list<std::pair<const char*, const char*>> settings, uint32_t threads) {
  for (const auto& setting : settings) setenv(setting.first, setting.second, 1);
  auto backend = gpu_backend(threads);
  for (const auto& setting : settings) unsetenv(setting.first);
  return backend;
}

// A GPU backend created with REDWING_GPU_UNFUSED=what: those fusions run as separate ops.
std::unique_ptr<Backend> gpu_backend_unfused(const char* what, uint32_t threads) {
  return gpu_backend_with({{"REDWING_GPU_UNFUSED", what}}, threads);
}

// Runs the rest of the test case once per workgroup shape: 64 threads (what a CPU device such
// as lavapipe picks) and 256 (what a GPU picks), so both stay tested here. On Metal the shape is
// fixed at 256 (the MSL's default) and both passes run it.
#define FOR_EACH_WORKGROUP_SHAPE(threads)                 \
  uint32_t threads = 0;                                   \
  SUBCASE("64 threads per workgroup") { threads = 64; }   \
  SUBCASE("256 threads per workgroup") { threads = 256; } \
  CAPTURE(threads)

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::unique_ptr<Buffer> put(Backend& b, const std::vector<float>& v) {
  auto buf = b.alloc(v.size() * 4);
  b.upload(*buf, 0, v.data(), v.size() * 4);
  return buf;
}

std::vector<float> get(Backend& b, const Buffer& buf) {
  std::vector<float> v(buf.size_bytes() / 4);
  b.download(buf, 0, v.data(), v.size() * 4);
  return v;
}

// max |a - b| / (1 + |b|) over all elements.
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::abs(b[i])));
  }
  return m;
}

// Runs op(backend, buffers) on both backends from the same initial buffers and returns the
// largest relative difference over every buffer afterwards.
template <typename Op>
double compare(Backend& cpu, Backend& gpu, const std::vector<std::vector<float>>& init, Op op) {
  std::vector<std::unique_ptr<Buffer>> bc, bg;
  for (const auto& v : init) {
    bc.push_back(put(cpu, v));
    bg.push_back(put(gpu, v));
  }
  op(cpu, bc);
  op(gpu, bg);
  double m = 0;
  for (size_t i = 0; i < init.size(); ++i)
    m = std::max(m, max_rel(get(gpu, *bg[i]), get(cpu, *bc[i])));
  return m;
}

// A random MLX-quantized matrix in host memory.
struct HostQuant {
  std::vector<uint32_t> packed;
  std::vector<uint16_t> s16, b16;
  std::vector<float> s32, b32;
  HostQuantMatrix m;
  HostQuant(int64_t rows, int64_t cols, int bits, int group, DType st, uint64_t seed) {
    std::mt19937_64 rng(seed);
    packed.resize(static_cast<size_t>(rows * cols * bits / 32));
    for (auto& w : packed) w = static_cast<uint32_t>(rng());
    const size_t ng = static_cast<size_t>(rows * (cols / group));
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (size_t i = 0; i < ng; ++i) {
      const float s = std::abs(d(rng)) + 1e-3f, b = d(rng) * 4.0f;
      s32.push_back(s);
      b32.push_back(b);
      s16.push_back(st == DType::bf16 ? cpu::f32_to_bf16(s) : cpu::f32_to_f16(s));
      b16.push_back(st == DType::bf16 ? cpu::f32_to_bf16(b) : cpu::f32_to_f16(b));
    }
    m.packed = packed.data();
    m.scales = st == DType::f32 ? static_cast<const void*>(s32.data()) : s16.data();
    m.biases = st == DType::f32 ? static_cast<const void*>(b32.data()) : b16.data();
    m.scale_dtype = st;
    m.bits = bits;
    m.group_size = group;
    m.rows = rows;
    m.cols = cols;
  }
};

// The gate, up and down matrices of each expert from `host`, which holds them in that order per
// expert (what import_experts takes).
struct ExpertParts {
  std::vector<HostQuantMatrix> gate, up, down;
};
ExpertParts expert_parts(const std::vector<HostQuant>& host) {
  ExpertParts p;
  for (size_t i = 0; i + 2 < host.size(); i += 3) {
    p.gate.push_back(host[i].m);
    p.up.push_back(host[i + 1].m);
    p.down.push_back(host[i + 2].m);
  }
  return p;
}

// Each of `values` in the environment variable `name` makes creating a backend fail with
// std::invalid_argument (a malformed setting is an error, not a silent default).
void check_setting_refused(const char* name, std::initializer_list<const char*> values) {
  for (const char* bad : values) {
    const std::string value = bad;
    CAPTURE(value);
    setenv(name, bad, 1);
    CHECK_THROWS_AS(gpu_backend(64), std::invalid_argument);
    unsetenv(name);
  }
}

// A layer's key and value caches of `capacity` positions, zeroed, and the view over them.
struct ZeroedKvCache {
  std::unique_ptr<Buffer> k, v;
  KvLayerView view;
};
ZeroedKvCache zeroed_kv_cache(Backend& b, int64_t capacity, bool ring, int kv_heads, int d,
                              KvDType dtype) {
  const size_t elem = dtype == KvDType::f32 ? 4 : 2;
  const size_t bytes = static_cast<size_t>(capacity * kv_heads * d) * elem;
  ZeroedKvCache c{b.alloc(bytes), b.alloc(bytes), {}};
  const auto words = static_cast<int64_t>(bytes / 4);
  b.fill_zero(Mat{c.k.get(), 0, 1, words, words});
  b.fill_zero(Mat{c.v.get(), 0, 1, words, words});
  c.view =
      KvLayerView{c.k.get(), c.v.get(), capacity, ring, ring ? capacity : 0, kv_heads, d, dtype};
  return c;
}

}  // namespace

TEST_CASE("gpu: quantized products and embedding match the CPU for every variant") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  int seed = 1;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType st : {DType::bf16, DType::f16, DType::f32}) {
        const int64_t rows = 37 + group, cols = group * 3;  // several row tiles, odd
        HostQuant q(rows, cols, bits, group, st, static_cast<uint64_t>(seed++));
        auto wc = cpu->import_qweight(q.m);
        auto wg = gpu->import_qweight(q.m);
        for (int64_t tokens : {1, 3, 9, 40, 129}) {  // 40, 129: several token tiles
          CAPTURE(bits);
          CAPTURE(group);
          CAPTURE(static_cast<int>(st));
          CAPTURE(tokens);
          // x with a stride wider than its columns, y at an offset: views, not whole buffers.
          const int64_t xs = cols + 5;
          auto x = randn(static_cast<size_t>(tokens * xs), static_cast<uint64_t>(seed++));
          std::vector<float> y(static_cast<size_t>(tokens * rows + 3), 0.0f);
          const double d = compare(*cpu, *gpu, {x, y}, [&](Backend& b, auto& bufs) {
            const QWeight& w = &b == cpu.get() ? *wc : *wg;
            b.qmatmul(w, Mat{bufs[0].get(), 0, tokens, cols, xs},
                      Mat{bufs[1].get(), 3, tokens, rows, rows});
          });
          CHECK(d < 1e-4);  // summation order differs; a wrong kernel is off by O(1)
        }
        const std::vector<int32_t> ids = {0, static_cast<int32_t>(rows - 1), 5, 5};
        std::vector<float> out(ids.size() * static_cast<size_t>(cols), 0.0f);
        const double d = compare(*cpu, *gpu, {out}, [&](Backend& b, auto& bufs) {
          b.embed(&b == cpu.get() ? *wc : *wg, ids, 1.5f,
                  Mat{bufs[0].get(), 0, static_cast<int64_t>(ids.size()), cols, cols});
        });
        CHECK(d < 1e-6);
      }
  // A token id outside the table is an error on every backend, before any work.
  HostQuant q(8, 64, 4, 64, DType::bf16, 99);
  auto w = gpu->import_qweight(q.m);
  auto out = gpu->alloc(64 * 4);
  const std::vector<int32_t> bad = {8};
  CHECK_THROWS_AS(gpu->embed(*w, bad, 1.0f, Mat{out.get(), 0, 1, 64, 64}), std::out_of_range);
}

// Many devices opened and closed one after another in one process, as a long-running service
// does on every model load, all work, and with enumeration they share one Vulkan instance. On
// the H200 the fourteenth device of a test process found no device at all while every device
// made and destroyed its own instance (NVIDIA's driver goes wrong after about ten such cycles).
TEST_CASE("gpu: devices opened one after another share one Vulkan instance and all work") {
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;  // Vulkan only
  auto cpu = make_cpu_backend(2);
  HostQuant q(72, 256, 4, 64, DType::bf16, 4001);
  auto wc = cpu->import_qweight(q.m);
  const auto x = randn(256, 4002);
  const std::vector<float> y(72, 0.0f);
  for (int i = 0; i < 20; ++i) {
    CAPTURE(i);
    REQUIRE(!gpu::list_vulkan_devices().empty());
    auto gpu = gpu_backend(i % 2 == 0 ? 64 : 256);
    auto wg = gpu->import_qweight(q.m);
    const double d = compare(*cpu, *gpu, {x, y}, [&](Backend& b, auto& bufs) {
      b.qmatmul(&b == cpu.get() ? *wc : *wg, Mat{bufs[0].get(), 0, 1, 256, 256},
                Mat{bufs[1].get(), 0, 1, 72, 72});
    });
    CHECK(d < 1e-4);
  }
  CHECK(gpu::vulkan_instances_created() == 1);
}

// Every kernel built ahead on a thread of its own (Device::prepare_kernels, a GPU's default,
// REDWING_GPU_PREPARE_KERNELS=1 here): a backend destroyed while that thread may still run waits
// for it (a joinable thread left behind terminates the process), and one that computes at once
// takes the pipelines it built (the first dispatch waits for the thread) and gives the products
// and a norm within 1e-4 of the CPU, the same bits as a backend building its kernels at first use.
TEST_CASE("gpu: kernels built ahead on a thread of their own work from the first dispatch") {
  check_setting_refused("REDWING_GPU_PREPARE_KERNELS", {"yes", "2", "1,0"});
  auto cpu = make_cpu_backend(2);
  HostQuant q(72, 256, 4, 64, DType::bf16, 4101);
  auto wc = cpu->import_qweight(q.m);
  const auto x = randn(256, 4102);
  const std::vector<float> y(72, 0.0f), n(256, 0.0f);
  setenv("REDWING_GPU_PREPARE_KERNELS", "1", 1);
  for (int i = 0; i < 3; ++i) gpu_backend(64);  // destroyed while preparing, or just after
  auto prepared = gpu_backend(64);
  setenv("REDWING_GPU_PREPARE_KERNELS", "0", 1);
  auto lazy = gpu_backend(64);
  unsetenv("REDWING_GPU_PREPARE_KERNELS");
  std::vector<std::vector<float>> outputs;
  for (Backend* gpu : {prepared.get(), lazy.get()}) {
    auto wg = gpu->import_qweight(q.m);
    std::vector<std::unique_ptr<Buffer>> kept;
    const double d = compare(*cpu, *gpu, {x, y, n}, [&](Backend& b, auto& bufs) {
      b.qmatmul(&b == cpu.get() ? *wc : *wg, Mat{bufs[0].get(), 0, 1, 256, 256},
                Mat{bufs[1].get(), 0, 1, 72, 72});
      b.rms_norm(Mat{bufs[0].get(), 0, 1, 256, 256}, nullptr, 0.0f, 1e-6f,
                 Mat{bufs[2].get(), 0, 1, 256, 256});
      if (&b == gpu) {
        auto joined = get(b, *bufs[1]);
        const auto normed = get(b, *bufs[2]);
        joined.insert(joined.end(), normed.begin(), normed.end());
        outputs.push_back(joined);
      }
    });
    CHECK(d < 1e-4);
  }
  REQUIRE(outputs.size() == 2);
  CHECK(outputs[0] == outputs[1]);
}

// The prefill products (more than 4 tokens) in the kernels and tiles REDWING_GPU_QMATMUL forces
// (`modes`), in 64- and 256-thread workgroups, on random shapes: rows and tokens that are not
// multiples of a tile (edge tiles in both directions), 4 and 8 bits, groups 32/64/128,
// bf16/f16/f32 scales, x with a stride wider than its columns, y at an offset.
namespace {

void check_prefill_products(std::initializer_list<const char*> modes) {
  auto cpu = make_cpu_backend(2);
  for (const uint32_t threads : {64u, 256u})
    for (const char* mode_name : modes) {
      const std::string mode = mode_name;
      CAPTURE(threads);
      CAPTURE(mode);
      setenv("REDWING_GPU_QMATMUL", mode_name, 1);
      auto gpu = gpu_backend(threads);
      unsetenv("REDWING_GPU_QMATMUL");
      std::mt19937_64 rng(threads * 7919 + mode.size());
      const int64_t token_counts[] = {5, 7, 8, 17, 33, 64, 65, 129};
      for (int trial = 0; trial < 6; ++trial) {
        const int bits = rng() % 2 ? 8 : 4;
        const int group = 32 << (rng() % 3);
        const DType st = std::array{DType::bf16, DType::f16, DType::f32}[rng() % 3];
        const int64_t rows = 1 + static_cast<int64_t>(rng() % 200);
        // Up to 640 columns: the narrow kernel's 512-column slabs, many of the tiled ones' 32
        // and 16.
        const int64_t cols = group * (1 + static_cast<int64_t>(rng() % (640 / group)));
        const int64_t tokens = token_counts[rng() % std::size(token_counts)];
        CAPTURE(bits);
        CAPTURE(group);
        CAPTURE(static_cast<int>(st));
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(tokens);
        HostQuant q(rows, cols, bits, group, st, rng());
        auto wc = cpu->import_qweight(q.m);
        auto wg = gpu->import_qweight(q.m);
        const int64_t xs = cols + 3;
        auto x = randn(static_cast<size_t>(tokens * xs), rng());
        std::vector<float> y(static_cast<size_t>(tokens * (rows + 2) + 1), 0.0f);
        const double d = compare(*cpu, *gpu, {x, y}, [&](Backend& b, auto& bufs) {
          b.qmatmul(&b == cpu.get() ? *wc : *wg, Mat{bufs[0].get(), 0, tokens, cols, xs},
                    Mat{bufs[1].get(), 1, tokens, rows, rows + 2});
        });
        CHECK(d < 1e-4);  // summation order differs; a wrong kernel is off by O(1)
      }
    }
}

}  // namespace

// The narrow qmatmul.comp and the 4 x 4 register blocks of qmatmul_tiled.comp with 32, 64 and
// 128 rows per tile and fitted. (Two test cases, not one: on the H200's driver a test case that
// made more than 13 devices one after another could not enumerate a 14th, whatever kernels ran;
// docs/gpu.md, "Seventeenth round".)
TEST_CASE("gpu: prefill products match the CPU in every kernel and tile") {
  check_prefill_products({"narrow", "tiled:32", "tiled:64", "tiled:128", "tiled"});
  // A malformed REDWING_GPU_QMATMUL is an error naming the variable (the Metal device reads
  // none: it runs the automatic choice).
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;
  check_setting_refused("REDWING_GPU_QMATMUL", {"tiled:48", "wide", "tiled:", "r8:32", "r8:"});
}

// qmatmul_tiled_r8.comp's 8 x 8 register blocks with 64, 128 and 256 rows per tile and fitted.
TEST_CASE("gpu: prefill products in 8 x 8 register blocks match the CPU in every tile") {
  check_prefill_products({"r8:64", "r8:128", "r8:256", "r8"});
}

// Which prefill kernel and tile a device takes (device.h's choose_matmul_tile).
TEST_CASE("gpu: the prefill product's tile fits the tokens and the device") {
  gpu::DeviceInfo gpu_info;  // a GPU: 256 threads, 4 x 4 blocks unless forced
  gpu_info.workgroup_threads = 256;
  gpu::MatmulTile t = gpu::choose_matmul_tile(gpu_info, 2816, 512);
  CHECK((t.tiled && !t.r8 && t.rows == 64 && t.tokens == 64));
  t = gpu::choose_matmul_tile(gpu_info, 262144, 20);  // few tokens: the taller tile
  CHECK((t.tiled && !t.r8 && t.rows == 128 && t.tokens == 32));
  // An expert's product over a few tokens: 11 tiles, too few for a GPU; the narrow kernel.
  t = gpu::choose_matmul_tile(gpu_info, 1408, 8);
  CHECK((!t.tiled && t.rows == 16 && t.tokens == 8));
  gpu_info.matmul.mode = gpu::MatmulPolicy::tiled;
  t = gpu::choose_matmul_tile(gpu_info, 1408, 8);
  CHECK((t.tiled && !t.r8 && t.rows == 128));
  gpu_info.matmul.tile_rows = 32;
  t = gpu::choose_matmul_tile(gpu_info, 1408, 8);
  CHECK((t.tiled && !t.r8 && t.rows == 32 && t.tokens == 128));
  // Forced 8 x 8 blocks: 128 x 128 tiles, taller while the tokens fill them, up to the 256 x 64
  // that the shared memory holds.
  gpu_info.matmul = {gpu::MatmulPolicy::r8, 0};
  t = gpu::choose_matmul_tile(gpu_info, 2816, 512);
  CHECK((t.tiled && t.r8 && t.rows == 128 && t.tokens == 128));
  t = gpu::choose_matmul_tile(gpu_info, 1408, 8);
  CHECK((t.tiled && t.r8 && t.rows == 256 && t.tokens == 64));
  gpu_info.matmul.tile_rows = 64;
  t = gpu::choose_matmul_tile(gpu_info, 1408, 8);
  CHECK((t.tiled && t.r8 && t.rows == 64 && t.tokens == 256));

  gpu::DeviceInfo cpu_device;  // lavapipe: 64 threads, always tiled
  cpu_device.workgroup_threads = 64;
  cpu_device.software = true;
  t = gpu::choose_matmul_tile(cpu_device, 40, 5);
  CHECK((t.tiled && !t.r8 && t.rows == 128 && t.tokens == 8));
  // 8 x 8 blocks where the tokens fill a column of their tiles (64 x 64 fitted taller).
  t = gpu::choose_matmul_tile(cpu_device, 40, 16);
  CHECK((t.tiled && t.r8 && t.rows == 256 && t.tokens == 16));
  t = gpu::choose_matmul_tile(cpu_device, 40, 128);
  CHECK((t.tiled && t.r8 && t.rows == 64 && t.tokens == 64));
  t = gpu::choose_matmul_tile(cpu_device, 40, 48);  // 48 tokens do not fill 64: 4 x 4
  CHECK((t.tiled && !t.r8 && t.rows == 32 && t.tokens == 32));
  // A forced row count the block cannot take at these threads is fitted instead (256 rows at 64
  // threads is 4 x 4 blocks' 256 x 4 tile, beyond the shared memory).
  cpu_device.matmul = {gpu::MatmulPolicy::tiled, 256};
  t = gpu::choose_matmul_tile(cpu_device, 40, 128);
  CHECK((t.tiled && !t.r8 && t.rows == 32 && t.tokens == 32));
  cpu_device.matmul = {gpu::MatmulPolicy::narrow, 0};
  CHECK(!gpu::choose_matmul_tile(cpu_device, 40, 128).tiled);

  // The experts' grouped product: on a GPU the 4 x 4 blocks' tile only where the experts' rows
  // fill it on average (chunk 128: ~8 rows per expert, the narrow kernel); lavapipe always a
  // register tile, the 8 x 4 blocks' where the rows fill it.
  gpu::DeviceInfo gpu2;
  gpu2.workgroup_threads = 256;
  CHECK(!gpu::choose_grouped_matmul_tile(gpu2, 8).tiled);
  CHECK(!gpu::choose_grouped_matmul_tile(gpu2, 31).tiled);
  t = gpu::choose_grouped_matmul_tile(gpu2, 32);
  CHECK((t.tiled && !t.r8 && t.rows == 128 && t.tokens == 32));
  t = gpu::choose_grouped_matmul_tile(gpu2, 100);
  CHECK((t.tiled && !t.r8 && t.rows == 64 && t.tokens == 64));
  gpu2.matmul.mode = gpu::MatmulPolicy::tiled;
  CHECK(gpu::choose_grouped_matmul_tile(gpu2, 8).tiled);
  gpu2.matmul.mode = gpu::MatmulPolicy::r8;
  t = gpu::choose_grouped_matmul_tile(gpu2, 32);
  CHECK((t.tiled && t.r8 && t.rows == 256 && t.tokens == 32));
  gpu::DeviceInfo lavapipe;
  lavapipe.workgroup_threads = 64;
  lavapipe.software = true;
  t = gpu::choose_grouped_matmul_tile(lavapipe, 8);
  CHECK((t.tiled && t.r8 && t.rows == 256 && t.tokens == 8));
  t = gpu::choose_grouped_matmul_tile(lavapipe, 13);  // 128 x 16 not filled: 4 x 4
  CHECK((t.tiled && !t.r8 && t.rows == 64 && t.tokens == 16));
  lavapipe.matmul.mode = gpu::MatmulPolicy::narrow;
  CHECK(!gpu::choose_grouped_matmul_tile(lavapipe, 16).tiled);
}

// qmatmul_normed: the CPU runs the norm op then the products; the GPU (REDWING_GPU_FOLD_NORMS=1)
// folds the norm into its decode products (1 and 3 tokens; 9 take the CPU's path there too), over
// one staging chunk and over several (4,096 + 3 groups of columns), for every form of the norm.
TEST_CASE("gpu: norms folded into the decode products match the CPU's norm then product") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  // Folding into every product is opt-in (slower on the H200: docs/gpu.md, fifth round; the
  // default folds only small products, tested below); test it anyway.
  setenv("REDWING_GPU_FOLD_NORMS", "1", 1);
  auto gpu = gpu_backend(threads);
  unsetenv("REDWING_GPU_FOLD_NORMS");
  int seed = 700;
  for (const int64_t cols : {int64_t{192}, int64_t{4096 + 3 * 64}}) {
    const int64_t rows = 37;
    HostQuant q1(rows, cols, 4, 64, DType::bf16, static_cast<uint64_t>(seed++));
    HostQuant q2(rows + 8, cols, 8, 64, DType::f32, static_cast<uint64_t>(seed++));
    auto w1c = cpu->import_qweight(q1.m), w1g = gpu->import_qweight(q1.m);
    auto w2c = cpu->import_qweight(q2.m), w2g = gpu->import_qweight(q2.m);
    const auto nw = randn(static_cast<size_t>(cols), static_cast<uint64_t>(seed++), 0.3f);
    for (int mode = 0; mode < 3; ++mode)  // weighted with an offset, weightless, mul_cols
      for (int64_t tokens : {1, 3, 9}) {
        CAPTURE(cols);
        CAPTURE(mode);
        CAPTURE(tokens);
        const int64_t xs = cols + 3;  // a strided x
        auto x = randn(static_cast<size_t>(tokens * xs), static_cast<uint64_t>(seed++), 2.0f);
        std::vector<float> y1(static_cast<size_t>(tokens * rows), 0.0f);
        std::vector<float> y2(static_cast<size_t>(tokens * (rows + 8)), 0.0f);
        std::vector<float> normed(static_cast<size_t>(tokens * cols), 0.0f);
        const double d = compare(*cpu, *gpu, {x, nw, y1, y2, normed}, [&](Backend& b, auto& bufs) {
          const bool on_cpu = &b == cpu.get();
          Backend::InputNorm norm;
          norm.weight = mode == 1 ? nullptr : bufs[1].get();
          norm.weight_offset = mode == 0 ? 1.0f : 0.0f;
          norm.eps = 1e-6f;
          if (mode == 2) norm.mul_cols = 0.0625f;
          const Mat h{bufs[4].get(), 0, tokens, cols, cols};
          const Backend::QProduct products[] = {
              {on_cpu ? w1c.get() : w1g.get(), h, Mat{bufs[2].get(), 0, tokens, rows, rows}},
              {on_cpu ? w2c.get() : w2g.get(), h,
               Mat{bufs[3].get(), 0, tokens, rows + 8, rows + 8}}};
          b.qmatmul_normed(Mat{bufs[0].get(), 0, tokens, cols, xs}, norm, h, products);
          b.fill_zero(h);  // left unwritten by the folded path
        });
        // Summation order differs (4,288-column rows of unit-scale inputs reach 1.1e-4 on the
        // unfolded 9-token path too); a fold without the norm's factor is off by O(1).
        CHECK(d < 3e-4);
      }
  }
}

// REDWING_GPU_FOLD_NORMS=small folds a norm only into products of at most 1,024 rows in all (the
// router's): one dispatch for a 128-row product, the norm's dispatch then the product for a
// 1,100-row one; both match the CPU. Malformed values are refused.
TEST_CASE("gpu: the small-product norm fold takes only small products") {
  check_setting_refused("REDWING_GPU_FOLD_NORMS", {"yes", "2", "small,1"});
  auto cpu = make_cpu_backend(2);
  setenv("REDWING_GPU_FOLD_NORMS", "small", 1);
  auto gpu = gpu_backend(64);
  unsetenv("REDWING_GPU_FOLD_NORMS");
  const int64_t cols = 256;
  const auto nw = randn(static_cast<size_t>(cols), 901, 0.3f);
  for (const int64_t rows : {int64_t{128}, int64_t{1100}}) {
    CAPTURE(rows);
    HostQuant q(rows, cols, 4, 64, DType::bf16, static_cast<uint64_t>(902 + rows));
    auto wc = cpu->import_qweight(q.m), wg = gpu->import_qweight(q.m);
    const auto x = randn(static_cast<size_t>(cols), 903, 2.0f);
    std::vector<float> y(static_cast<size_t>(rows), 0.0f), normed(static_cast<size_t>(cols), 0.0f);
    uint64_t dispatches = 0;
    const double d = compare(*cpu, *gpu, {x, nw, y, normed}, [&](Backend& b, auto& bufs) {
      const bool on_cpu = &b == cpu.get();
      Backend::InputNorm norm;  // the router's form: weightless norm, times a vector and a scalar
      norm.weight = bufs[1].get();
      norm.eps = 1e-6f;
      norm.mul_cols = 0.0625f;
      const Mat h{bufs[3].get(), 0, 1, cols, cols};
      const Backend::QProduct products[] = {
          {on_cpu ? wc.get() : wg.get(), h, Mat{bufs[2].get(), 0, 1, rows, rows}}};
      const uint64_t before = b.work_counters().dispatches;
      b.qmatmul_normed(Mat{bufs[0].get(), 0, 1, cols, cols}, norm, h, products);
      if (!on_cpu) dispatches = b.work_counters().dispatches - before;
      b.fill_zero(h);  // left unwritten by the folded path
    });
    CHECK(d < 3e-4);
    CHECK(dispatches == (rows <= 1024 ? 1u : 2u));
  }
}

// A MoE layer's router in one dispatch (route_product_to: the product's last workgroup routes):
// the logits and the routes match the CPU's product then route_to, for 1 and 3 tokens, 37 and
// 128 experts, 4- and 8-bit routers, with the norm folded (the router's form) and with the
// norm's own dispatch first (FOLD_NORMS=0); 5 tokens take the separate ops.
TEST_CASE("gpu: the router's product with its routing in one dispatch matches the CPU") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  for (const char* fold : {"small", "0"}) {
    CAPTURE(fold);
    setenv("REDWING_GPU_FOLD_NORMS", fold, 1);
    auto gpu = gpu_backend(threads);
    unsetenv("REDWING_GPU_FOLD_NORMS");
    const int64_t hidden = 320;
    for (const int experts : {37, 128}) {
      for (const int bits : {4, 8}) {
        CAPTURE(experts);
        CAPTURE(bits);
        HostQuant rq(experts, hidden, bits, 64, DType::bf16, static_cast<uint64_t>(950 + bits));
        auto wc = cpu->import_qweight(rq.m), wg = gpu->import_qweight(rq.m);
        const int top_k = 8;
        const auto nw = randn(static_cast<size_t>(hidden), 951, 0.3f);
        const auto pes = randn(static_cast<size_t>(experts), 952);
        for (const int64_t t : {int64_t{1}, int64_t{3}, int64_t{5}}) {
          CAPTURE(t);
          const auto x = randn(static_cast<size_t>(t * hidden), static_cast<uint64_t>(953 + t));
          const size_t count = static_cast<size_t>(t) * top_k;
          std::vector<float> z(static_cast<size_t>(t * hidden), 0.0f);
          std::vector<float> logits(static_cast<size_t>(t * experts), 0.0f);
          std::vector<float> routes(route_buffer_bytes(count) / 4, 0.0f);
          std::vector<int32_t> ids_cpu(count), ids_gpu(count);
          std::vector<float> w_cpu(count), w_gpu(count);
          uint64_t dispatches = 0;
          const double d =
              compare(*cpu, *gpu, {x, nw, pes, z, logits}, [&](Backend& b, auto& bufs) {
                const bool on_cpu = &b == cpu.get();
                auto rb = put(b, routes);
                Backend::InputNorm norm;  // the router's: weightless, times a vector and scalar
                norm.weight = bufs[1].get();
                norm.eps = 1e-6f;
                norm.mul_cols = 0.0625f;
                const Mat zm{bufs[3].get(), 0, t, hidden, hidden};
                const Backend::QProduct router{on_cpu ? wc.get() : wg.get(), zm,
                                               Mat{bufs[4].get(), 0, t, experts, experts}};
                const uint64_t before = b.work_counters().dispatches;
                b.route_product_to(Mat{bufs[0].get(), 0, t, hidden, hidden}, norm, zm, router,
                                   top_k, *bufs[2], *rb);
                if (!on_cpu) dispatches = b.work_counters().dispatches - before;
                b.download(*rb, 0, (on_cpu ? ids_cpu : ids_gpu).data(), count * 4);
                b.download(*rb, route_weights_offset(count), (on_cpu ? w_cpu : w_gpu).data(),
                           count * 4);
                b.fill_zero(zm);  // left unwritten where the norm is folded
              });
          CHECK(d < 3e-4);
          CHECK(ids_gpu == ids_cpu);
          CHECK(max_rel(w_gpu, w_cpu) < 1e-4);
          const uint64_t fused = std::string(fold) == "0" ? 2u : 1u;  // + the norm's dispatch
          CHECK(dispatches == (t <= 4 ? fused : 3u));
        }
      }
    }
  }
}

// Attention's end in a Gemma 4 MoE layer: acc += post_norm(out), then the two pre-norms of the
// new acc, in one dispatch (add_rms_norm_pair) and together with the product before it
// (qmatmul_add_rms_norm_pair: the product's last workgroup); both against the CPU's separate
// ops, 1 and 3 rows (5 through the separate products), 4- and 8-bit, a layer scalar; a row wider
// than the workgroup holds (64 threads x 16 columns) takes the separate ops.
TEST_CASE("gpu: the post-attention norm, residual add and feed-forward norms match the CPU") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  const int64_t in = 192;
  for (const int64_t hidden : {int64_t{352}, int64_t{1100}}) {
    const bool held = hidden <= 16 * static_cast<int64_t>(threads);
    for (const int bits : {4, 8}) {
      HostQuant oq(hidden, in, bits, 32, DType::f16, static_cast<uint64_t>(960 + bits));
      auto oc = cpu->import_qweight(oq.m), og = gpu->import_qweight(oq.m);
      const auto w0 = randn(static_cast<size_t>(hidden), 961, 0.3f);
      const auto w1 = randn(static_cast<size_t>(hidden), 962, 0.3f);
      const auto w2 = randn(static_cast<size_t>(hidden), 963, 0.3f);
      for (const int64_t t : {int64_t{1}, int64_t{3}, int64_t{5}}) {
        for (const bool with_product : {false, true}) {
          CAPTURE(hidden);
          CAPTURE(bits);
          CAPTURE(t);
          CAPTURE(with_product);
          const size_t n = static_cast<size_t>(t * hidden);
          const auto a = randn(static_cast<size_t>(t * in), static_cast<uint64_t>(964 + t));
          const auto o = randn(n, static_cast<uint64_t>(965 + t), 3.0f);
          const auto acc = randn(n, static_cast<uint64_t>(966 + t));
          const std::vector<float> zeros(n, 0.0f);
          uint64_t dispatches = 0;
          const float scale = 0.75f;
          const double d = compare(
              *cpu, *gpu, {a, o, acc, w0, w1, w2, zeros, zeros}, [&](Backend& b, auto& bufs) {
                const bool on_cpu = &b == cpu.get();
                auto m = [&](int i) { return Mat{bufs[i].get(), 0, t, hidden, hidden}; };
                const uint64_t before = b.work_counters().dispatches;
                if (with_product)
                  b.qmatmul_add_rms_norm_pair(*(on_cpu ? oc : og), Mat{bufs[0].get(), 0, t, in, in},
                                              m(1), bufs[3].get(), 0.0f, 1e-6f, m(2), scale,
                                              bufs[4].get(), bufs[5].get(), m(6), m(7));
                else
                  b.add_rms_norm_pair(m(1), bufs[3].get(), 0.0f, 1e-6f, m(2), scale, bufs[4].get(),
                                      bufs[5].get(), m(6), m(7));
                if (!on_cpu) dispatches = b.work_counters().dispatches - before;
                b.fill_zero(m(1));  // left undefined
              });
          CHECK(d < 2e-4);
          if (with_product)
            CHECK(dispatches == (held && t <= 4 ? 1u : held ? 2u : 3u));
          else
            CHECK(dispatches == (held ? 1u : 2u));
        }
      }
    }
  }
}

// A gated MLP's end: gate and up side by side from one batched product, then the down product
// over GeGLU(gate, up), which the GPU computes in its staging on the decode path (1 and 3
// tokens; 9 run the separate ops there too).
TEST_CASE("gpu: gate and up in one buffer and the GeGLU inside the down product match the CPU") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  const int64_t hidden = 160, inter = 96;
  HostQuant gq(inter, hidden, 4, 32, DType::bf16, 801), uq(inter, hidden, 4, 32, DType::bf16, 802);
  HostQuant dq(hidden, inter, 8, 32, DType::f16, 803);
  auto gc = cpu->import_qweight(gq.m), uc = cpu->import_qweight(uq.m),
       dc = cpu->import_qweight(dq.m);
  auto gg = gpu->import_qweight(gq.m), ug = gpu->import_qweight(uq.m),
       dg = gpu->import_qweight(dq.m);
  for (int64_t tokens : {1, 3, 9}) {
    CAPTURE(tokens);
    const auto x = randn(static_cast<size_t>(tokens * hidden), static_cast<uint64_t>(810 + tokens));
    std::vector<float> gu(static_cast<size_t>(tokens * 2 * inter), 0.0f);
    std::vector<float> out(static_cast<size_t>(tokens * hidden), 0.0f);
    const double d = compare(*cpu, *gpu, {x, gu, out}, [&](Backend& b, auto& bufs) {
      const bool on_cpu = &b == cpu.get();
      const Mat in{bufs[0].get(), 0, tokens, hidden, hidden};
      const Mat both{bufs[1].get(), 0, tokens, 2 * inter, 2 * inter};
      const Backend::QProduct products[] = {
          {on_cpu ? gc.get() : gg.get(), in, both.col_range(0, inter)},
          {on_cpu ? uc.get() : ug.get(), in, both.col_range(inter, inter)}};
      b.qmatmul_batch(products);
      b.geglu_qmatmul(on_cpu ? *dc : *dg, both.col_range(0, inter), both.col_range(inter, inter),
                      Mat{bufs[2].get(), 0, tokens, hidden, hidden});
      b.fill_zero(both.col_range(0, inter));  // gate is left undefined
    });
    CHECK(d < 1e-4);
  }
}

// REDWING_GPU_MATVEC_GROUPS: the decode products (qmatvec and the experts' gate/up, moe_matvec)
// on a grid of fewer workgroups than blocks of 8 rows, each staging x once and looping over
// blocks. Every row adds the same terms in the same order, so the outputs must be the bits of the
// one-workgroup-per-block grid (and within 1e-4 of the CPU): plain 4- and 8-bit products, a
// folded norm, the GeGLU inside the down product, rows wider than one staging chunk (not looped),
// the routed experts, the products whose last workgroup goes on (the output product with the
// norms after it, the router with its routing), and a product of 16 blocks a workgroup and more
// (qmatvec_wide: 4 blocks at once whatever the setting), for 1 and 3 tokens; the same with 2 and
// 4 blocks computed at once (REDWING_GPU_MATVEC_LOOP_ROWS). Malformed values are refused.
TEST_CASE("gpu: decode products looping over row blocks give the one-workgroup-per-block bits") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  setenv("REDWING_GPU_FOLD_NORMS", "1", 1);  // a norm folded into every decode product
  setenv("REDWING_GPU_MATVEC_GROUPS", "0", 1);
  auto whole = gpu_backend(threads);
  setenv("REDWING_GPU_MATVEC_GROUPS", "3", 1);
  setenv("REDWING_GPU_MATVEC_LOOP_ROWS", "1", 1);
  auto looped = gpu_backend(threads);
  setenv("REDWING_GPU_MATVEC_LOOP_ROWS", "2", 1);  // two blocks at once, then the rest singly
  auto looped2 = gpu_backend(threads);
  setenv("REDWING_GPU_MATVEC_LOOP_ROWS", "4", 1);
  auto looped4 = gpu_backend(threads);
  unsetenv("REDWING_GPU_MATVEC_LOOP_ROWS");
  unsetenv("REDWING_GPU_MATVEC_GROUPS");
  unsetenv("REDWING_GPU_FOLD_NORMS");
  Backend* backends[] = {cpu.get(), whole.get(), looped.get(), looped2.get(), looped4.get()};

  const int64_t rows = 300, cols = 192, wide = 4096 + 128, inter = 128;
  HostQuant q4(rows, cols, 4, 64, DType::bf16, 1501), q8(rows + 1, cols, 8, 32, DType::f32, 1502);
  HostQuant qw(rows, wide, 4, 64, DType::f16, 1503), qd(rows, inter, 4, 64, DType::bf16, 1504);
  const int64_t many = 8 * 3 * 17 + 5;  // 52 blocks: 17 a workgroup and a partial one
  HostQuant qm(many, cols, 4, 32, DType::bf16, 1505);
  const int experts = 4, top_k = 2;
  std::vector<HostQuant> host;  // gate, up, down per expert
  for (int e = 0; e < experts; ++e) {
    host.emplace_back(inter, cols, 4, 64, DType::bf16, 1510 + 3 * e);
    host.emplace_back(inter, cols, 4, 64, DType::bf16, 1511 + 3 * e);
    host.emplace_back(cols, inter, 8, 32, DType::bf16, 1512 + 3 * e);
  }
  const auto [gate, up, down] = expert_parts(host);
  struct Imported {
    std::unique_ptr<QWeight> w4, w8, ww, wd, wm;
    std::unique_ptr<ExpertBank> bank;
  };
  std::vector<Imported> weights;
  for (Backend* b : backends)
    weights.push_back({b->import_qweight(q4.m), b->import_qweight(q8.m), b->import_qweight(qw.m),
                       b->import_qweight(qd.m), b->import_qweight(qm.m),
                       b->import_experts(gate, up, down)});

  for (int64_t t : {1, 3}) {
    CAPTURE(t);
    const auto x = randn(static_cast<size_t>(t * wide), static_cast<uint64_t>(1520 + t), 2.0f);
    const auto nw = randn(static_cast<size_t>(cols), static_cast<uint64_t>(1530 + t), 0.3f);
    const auto gu = randn(static_cast<size_t>(t * 2 * inter), static_cast<uint64_t>(1540 + t));
    const auto acc0 = randn(static_cast<size_t>(t * rows), static_cast<uint64_t>(1550 + t));
    const auto pair_w = randn(static_cast<size_t>(3 * rows), static_cast<uint64_t>(1560 + t), 0.3f);
    const auto expert_scale = randn(static_cast<size_t>(rows + 1), static_cast<uint64_t>(1570 + t));
    const int router_top_k = 4;
    std::vector<int32_t> ids;
    std::vector<float> route_w;
    for (int64_t i = 0; i < t * top_k; ++i) {
      ids.push_back(static_cast<int32_t>((i * 3 + 1) % experts));
      route_w.push_back(0.25f + 0.5f * static_cast<float>(i % 2));
    }
    // Each product's output, per backend.
    std::vector<std::vector<std::vector<float>>> outs;
    for (size_t i = 0; i < std::size(backends); ++i) {
      Backend& b = *backends[i];
      const Imported& w = weights[i];
      auto xb = put(b, x), nb = put(b, nw), gub = put(b, gu);
      auto y4 = b.alloc(static_cast<size_t>(t * rows) * 4);
      auto y8 = b.alloc(static_cast<size_t>(t * (rows + 1)) * 4);
      auto yn = b.alloc(static_cast<size_t>(t * rows) * 4);
      auto normed = b.alloc(static_cast<size_t>(t * cols) * 4);
      auto yw = b.alloc(static_cast<size_t>(t * rows) * 4);
      auto yd = b.alloc(static_cast<size_t>(t * rows) * 4);
      auto ye = b.alloc(static_cast<size_t>(t * cols) * 4);
      const size_t count = static_cast<size_t>(t * top_k);
      auto routes = b.alloc(route_buffer_bytes(count));
      b.upload(*routes, 0, ids.data(), count * 4);
      b.upload(*routes, route_weights_offset(count), route_w.data(), count * 4);
      const Mat xs{xb.get(), 0, t, cols, wide};  // a strided x
      b.qmatmul(*w.w4, xs, Mat{y4.get(), 0, t, rows, rows});
      b.qmatmul(*w.w8, xs, Mat{y8.get(), 0, t, rows + 1, rows + 1});
      Backend::InputNorm norm;
      norm.weight = nb.get();
      norm.weight_offset = 1.0f;
      norm.eps = 1e-6f;
      const Backend::QProduct normed_product[] = {
          {w.w4.get(), Mat{normed.get(), 0, t, cols, cols}, Mat{yn.get(), 0, t, rows, rows}}};
      b.qmatmul_normed(xs, norm, Mat{normed.get(), 0, t, cols, cols}, normed_product);
      b.qmatmul(*w.ww, Mat{xb.get(), 0, t, wide, wide}, Mat{yw.get(), 0, t, rows, rows});
      const Mat both{gub.get(), 0, t, 2 * inter, 2 * inter};
      b.geglu_qmatmul(*w.wd, both.col_range(0, inter), both.col_range(inter, inter),
                      Mat{yd.get(), 0, t, rows, rows});
      b.routed_experts(*w.bank, xs, *routes, top_k, Mat{ye.get(), 0, t, cols, cols});
      auto ym = b.alloc(static_cast<size_t>(t * many) * 4);
      b.qmatmul(*w.wm, xs, Mat{ym.get(), 0, t, many, many});
      // The output product's norms (qmatvec_norms.comp): 300 rows, 38 blocks (its own output,
      // yo, is left undefined).
      auto acc = put(b, acc0), pw = put(b, pair_w);
      auto yo = b.alloc(static_cast<size_t>(t * rows) * 4);
      auto y1 = b.alloc(static_cast<size_t>(t * rows) * 4);
      auto y2 = b.alloc(static_cast<size_t>(t * rows) * 4);
      std::vector<float> w_parts[3];
      std::unique_ptr<Buffer> w_bufs[3];
      for (int j = 0; j < 3; ++j) {
        w_parts[j].assign(pair_w.begin() + j * rows, pair_w.begin() + (j + 1) * rows);
        w_bufs[j] = put(b, w_parts[j]);
      }
      auto rm = [&](Buffer* buf) { return Mat{buf, 0, t, rows, rows}; };
      b.qmatmul_add_rms_norm_pair(*w.w4, xs, rm(yo.get()), w_bufs[0].get(), 1.0f, 1e-6f,
                                  rm(acc.get()), 0.5f, w_bufs[1].get(), w_bufs[2].get(),
                                  rm(y1.get()), rm(y2.get()));
      // The router (router.comp) over 301 experts, 38 blocks, its norm folded.
      auto es = put(b, expert_scale);
      auto logits = b.alloc(static_cast<size_t>(t * (rows + 1)) * 4);
      const size_t picks = static_cast<size_t>(t * router_top_k);
      auto router_routes = b.alloc(route_buffer_bytes(picks));
      Backend::InputNorm router_norm;
      router_norm.weight = nb.get();
      router_norm.eps = 1e-6f;
      router_norm.mul_cols = 0.0625f;
      const Mat router_in{normed.get(), 0, t, cols, cols};
      const Backend::QProduct router{w.w8.get(), router_in,
                                     Mat{logits.get(), 0, t, rows + 1, rows + 1}};
      b.route_product_to(xs, router_norm, router_in, router, router_top_k, *es, *router_routes);
      std::vector<int32_t> picked(picks);
      std::vector<float> picked_w(picks);
      b.download(*router_routes, 0, picked.data(), picks * 4);
      b.download(*router_routes, route_weights_offset(picks), picked_w.data(), picks * 4);
      outs.push_back({get(b, *y4), get(b, *y8), get(b, *yn), get(b, *yw), get(b, *yd), get(b, *ye),
                      get(b, *acc), get(b, *y1), get(b, *y2), get(b, *logits),
                      std::vector<float>(picked.begin(), picked.end()), picked_w, get(b, *ym)});
    }
    for (size_t k = 0; k < outs[0].size(); ++k) {
      CAPTURE(k);  // the products in the order above
      for (size_t i = 2; i < std::size(backends); ++i) {
        CAPTURE(i);  // looped, 1, 2 and 4 blocks at once
        CHECK(outs[i][k] == outs[1][k]);
        CHECK(max_rel(outs[i][k], outs[0][k]) < 1e-4);
      }
    }
  }
  check_setting_refused("REDWING_GPU_MATVEC_GROUPS", {"-1", "x", "70000", "1,2", " 3"});
  check_setting_refused("REDWING_GPU_MATVEC_LOOP_ROWS", {"0", "3", "8", "x", "2,2"});
}

// Rows wider than the kernels' per-pass limits: qmatvec/moe_matvec stage x in chunks of 4,096
// columns (matvec.glsl), qmatmul in slabs of 512 (qmatmul_tiled, which lavapipe takes, in slabs
// of 32), rms_norm holds 4,096 columns in registers and reads the rest again.
TEST_CASE("gpu: products and norms over rows wider than one staging chunk match the CPU") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  int seed = 500;
  for (int bits : {4, 8}) {
    const int group = bits == 4 ? 128 : 32;
    const DType st = bits == 4 ? DType::bf16 : DType::f32;
    const int64_t rows = 19, cols = 4096 + 3 * group;
    HostQuant q(rows, cols, bits, group, st, static_cast<uint64_t>(seed++));
    auto wc = cpu->import_qweight(q.m);
    auto wg = gpu->import_qweight(q.m);
    for (int64_t tokens : {1, 3, 9}) {  // 9: qmatmul, many 512-column slabs
      CAPTURE(bits);
      CAPTURE(tokens);
      auto x = randn(static_cast<size_t>(tokens * cols), static_cast<uint64_t>(seed++));
      std::vector<float> y(static_cast<size_t>(tokens * rows), 0.0f);
      const double d = compare(*cpu, *gpu, {x, y}, [&](Backend& b, auto& bufs) {
        b.qmatmul(&b == cpu.get() ? *wc : *wg, Mat{bufs[0].get(), 0, tokens, cols, cols},
                  Mat{bufs[1].get(), 0, tokens, rows, rows});
      });
      CHECK(d < 1e-4);
    }
  }
  for (const int64_t cols : {2816, 4096 + 77}) {
    CAPTURE(cols);
    const int64_t rows = 3;
    const auto a = randn(static_cast<size_t>(rows * cols), static_cast<uint64_t>(seed++));
    const auto w = randn(static_cast<size_t>(cols), static_cast<uint64_t>(seed++));
    CHECK(compare(*cpu, *gpu, {a, w}, [&](Backend& be, auto& x) {
            be.rms_norm(Mat{x[0].get(), 0, rows, cols, cols}, x[1].get(), 1.0f, 1e-6f,
                        Mat{x[0].get(), 0, rows, cols, cols});
          }) < 1e-6);
  }
}

TEST_CASE("gpu: element-wise ops, norms and RoPE match the CPU") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  const int64_t rows = 5, cols = 77, stride = 80;
  const auto a = randn(static_cast<size_t>(rows * stride), 11);
  const auto b = randn(static_cast<size_t>(rows * stride), 12);
  const auto v = randn(static_cast<size_t>(cols), 13);
  auto run = [&](auto op) { return compare(*cpu, *gpu, {a, b, v}, op); };
  auto m = [&](auto& bufs, int i) { return Mat{bufs[i].get(), 2, rows - 1, cols, stride}; };
  CHECK(run([&](Backend& be, auto& x) { be.fill_zero(m(x, 0)); }) == 0.0);
  CHECK(run([&](Backend& be, auto& x) { be.copy(m(x, 0), m(x, 1)); }) == 0.0);
  CHECK(run([&](Backend& be, auto& x) { be.add(m(x, 0), m(x, 1), m(x, 0)); }) < 1e-7);
  CHECK(run([&](Backend& be, auto& x) { be.scale(m(x, 0), 0.37f); }) < 1e-7);
  CHECK(run([&](Backend& be, auto& x) { be.mul_cols(m(x, 0), *x[2], 0.5f); }) < 1e-7);
  CHECK(run([&](Backend& be, auto& x) { be.gelu_tanh_mul(m(x, 0), m(x, 1), m(x, 1)); }) < 1e-6);
  CHECK(run([&](Backend& be, auto& x) { be.softcap(m(x, 0), 1.5f); }) < 1e-6);
  CHECK(run([&](Backend& be, auto& x) { be.rms_norm(m(x, 0), x[2].get(), 1.0f, 1e-6f, m(x, 1)); }) <
        1e-6);
  CHECK(run([&](Backend& be, auto& x) { be.rms_norm(m(x, 0), nullptr, 0.0f, 1e-6f, m(x, 0)); }) <
        1e-6);
  // Every RoPE variant: full, partial rotation, linear scaling; a far position.
  const int heads = 3, d = 24;
  const auto q = randn(static_cast<size_t>(7 * heads * d), 14);
  for (RopeParams p : {RopeParams{10000, 12, 24, 1.0}, RopeParams{1e6, 4, 24, 1.0},
                       RopeParams{1e6, 12, 24, 8.0}}) {
    const double diff = compare(*cpu, *gpu, {q}, [&](Backend& be, auto& x) {
      be.rope(Mat{x[0].get(), 0, 7, heads * d, heads * d}, heads, d, p, 4093);
    });
    CHECK(diff < 1e-6);
  }
}

TEST_CASE(
    "gpu: the fused norms (add_rms_norm, rms_norm_pair, rms_norm_mul_cols, rms_norm_rope, "
    "moe_ffn_tail) match the CPU's separate ops") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  // acc = (acc + rms_norm(x)) * s: the CPU runs the base class's rms_norm, add and scale. x is
  // left undefined by the op, so it is cleared before the buffers are compared.
  const int64_t rows = 5, cols = 77, stride = 80;
  const auto a = randn(static_cast<size_t>(rows * stride), 31);
  const auto b = randn(static_cast<size_t>(rows * stride), 32);
  const auto v = randn(static_cast<size_t>(cols), 33);
  auto m = [&](auto& bufs, int i) { return Mat{bufs[i].get(), 2, rows - 1, cols, stride}; };
  for (const bool weighted : {true, false}) {
    const double d = compare(*cpu, *gpu, {a, b, v}, [&](Backend& be, auto& x) {
      be.add_rms_norm(m(x, 0), weighted ? x[2].get() : nullptr, 1.0f, 1e-6f, m(x, 1),
                      weighted ? 0.75f : 1.0f);
      be.fill_zero(m(x, 0));
    });
    CHECK(d < 1e-6);
  }
  // A weightless norm times a vector and a scalar (the router's input), in place and not.
  for (const bool in_place : {true, false}) {
    const double d = compare(*cpu, *gpu, {a, b, v}, [&](Backend& be, auto& x) {
      be.rms_norm_mul_cols(m(x, 0), 1e-6f, *x[2], 0.125f, in_place ? m(x, 0) : m(x, 1));
    });
    CHECK(d < 1e-6);
  }
  // Two norms of one x (y1 in place of x, then into another buffer).
  const auto v2 = randn(static_cast<size_t>(cols), 36);
  for (const bool in_place : {true, false}) {
    const double d = compare(*cpu, *gpu, {a, b, v, v2, b}, [&](Backend& be, auto& x) {
      be.rms_norm_pair(m(x, 0), x[2].get(), x[3].get(), 1.0f, 1e-6f, in_place ? m(x, 0) : m(x, 1),
                       Mat{x[4].get(), 0, rows - 1, cols, cols});
    });
    CHECK(d < 1e-6);
  }
  // The MoE feed-forward's tail (three norms, two adds and the layer scalar in one dispatch,
  // with or without the next layer's input norm of the result) against the CPU's rms_norm,
  // add_rms_norm, add_rms_norm and rms_norm; m and the experts' sum are left undefined, so they
  // are cleared before the comparison. 77 columns, and a row wider than one register pass of the
  // 64-thread shape (1,024 columns), which takes the separate ops there.
  const auto v3 = randn(static_cast<size_t>(cols), 37);
  const auto v4 = randn(static_cast<size_t>(cols), 42);
  const auto next0 = randn(static_cast<size_t>(rows * stride), 43);
  for (const float scalar : {1.0f, 0.7f}) {
    for (const bool next : {false, true}) {
      CAPTURE(scalar);
      CAPTURE(next);
      const double d =
          compare(*cpu, *gpu, {a, b, a, v, v2, v3, v4, next0}, [&](Backend& be, auto& x) {
            Backend::FfnTail t{.m = m(x, 0),
                               .dense_norm = x[3].get(),
                               .experts_norm = x[4].get(),
                               .ffn_norm = x[5].get(),
                               .weight_offset = 1.0f,
                               .eps = 1e-6f,
                               .x = m(x, 2),
                               .layer_scalar = scalar,
                               .next_norm = nullptr,
                               .next = {}};
            if (next) t.next_norm = x[6].get(), t.next = m(x, 7);
            be.moe_ffn_tail(m(x, 1), t);
            be.fill_zero(m(x, 0));
            be.fill_zero(m(x, 1));
          });
      CHECK(d < 1e-5);
    }
  }
  {
    const int64_t wide = 2816;
    const auto wm = randn(static_cast<size_t>(2 * wide), 38);
    const auto we = randn(static_cast<size_t>(2 * wide), 39);
    const auto wx = randn(static_cast<size_t>(2 * wide), 40);
    const auto ww = randn(static_cast<size_t>(wide), 41);
    const double d = compare(*cpu, *gpu, {wm, we, wx, ww, wx}, [&](Backend& be, auto& x) {
      auto w = [&](int i) { return Mat{x[i].get(), 0, 2, wide, wide}; };
      Backend::FfnTail t{w(0),  x[3].get(), x[3].get(), x[3].get(), 0.0f,
                         1e-6f, w(2),       0.5f,       x[3].get(), w(4)};
      be.moe_ffn_tail(w(1), t);
      be.fill_zero(w(0));
      be.fill_zero(w(1));
    });
    CHECK(d < 1e-5);
  }
  {
    // A missing norm weight and a next row of another shape are refused.
    auto gm = put(*gpu, a), gx = put(*gpu, b), gw = put(*gpu, v);
    const Mat mm{gm.get(), 2, rows - 1, cols, stride}, mx{gx.get(), 2, rows - 1, cols, stride};
    CHECK_THROWS_AS(gpu->moe_ffn_tail(
                        mm, {mm, gw.get(), nullptr, gw.get(), 0.0f, 1e-6f, mx, 1.0f, nullptr, {}}),
                    std::logic_error);
    CHECK_THROWS_AS(gpu->moe_ffn_tail(mm, {mm, gw.get(), gw.get(), gw.get(), 0.0f, 1e-6f, mx, 1.0f,
                                           gw.get(), mx.row_range(0, 1)}),
                    std::logic_error);
  }
  auto g = put(*gpu, a);
  const Mat same{g.get(), 2, rows - 1, cols, stride};
  CHECK_THROWS_AS(gpu->add_rms_norm(same, nullptr, 0.0f, 1e-6f, same), std::logic_error);

  // Per-head norm then RoPE: every RoPE variant, with and without a weight, a head longer than
  // the kernel's 64 threads (d = 130), offset rows.
  for (const int d : {24, 130}) {
    const int heads = 3;
    const int64_t t = 7;
    const auto q = randn(static_cast<size_t>((t + 1) * heads * d), 34);
    const auto w = randn(static_cast<size_t>(d), 35, 0.3f);
    for (RopeParams p : {RopeParams{10000, d / 2, d, 1.0}, RopeParams{1e6, 4, d, 1.0},
                         RopeParams{1e6, d / 2, d, 8.0}})
      for (const bool weighted : {true, false}) {
        const double diff = compare(*cpu, *gpu, {q, w}, [&](Backend& be, auto& x) {
          be.rms_norm_rope(Mat{x[0].get(), heads * d, t, heads * d, heads * d}, heads, d,
                           weighted ? x[1].get() : nullptr, 1.0f, 1e-6f, p, 4093);
        });
        CHECK(diff < 1e-6);
      }
  }
}

TEST_CASE("gpu: gather, scatter-add and routing match the CPU") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  const int64_t cols = 33;
  const auto src = randn(static_cast<size_t>(6 * cols), 21);
  const auto dst = randn(static_cast<size_t>(4 * cols), 22);
  const std::vector<int32_t> rows = {3, 0, 3, 5};
  const std::vector<float> weights = {0.5f, -1.0f, 2.0f, 0.25f};
  CHECK(compare(*cpu, *gpu, {src, dst}, [&](Backend& b, auto& x) {
          b.gather_rows(Mat{x[0].get(), 0, 6, cols, cols}, rows, Mat{x[1].get(), 0, 4, cols, cols});
        }) == 0.0);
  const std::vector<int32_t> into = {1, 0, 1, 3};
  CHECK(compare(*cpu, *gpu, {src, dst}, [&](Backend& b, auto& x) {
          b.scatter_add_rows(Mat{x[0].get(), 0, 4, cols, cols}, into, weights,
                             Mat{x[1].get(), 0, 4, cols, cols});
        }) < 1e-7);

  // More experts than the kernel's 64 threads too; ties everywhere in rows 1 and 2 (picks by
  // rank must order equal p by index, as the CPU does).
  for (int experts : {8, 37, 128, 300}) {
    const int top_k = std::min(8, experts / 2), t = 5;
    auto logits = randn(static_cast<size_t>(t * experts), static_cast<uint64_t>(experts));
    logits[3] = logits[5];  // a tie: the lower index goes first
    for (int e = 0; e < experts; ++e) {
      logits[static_cast<size_t>(experts + e)] = 0.75f;                          // all equal
      logits[static_cast<size_t>(2 * experts + e)] = static_cast<float>(e % 3);  // three values
    }
    const auto pes = randn(static_cast<size_t>(experts), 23);
    std::vector<int32_t> ic(static_cast<size_t>(t * top_k)), ig(ic.size());
    std::vector<float> wc(ic.size()), wg(ic.size());
    auto lc = put(*cpu, logits), lg = put(*gpu, logits);
    auto pc = put(*cpu, pes), pg = put(*gpu, pes);
    cpu->route(Mat{lc.get(), 0, t, experts, experts}, top_k, *pc, ic.data(), wc.data());
    gpu->route(Mat{lg.get(), 0, t, experts, experts}, top_k, *pg, ig.data(), wg.data());
    CHECK(ic == ig);
    CHECK(max_rel(wg, wc) < 1e-5);
  }
}

TEST_CASE("gpu: routing kept on the device and the routed experts match the CPU") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  const int experts = 6, top_k = 3;
  int seed = 300;
  for (int bits : {4, 8})
    for (DType st : {DType::bf16, DType::f32}) {
      const int64_t hidden = 64, inter = 96, group = 32;
      std::vector<HostQuant> host;  // gate, up, down per expert
      for (int e = 0; e < experts; ++e) {
        host.emplace_back(inter, hidden, bits, group, st, static_cast<uint64_t>(seed++));
        host.emplace_back(inter, hidden, bits, group, st, static_cast<uint64_t>(seed++));
        host.emplace_back(hidden, inter, bits, group, st, static_cast<uint64_t>(seed++));
      }
      const auto [gate, up, down] = expert_parts(host);
      auto bank_cpu = cpu->import_experts(gate, up, down);
      auto bank_gpu = gpu->import_experts(gate, up, down);
      const auto pes = randn(static_cast<size_t>(experts), 31);
      auto pes_cpu = put(*cpu, pes), pes_gpu = put(*gpu, pes);
      // 1 and 3 tokens: the ids stay on the device; 9: they come to the host (prefill path).
      for (int64_t t : {1, 3, 9}) {
        CAPTURE(bits);
        CAPTURE(static_cast<int>(st));
        CAPTURE(t);
        auto logits = randn(static_cast<size_t>(t * experts), static_cast<uint64_t>(seed++));
        logits[1] = logits[4];  // a tie in the first row: the lower index goes first
        const size_t count = static_cast<size_t>(t * top_k);
        auto lc = put(*cpu, logits), lg = put(*gpu, logits);
        auto rc = cpu->alloc(route_buffer_bytes(count)), rg = gpu->alloc(route_buffer_bytes(count));
        const auto x = randn(static_cast<size_t>(t * hidden), static_cast<uint64_t>(seed++));
        auto xc = put(*cpu, x), xg = put(*gpu, x);
        auto oc = cpu->alloc(static_cast<size_t>(t * hidden) * 4);
        auto og = gpu->alloc(static_cast<size_t>(t * hidden) * 4);
        const uint64_t submitted = gpu->work_counters().submissions;
        cpu->route_to(Mat{lc.get(), 0, t, experts, experts}, top_k, *pes_cpu, *rc);
        gpu->route_to(Mat{lg.get(), 0, t, experts, experts}, top_k, *pes_gpu, *rg);
        cpu->routed_experts(*bank_cpu, Mat{xc.get(), 0, t, hidden, hidden}, *rc, top_k,
                            Mat{oc.get(), 0, t, hidden, hidden});
        gpu->routed_experts(*bank_gpu, Mat{xg.get(), 0, t, hidden, hidden}, *rg, top_k,
                            Mat{og.get(), 0, t, hidden, hidden});
        // Decode: routing and the experts' products were only recorded (no host round trip).
        if (t <= 3) CHECK(gpu->work_counters().submissions == submitted);
        std::vector<int32_t> ic(count), ig(count);
        std::vector<float> wc(count), wg(count);
        cpu->download(*rc, 0, ic.data(), count * 4);
        gpu->download(*rg, 0, ig.data(), count * 4);
        cpu->download(*rc, route_weights_offset(count), wc.data(), count * 4);
        gpu->download(*rg, route_weights_offset(count), wg.data(), count * 4);
        CHECK(ic == ig);
        CHECK(max_rel(wg, wc) < 1e-5);
        CHECK(max_rel(get(*gpu, *og), get(*cpu, *oc)) < 1e-4);

        // The experts and the feed-forward's end (with the next layer's input norm) in one call:
        // on the device path the tail's dispatch sums the products, so it records one dispatch
        // less than routed_experts then moe_ffn_tail, and matches the CPU's separate ops.
        // (Seeds of their own: the cases above keep their data.)
        const auto tail_seed = static_cast<uint64_t>(7000 + seed);
        const auto mv = randn(static_cast<size_t>(t * hidden), tail_seed);
        const auto res = randn(static_cast<size_t>(t * hidden), tail_seed + 1);
        const auto norms = randn(static_cast<size_t>(4 * hidden), tail_seed + 2);
        auto tail_run = [&](Backend& be, const ExpertBank& bank, Buffer& routes, Buffer& xb,
                            bool fused) {
          auto mb = put(be, mv), rb = put(be, res);
          auto next = be.alloc(static_cast<size_t>(t * hidden) * 4);
          auto sum = be.alloc(static_cast<size_t>(t * hidden) * 4);
          auto rows = [&](Buffer& b, int64_t first = 0) {
            return Mat{&b, first * hidden, t, hidden, hidden};
          };
          // The dense, experts', feed-forward and next input norms' weights.
          std::vector<std::unique_ptr<Buffer>> w;
          for (int i = 0; i < 4; ++i) {
            const auto part =
                std::vector<float>(norms.begin() + i * hidden, norms.begin() + (i + 1) * hidden);
            w.push_back(put(be, part));
          }
          const Backend::FfnTail tail{rows(*mb), w[0].get(), w[1].get(), w[2].get(), 1.0f,
                                      1e-6f,     rows(*rb),  0.8f,       w[3].get(), rows(*next)};
          const uint64_t before = be.work_counters().dispatches;
          if (fused) {
            be.routed_experts_tail(bank, rows(xb), routes, top_k, rows(*sum), tail);
          } else {
            be.routed_experts(bank, rows(xb), routes, top_k, rows(*sum));
            be.moe_ffn_tail(rows(*sum), tail);
          }
          const uint64_t dispatches = be.work_counters().dispatches - before;
          return std::tuple{get(be, *rb), get(be, *next), dispatches};
        };
        const auto [x_cpu, next_cpu, d_cpu] = tail_run(*cpu, *bank_cpu, *rc, *xc, true);
        const auto [x_gpu, next_gpu, d_fused] = tail_run(*gpu, *bank_gpu, *rg, *xg, true);
        const auto [x_sep, next_sep, d_sep] = tail_run(*gpu, *bank_gpu, *rg, *xg, false);
        CHECK(max_rel(x_gpu, x_cpu) < 1e-4);
        CHECK(max_rel(next_gpu, next_cpu) < 1e-4);
        CHECK(max_rel(x_sep, x_cpu) < 1e-4);
        if (t <= 3) CHECK(d_fused + 1 == d_sep);
      }
      // A bank belongs to the backend that imported it.
      auto r = gpu->alloc(route_buffer_bytes(top_k));
      auto xo = gpu->alloc(static_cast<size_t>(hidden) * 4);
      CHECK_THROWS_AS(gpu->routed_experts(*bank_cpu, Mat{xo.get(), 0, 1, hidden, hidden}, *r, top_k,
                                          Mat{xo.get(), 0, 1, hidden, hidden}),
                      std::logic_error);
    }
}

// A MoE layer's feed-forward end computed by the next layer's q/k/v products
// (REDWING_GPU_FFN_TAIL=next, qmatvec_tail.comp): each of their workgroups computes the tail and
// stages its h, one arrival over all the products' dispatches writes the residual. Over three
// layers' worth of steps (each step's tail reads the residual the one before wrote, so the
// parked row and the shared counter must be right every time), the routed slots' tail
// (routed_experts_tail, 3 and 6 slots) and the experts' sum (moe_ffn_tail), three products and
// two (k_eq_v), 4- and 8-bit, a row (hidden 160) that leaves some threads idle: the residual, h
// and every product must be the separate ffn_tail dispatch's bits, within 1e-4 of the CPU, and
// each step must record one dispatch and one barrier fewer. An op in between that is not those
// products records the tail first (the separate dispatch's count and bits).
TEST_CASE("gpu: the feed-forward's end inside the next layer's q/k/v products") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  check_setting_refused("REDWING_GPU_FFN_TAIL", {"yes", "1", "next,own"});
  auto cpu = make_cpu_backend(2);
  auto own = gpu_backend_with({{"REDWING_GPU_FFN_TAIL", "own"}}, threads);
  auto next = gpu_backend_with({{"REDWING_GPU_FFN_TAIL", "next"}}, threads);
  // 3 routed slots, and 6: a whole batch of the tail's 4 slots loaded at once and a part of one.
  for (const auto& [experts_of, top_k_of] : {std::pair{6, 3}, std::pair{10, 6}}) {
    const int experts = experts_of, top_k = top_k_of;  // (plain ints: the lambdas capture them)
    CAPTURE(top_k);
    const int steps = 3;
    const int64_t hidden = 160, inter = 96;
    std::vector<HostQuant> host;  // gate, up, down per expert
    for (int e = 0; e < experts; ++e) {
      host.emplace_back(inter, hidden, 4, 32, DType::bf16, static_cast<uint64_t>(2400 + 3 * e));
      host.emplace_back(inter, hidden, 4, 32, DType::bf16, static_cast<uint64_t>(2401 + 3 * e));
      host.emplace_back(hidden, inter, 4, 32, DType::bf16, static_cast<uint64_t>(2402 + 3 * e));
    }
    const ExpertParts parts = expert_parts(host);  // (not a structured binding: run captures it)
    HostQuant qw(200, hidden, 4, 32, DType::bf16, 2450);
    HostQuant kw(72, hidden, 8, 32, DType::f16, 2451);
    HostQuant vw(40, hidden, 4, 32, DType::f32, 2452);
    const auto pes = randn(static_cast<size_t>(experts), 2453);
    const auto norms = randn(static_cast<size_t>(4 * hidden), 2454, 0.3f);
    const auto res0 = randn(static_cast<size_t>(hidden), 2455);
    struct Run {
      std::vector<float> res, h, q, k, v;
      uint64_t dispatches = 0, barriers = 0;
    };
    // interrupt: a download of the residual between the tail and the products.
    auto run = [&](Backend& b, bool routed, int products, bool interrupt) {
      Run out;
      auto bank = b.import_experts(parts.gate, parts.up, parts.down);
      auto wq = b.import_qweight(qw.m), wk = b.import_qweight(kw.m), wv = b.import_qweight(vw.m);
      auto pes_b = put(b, pes), res = put(b, res0);
      std::vector<std::unique_ptr<Buffer>> w;
      for (int i = 0; i < 4; ++i)
        w.push_back(put(
            b, std::vector<float>(norms.begin() + i * hidden, norms.begin() + (i + 1) * hidden)));
      auto hb = b.alloc(static_cast<size_t>(hidden) * 4);
      auto sum = b.alloc(static_cast<size_t>(hidden) * 4);
      auto qb = b.alloc(200 * 4), kb = b.alloc(72 * 4), vb = b.alloc(40 * 4);
      auto routes = b.alloc(route_buffer_bytes(top_k));
      auto row = [&](Buffer& buf, int64_t cols) { return Mat{&buf, 0, 1, cols, cols}; };
      for (int step = 0; step < steps; ++step) {
        const auto seed = static_cast<uint64_t>(2460 + 10 * step);
        auto logits = put(b, randn(static_cast<size_t>(experts), seed));
        auto e_in = put(b, randn(static_cast<size_t>(hidden), seed + 1));
        auto m = put(b, randn(static_cast<size_t>(hidden), seed + 2));
        auto e_sum = put(b, randn(static_cast<size_t>(hidden), seed + 3));
        b.route_to(row(*logits, experts), top_k, *pes_b, *routes);
        const Backend::FfnTail tail{
            row(*m, hidden), w[0].get(),        w[1].get(), w[2].get(), 1.0f,
            1e-6f,           row(*res, hidden), 0.9f,       w[3].get(), row(*hb, hidden)};
        const Backend::QProduct all[] = {{wq.get(), row(*hb, hidden), row(*qb, 200)},
                                         {wk.get(), row(*hb, hidden), row(*kb, 72)},
                                         {wv.get(), row(*hb, hidden), row(*vb, 40)}};
        const Backend::WorkCounters before = b.work_counters();
        if (routed)
          b.routed_experts_tail(*bank, row(*e_in, hidden), *routes, top_k, row(*sum, hidden), tail);
        else
          b.moe_ffn_tail(row(*e_sum, hidden), tail);
        if (interrupt) {
          std::vector<float> peek(static_cast<size_t>(hidden));
          b.download(*res, 0, peek.data(), peek.size() * 4);
        }
        b.qmatmul_batch(std::span<const Backend::QProduct>(all, static_cast<size_t>(products)));
        const Backend::WorkCounters after = b.work_counters();
        out.dispatches += after.dispatches - before.dispatches;
        out.barriers += after.barriers - before.barriers;
        const auto q = get(b, *qb), k = get(b, *kb), v = get(b, *vb);
        out.q.insert(out.q.end(), q.begin(), q.end());
        out.k.insert(out.k.end(), k.begin(), k.end());
        out.v.insert(out.v.end(), v.begin(), v.end());
      }
      out.res = get(b, *res);
      out.h = get(b, *hb);
      return out;
    };
    for (const bool routed : {true, false})
      for (const int products : {3, 2}) {
        CAPTURE(routed);
        CAPTURE(products);
        const Run want = run(*cpu, routed, products, false);
        const Run separate = run(*own, routed, products, false);
        const Run inside = run(*next, routed, products, false);
        const Run interrupted = run(*next, routed, products, true);
        CHECK(max_rel(separate.res, want.res) < 1e-4);
        CHECK(max_rel(separate.h, want.h) < 1e-4);
        CHECK(max_rel(separate.q, want.q) < 1e-4);
        CHECK(max_rel(separate.k, want.k) < 1e-4);
        for (const Run* r : {&inside, &interrupted}) {
          CHECK(r->res == separate.res);
          CHECK(r->h == separate.h);
          CHECK(r->q == separate.q);
          CHECK(r->k == separate.k);
          if (products == 3) CHECK(r->v == separate.v);
        }
        CHECK(inside.dispatches + steps == separate.dispatches);
        CHECK(inside.barriers + steps == separate.barriers);
        CHECK(interrupted.dispatches == separate.dispatches);
      }
  }
}

// The routed experts' down product (moe_matvec_down.comp, matvec_teams.glsl) in every shape the
// device layer can give it: teams of 1 to all threads, 1 to 4 rows per team (row counts that are
// not a multiple of a workgroup's rows), 1 to 4 words in flight per thread, the team's sums by
// subgroupAdd (lavapipe has 8-wide arithmetic subgroups; a team of one or of several subgroups)
// and by the shared-memory tree, in 64- and 256-thread workgroups, 4- and 8-bit, against the
// CPU's routed experts (1 and 3 tokens: the device path, whose down product reads the GeGLU of
// the gate/up product's output).
TEST_CASE("gpu: the experts' down product matches the CPU in every shape and reduction") {
  struct Shape {
    uint32_t threads;
    const char* down;  // REDWING_GPU_MATVEC_DOWN: rows per team, lanes, unroll
    bool subgroups;
  };
  const Shape shapes[] = {
      {64, "1,1,1", true},     {64, "4,8,4", true},    {64, "4,8,4", false},
      {64, "3,16,1", true},    {64, "3,16,1", false},  {64, "2,64,2", true},
      {256, "4,32,1", true},   {256, "4,32,2", false}, {256, "3,128,4", true},
      {256, "1,256,1", false}, {256, "4,32,2", true},
  };
  auto cpu = make_cpu_backend(2);
  // hidden (the down product's rows) 160: not a multiple of 24 or 96 rows per workgroup;
  // inter (its columns) 224: 28 4-bit or 56 8-bit words, a partial last round for most teams.
  const int64_t hidden = 160, inter = 224;
  const int experts = 5, top_k = 2;
  for (int bits : {4, 8}) {
    std::vector<HostQuant> host;  // gate, up, down per expert
    for (int e = 0; e < experts; ++e) {
      const auto seed = static_cast<uint64_t>(960 + 3 * e + 100 * bits);
      host.emplace_back(inter, hidden, 4, 32, DType::bf16, seed);
      host.emplace_back(inter, hidden, 4, 32, DType::bf16, seed + 1);
      host.emplace_back(hidden, inter, bits, 32, bits == 4 ? DType::f32 : DType::f16, seed + 2);
    }
    const auto [gate, up, down] = expert_parts(host);
    auto bank_cpu = cpu->import_experts(gate, up, down);
    const auto pes = randn(static_cast<size_t>(experts), 920);
    auto pes_cpu = put(*cpu, pes);
    for (const Shape& shape : shapes) {
      const std::string down_shape = shape.down;
      const uint32_t threads = shape.threads;
      const bool subgroups = shape.subgroups;
      CAPTURE(bits);
      CAPTURE(threads);
      CAPTURE(down_shape);
      CAPTURE(subgroups);
      setenv("REDWING_GPU_MATVEC_DOWN", shape.down, 1);
      setenv("REDWING_GPU_SUBGROUP", shape.subgroups ? "1" : "0", 1);
      auto gpu = gpu_backend(shape.threads);
      unsetenv("REDWING_GPU_MATVEC_DOWN");
      unsetenv("REDWING_GPU_SUBGROUP");
      auto bank_gpu = gpu->import_experts(gate, up, down);
      auto pes_gpu = put(*gpu, pes);
      for (int64_t tokens : {1, 3}) {
        CAPTURE(tokens);
        const auto logits = randn(static_cast<size_t>(tokens * experts), 950);
        const auto xe = randn(static_cast<size_t>(tokens * hidden), 951);
        const size_t count = static_cast<size_t>(tokens * top_k);
        auto lc = put(*cpu, logits), lg = put(*gpu, logits);
        auto rc = cpu->alloc(route_buffer_bytes(count)), rg = gpu->alloc(route_buffer_bytes(count));
        auto xc = put(*cpu, xe), xg = put(*gpu, xe);
        auto oc = cpu->alloc(static_cast<size_t>(tokens * hidden) * 4);
        auto og = gpu->alloc(static_cast<size_t>(tokens * hidden) * 4);
        cpu->route_to(Mat{lc.get(), 0, tokens, experts, experts}, top_k, *pes_cpu, *rc);
        gpu->route_to(Mat{lg.get(), 0, tokens, experts, experts}, top_k, *pes_gpu, *rg);
        cpu->routed_experts(*bank_cpu, Mat{xc.get(), 0, tokens, hidden, hidden}, *rc, top_k,
                            Mat{oc.get(), 0, tokens, hidden, hidden});
        gpu->routed_experts(*bank_gpu, Mat{xg.get(), 0, tokens, hidden, hidden}, *rg, top_k,
                            Mat{og.get(), 0, tokens, hidden, hidden});
        CHECK(max_rel(get(*gpu, *og), get(*cpu, *oc)) < 1e-4);
      }
    }
  }
}

// The decode products (matvec.glsl) sum a row's lanes by subgroupAdd exactly where a row is one
// subgroup with arithmetic operations, unless REDWING_GPU_SUBGROUP says otherwise. (Their results
// through both reductions are compared with the CPU above: lavapipe's 64-thread shape has rows of
// 8 lanes, one of its subgroups; the 256-thread shape takes the tree.)
TEST_CASE("gpu: the decode products' subgroup sums are chosen where a row is one subgroup") {
  auto reduce = [](uint32_t threads, uint32_t subgroup, bool arithmetic) {
    gpu::DeviceInfo info;
    info.workgroup_threads = threads;
    info.subgroup_size = subgroup;
    info.subgroup_arithmetic = arithmetic;
    gpu::choose_matvec_shapes(info);
    return info.matvec_subgroup_reduce;
  };
  CHECK(reduce(256, 32, true));   // NVIDIA: 32 lanes a row, 32-wide subgroups
  CHECK(reduce(64, 8, true));     // lavapipe
  CHECK(!reduce(256, 64, true));  // AMD's wave64: a row is half a subgroup
  CHECK(!reduce(256, 16, true));  // a row spans two subgroups
  CHECK(!reduce(256, 32, false));
  for (const char* value : {"0", "down"}) {
    setenv("REDWING_GPU_SUBGROUP", value, 1);
    CHECK(!reduce(256, 32, true));
    unsetenv("REDWING_GPU_SUBGROUP");
  }
  setenv("REDWING_GPU_SUBGROUP", "down", 1);
  gpu::DeviceInfo info;
  info.subgroup_size = 32;
  info.subgroup_arithmetic = true;
  gpu::choose_matvec_shapes(info);
  unsetenv("REDWING_GPU_SUBGROUP");
  CHECK(info.matvec_down.subgroup_reduce);  // "down" keeps the down product's
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;
  check_setting_refused("REDWING_GPU_SUBGROUP", {"yes", "2", "down,1"});
}

// A malformed REDWING_GPU_MATVEC_DOWN is an error naming the variable, not a silent default.
TEST_CASE("gpu: a malformed down product shape is refused") {
  // (The Metal device runs the MSL's defaults and reads no shape.)
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;
  check_setting_refused("REDWING_GPU_MATVEC_DOWN", {"2,48,2", "5,64,2", "2,64,3", "2,64", "two"});
}

// A malformed REDWING_GPU_MOE_PREFILL is refused too.
TEST_CASE("gpu: a malformed experts' prefill setting is refused") {
  check_setting_refused("REDWING_GPU_MOE_PREFILL", {"grouped ", "per_expert", "1"});
}

// REDWING_GPU_KNOCKOUT (a timing diagnostic) parses its words, refuses unknown ones, and really
// drops what it names: a knocked-out decode product leaves its output as it was, while the
// other kernels still run.
TEST_CASE("gpu: knockout runs drop exactly the named work") {
  const gpu::Knockout none = gpu::parse_knockout("");
  CHECK_FALSE(none.any());
  const gpu::Knockout some = gpu::parse_knockout("barriers,qmatvec");
  CHECK(some.barriers);
  CHECK(some.drops(gpu::Kernel::qmatvec));
  CHECK_FALSE(some.drops(gpu::Kernel::rms_norm));
  const gpu::Knockout all_but = gpu::parse_knockout("all,-moe_matvec,-qmatvec");
  CHECK_FALSE(all_but.barriers);
  CHECK(all_but.drops(gpu::Kernel::rms_norm));
  CHECK(all_but.drops(gpu::Kernel::moe_matvec_down));
  CHECK_FALSE(all_but.drops(gpu::Kernel::qmatvec));
  CHECK_FALSE(all_but.drops(gpu::Kernel::moe_matvec));
  for (const char* bad : {"qmatvecs", "-barriers", "-all", "barriers,nope"}) {
    CAPTURE(std::string(bad));
    CHECK_THROWS_AS(gpu::parse_knockout(bad), std::invalid_argument);
  }
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;  // the Metal device reads no knockout
  check_setting_refused("REDWING_GPU_KNOCKOUT", {"qmatvecs", "all,-none"});

  const int64_t rows = 40, cols = 128;
  HostQuant q(rows, cols, 4, 64, DType::bf16, 11);
  const auto x = randn(static_cast<size_t>(cols), 12);
  const std::vector<float> sentinel(static_cast<size_t>(rows), -7.0f);
  auto run = [&](const char* knockout) {
    setenv("REDWING_GPU_KNOCKOUT", knockout, 1);
    auto gpu = gpu_backend(64);
    unsetenv("REDWING_GPU_KNOCKOUT");
    auto w = gpu->import_qweight(q.m);
    auto xb = gpu->alloc(x.size() * sizeof(float));
    auto yb = gpu->alloc(sentinel.size() * sizeof(float));
    gpu->upload(*xb, 0, x.data(), x.size() * sizeof(float));
    gpu->upload(*yb, 0, sentinel.data(), sentinel.size() * sizeof(float));
    gpu->qmatmul(*w, Mat{xb.get(), 0, 1, cols, cols}, Mat{yb.get(), 0, 1, rows, rows});
    gpu->scale(Mat{xb.get(), 0, 1, cols, cols}, 2.0f);  // a kernel no knockout here names
    std::vector<float> y(sentinel.size()), x2(x.size());
    gpu->download(*yb, 0, y.data(), y.size() * sizeof(float));
    gpu->download(*xb, 0, x2.data(), x2.size() * sizeof(float));
    return std::pair{y, x2};
  };
  const auto [y_full, x_full] = run("");
  const auto [y_dropped, x_kept] = run("qmatvec");
  CHECK(y_full != sentinel);
  CHECK(y_dropped == sentinel);
  CHECK(x_kept == x_full);
  CHECK(x_kept[0] == 2.0f * x[0]);
}

// How the device hands work to the GPU does not change what it computes: a chain of 150
// dependent ops (a decode product, a norm and an add per step, each reading the last step's
// output; read back every 50 steps) gives the same bits with descriptor sets from a pool
// instead of push descriptors (REDWING_GPU_PUSH_DESCRIPTORS=0), with a command buffer submitted
// after every dispatch or after 1, 2, 4 ... 16 (REDWING_GPU_SUBMIT), with the host spinning on
// the fence (REDWING_GPU_WAIT=spin), and with the pool path forced to flush mid-chain (more
// descriptor sets than one pool holds). The device reports its host time: every read waits.
TEST_CASE("gpu: submission schedules, waits and descriptor paths give the same bits") {
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;  // the Metal device has none of these settings
  const int64_t rows = 96, cols = 128;
  HostQuant q(rows, cols, 4, 64, DType::bf16, 5);
  HostQuant back(cols, rows, 8, 32, DType::f16, 6);
  const auto x0 = randn(static_cast<size_t>(cols), 7);
  const auto norm = randn(static_cast<size_t>(cols), 8, 0.1f);
  struct Run {
    std::vector<float> out;
    gpu::Device::HostTimes host;
  };
  auto run = [&](int steps, int read_every) {
    auto backend = gpu_backend(64);
    auto w = backend->import_qweight(q.m);
    auto wb = backend->import_qweight(back.m);
    auto x = put(*backend, x0);
    auto nw = put(*backend, norm);
    auto h = backend->alloc(static_cast<size_t>(rows) * 4);
    auto y = backend->alloc(static_cast<size_t>(cols) * 4);
    Run r;
    for (int i = 0; i < steps; ++i) {
      backend->qmatmul(*w, Mat{x.get(), 0, 1, cols, cols}, Mat{h.get(), 0, 1, rows, rows});
      backend->qmatmul(*wb, Mat{h.get(), 0, 1, rows, rows}, Mat{y.get(), 0, 1, cols, cols});
      backend->rms_norm(Mat{y.get(), 0, 1, cols, cols}, nw.get(), 1.0f, 1e-6f,
                        Mat{y.get(), 0, 1, cols, cols});
      backend->add(Mat{x.get(), 0, 1, cols, cols}, Mat{y.get(), 0, 1, cols, cols},
                   Mat{x.get(), 0, 1, cols, cols});
      if ((i + 1) % read_every == 0) {
        const auto part = get(*backend, *x);
        r.out.insert(r.out.end(), part.begin(), part.end());
      }
    }
    r.host = gpu_device_of(*backend)->host_times();
    return r;
  };
  const Run reference = run(150, 50);
  REQUIRE(reference.out.size() == 3 * static_cast<size_t>(cols));
  for (float v : reference.out) REQUIRE(std::isfinite(v));
  CHECK(reference.host.waits >= 3);
  CHECK(reference.host.record_ms > 0);
  CHECK(reference.host.wait_ms > 0);
  struct Setting {
    const char* name;
    const char* value;
  };
  const std::vector<std::vector<Setting>> settings = {
      {{"REDWING_GPU_PUSH_DESCRIPTORS", "0"}},
      {{"REDWING_GPU_SUBMIT", "1"}},
      {{"REDWING_GPU_SUBMIT", "1,16"}},
      {{"REDWING_GPU_WAIT", "spin"}},
      {{"REDWING_GPU_PUSH_DESCRIPTORS", "0"},
       {"REDWING_GPU_SUBMIT", "3,7"},
       {"REDWING_GPU_WAIT", "block"}},
  };
  for (const auto& setting : settings) {
    std::string what;
    for (const Setting& s : setting) {
      setenv(s.name, s.value, 1);
      what += std::string(s.name) + "=" + s.value + " ";
    }
    CAPTURE(what);
    const Run r = run(150, 50);
    for (const Setting& s : setting) unsetenv(s.name);
    CHECK(r.out == reference.out);
    CHECK(r.host.waits >= 3);
  }
  // More dispatches than one descriptor pool holds (4,096 sets) between two reads.
  setenv("REDWING_GPU_PUSH_DESCRIPTORS", "0", 1);
  const Run pooled = run(1100, 1100);
  unsetenv("REDWING_GPU_PUSH_DESCRIPTORS");
  const Run pushed = run(1100, 1100);
  REQUIRE(pooled.out.size() == static_cast<size_t>(cols));
  CHECK(pooled.out == pushed.out);
  CHECK(pooled.host.waits > pushed.host.waits);  // the full pool forced flushes
  check_setting_refused("REDWING_GPU_SUBMIT", {"0", "8,4", "x", "4,", "4,5000", "-1"});
  check_setting_refused("REDWING_GPU_WAIT", {"busy", "1"});
  check_setting_refused("REDWING_GPU_PUSH_DESCRIPTORS", {"no", "2"});
  check_setting_refused("REDWING_GPU_MAP_HOST", {"off", "yes"});
}

// Host memory the device reads in place (map_host, VK_EXT_external_memory_host, which lavapipe
// has): a write from inside a mapped range is a copy the GPU makes when it runs, so bytes changed
// after write() but before the flush arrive changed (a staged write took them at write()); a
// write reaching past the range, one after unmap_host, and one from a misaligned range (refused)
// are staged. REDWING_GPU_MAP_HOST=0 turns mapping off.
TEST_CASE("gpu: writes from mapped host memory are read in place, others staged") {
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;  // the Metal device maps nothing (unified memory has its own path)
  auto backend = gpu_backend(64);
  gpu::Device& dev = *gpu_device_of(*backend);
  constexpr size_t kBlock = 65536;
  auto host = platform::allocate_aligned(2 * kBlock, kBlock);
  auto* bytes = reinterpret_cast<uint32_t*>(host.get());
  for (size_t i = 0; i < 2 * kBlock / 4; ++i) bytes[i] = static_cast<uint32_t>(i);
  CHECK_FALSE(dev.map_host(host.get() + 64, kBlock));  // not on the import alignment
  REQUIRE(dev.map_host(host.get(), kBlock));
  auto buf = dev.create_buffer(1024);
  auto read_back = [&](size_t offset) {
    uint32_t v[4];
    dev.read(*buf, offset, v, sizeof v);
    return std::vector<uint32_t>(v, v + 4);
  };
  // Inside the range: the value at flush time.
  dev.write(*buf, 0, bytes + 100, 16);
  bytes[100] = 7777;
  CHECK(read_back(0) == std::vector<uint32_t>{7777, 101, 102, 103});
  // Reaching past the range: staged, the value at write().
  const size_t last = kBlock / 4 - 2;
  dev.write(*buf, 16, bytes + last, 16);
  bytes[last] = 8888;
  CHECK(read_back(16) ==
        std::vector<uint32_t>{static_cast<uint32_t>(last), static_cast<uint32_t>(last + 1),
                              static_cast<uint32_t>(last + 2), static_cast<uint32_t>(last + 3)});
  // Unmapped: staged again.
  dev.unmap_host(host.get());
  dev.write(*buf, 32, bytes + 200, 16);
  bytes[200] = 9999;
  CHECK(read_back(32) == std::vector<uint32_t>{200, 201, 202, 203});
  // Turned off: nothing is mapped.
  setenv("REDWING_GPU_MAP_HOST", "0", 1);
  auto off = gpu_backend(64);
  CHECK_FALSE(gpu_device_of(*off)->map_host(host.get(), kBlock));
  CHECK(off->map_host_memory({host.get(), kBlock}) == nullptr);
  unsetenv("REDWING_GPU_MAP_HOST");
  // Through the backend: a handle that unmaps when it goes.
  {
    auto mapping = backend->map_host_memory({host.get(), kBlock});
    REQUIRE(mapping != nullptr);
    dev.write(*buf, 48, bytes + 300, 16);
    bytes[300] = 4242;
    CHECK(read_back(48) == std::vector<uint32_t>{4242, 301, 302, 303});
  }
  dev.write(*buf, 48, bytes + 400, 16);
  bytes[400] = 1;
  CHECK(read_back(48) == std::vector<uint32_t>{400, 401, 402, 403});
}

// The routed experts' grouped prefill product (moe_matmul.comp: every expert's 16 x 8 tiles in
// one dispatch, read from the stacked bank through one binding per section; moe_matmul_tiled.comp
// over register tiles: the fitted one, which lavapipe takes, and a forced 32-row one) against the
// CPU's routed experts, on a resident bank and on GPU slots holding the experts in another order
// (the tile table names slots), next to the per-expert path (REDWING_GPU_MOE_PREFILL=per-expert:
// what a bank too large for one binding takes). The routes are chosen so that the experts have 0,
// 1, 7, 33 and 33 rows (tiles of 1 to 8 rows, several tiles per expert) plus one of 8, in 4 and 8
// bits, groups 32, 64 and 128, bf16, f16 and f32 scales, rows past one staging slab (512).
TEST_CASE(
    "gpu: the routed experts' grouped prefill product matches the CPU, resident and in slots") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  // The grouped product's kernels: REDWING_GPU_QMATMUL unset (the fitted register tile on
  // lavapipe), narrow (moe_matmul), tiled:32 and the 8 x 4 blocks (moe_matmul_tiled_r8) fitted.
  std::vector<std::unique_ptr<Backend>> groupeds;
  const char* const tile_settings[] = {"", "narrow", "tiled:32", "r8"};
  for (const char* setting : tile_settings) {
    setenv("REDWING_GPU_QMATMUL", setting, 1);
    groupeds.push_back(gpu_backend(threads));
  }
  unsetenv("REDWING_GPU_QMATMUL");
  setenv("REDWING_GPU_MOE_PREFILL", "per-expert", 1);
  auto per_expert = gpu_backend(threads);
  unsetenv("REDWING_GPU_MOE_PREFILL");
  struct Variant {
    int bits, group;
    DType st;
    int64_t hidden, inter;
  };
  const Variant variants[] = {
      {4, 32, DType::bf16, 96, 160},
      {8, 64, DType::f16, 640, 64},
      {4, 128, DType::f32, 128, 384},
      {8, 32, DType::bf16, 64, 96},
  };
  const int experts = 6, top_k = 2;
  const int64_t t = 41;
  // Token i's two experts: e1 for one token, e2 for 7, e3 for 33, e4 for 33, e5 for 8, e0 for
  // none; the tokens shuffled so that an expert's rows are not consecutive tokens.
  std::vector<std::array<int32_t, 2>> pick;
  pick.push_back({1, 3});
  for (int i = 0; i < 7; ++i) pick.push_back({2, 3});
  for (int i = 0; i < 25; ++i) pick.push_back({3, 4});
  for (int i = 0; i < 8; ++i) pick.push_back({4, 5});
  REQUIRE(static_cast<int64_t>(pick.size()) == t);
  std::shuffle(pick.begin(), pick.end(), std::mt19937_64(41));
  std::vector<int32_t> ids;
  for (const auto& p : pick) ids.insert(ids.end(), p.begin(), p.end());
  const size_t count = ids.size();
  std::vector<float> weights = randn(count, 42);
  for (float& w : weights) w = std::abs(w) + 0.1f;
  int seed = 4000;
  for (const Variant& v : variants) {
    CAPTURE(v.bits);
    CAPTURE(v.group);
    CAPTURE(static_cast<int>(v.st));
    CAPTURE(v.hidden);
    std::vector<HostQuant> host;  // gate, up, down per expert
    for (int e = 0; e < experts; ++e) {
      host.emplace_back(v.inter, v.hidden, v.bits, v.group, v.st, static_cast<uint64_t>(seed++));
      host.emplace_back(v.inter, v.hidden, v.bits, v.group, v.st, static_cast<uint64_t>(seed++));
      host.emplace_back(v.hidden, v.inter, v.bits, v.group, v.st, static_cast<uint64_t>(seed++));
    }
    // (Not a structured binding: clang 14 cannot capture one in the lambda below.)
    const ExpertParts parts = expert_parts(host);
    const std::vector<HostQuantMatrix>&gate = parts.gate, &up = parts.up, &down = parts.down;
    const auto x = randn(static_cast<size_t>(t * v.hidden), static_cast<uint64_t>(seed++));
    const size_t out_floats = x.size();
    // out = routed_experts(x) on backend b with the routes above.
    auto run = [&](Backend& b) {
      auto bank = b.import_experts(gate, up, down);
      auto routes = b.alloc(route_buffer_bytes(count));
      b.upload(*routes, 0, ids.data(), count * 4);
      b.upload(*routes, route_weights_offset(count), weights.data(), count * 4);
      auto xb = put(b, x);
      auto ob = b.alloc(out_floats * 4);
      b.routed_experts(*bank, Mat{xb.get(), 0, t, v.hidden, v.hidden}, *routes, top_k,
                       Mat{ob.get(), 0, t, v.hidden, v.hidden});
      return get(b, *ob);
    };
    const auto want = run(*cpu);
    // The error against the output's largest magnitude: the products' sums cancel (random
    // biases), so an element can be far smaller than the terms whose rounding it carries.
    auto off = [&](const std::vector<float>& a) {
      double diff = 0, scale = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(a[i]) - want[i]));
        scale = std::max(scale, std::abs(static_cast<double>(want[i])));
      }
      return scale > 0 ? diff / scale : INFINITY;
    };
    const uint64_t before_pe = per_expert->work_counters().dispatches;
    CHECK(off(run(*per_expert)) < 1e-5);
    const uint64_t per_expert_dispatches = per_expert->work_counters().dispatches - before_pe;
    for (size_t g = 0; g < groupeds.size(); ++g) {
      const std::string tile_setting = tile_settings[g];
      CAPTURE(tile_setting);
      Backend& grouped = *groupeds[g];
      const uint64_t before = grouped.work_counters().dispatches;
      const auto got = run(grouped);
      const uint64_t grouped_dispatches = grouped.work_counters().dispatches - before;
      CHECK(off(got) < 1e-5);
      // Grouped: a gather, the gate/up product, the GeGLU, the down product, a gather into entry
      // order and the combine, whatever the experts; per expert: the first gather and the two
      // products for each of the 5 experts with rows.
      CHECK(grouped_dispatches == 6);
      CHECK(per_expert_dispatches == grouped_dispatches + 3 * (5 - 1));

      // Slots: slot s holds expert holder[s] (not s); one call with every expert, then two waves
      // of the slot products (entries of the other wave's experts -1).
      const int32_t holder[] = {4, 0, 5, 2, 3, 1};
      std::vector<int32_t> slot_of(experts);
      for (int s = 0; s < experts; ++s) slot_of[static_cast<size_t>(holder[s])] = s;
      auto slots = grouped.create_expert_slots(gate[0], up[0], down[0], experts);
      for (int s = 0; s < experts; ++s) {
        const size_t e = static_cast<size_t>(holder[s]);
        grouped.fill_expert_slot(*slots, s, holder[s], gate[e], up[e], down[e]);
      }
      auto routes = grouped.alloc(route_buffer_bytes(count));
      grouped.upload(*routes, 0, ids.data(), count * 4);
      grouped.upload(*routes, route_weights_offset(count), weights.data(), count * 4);
      auto xb = put(grouped, x);
      const Mat xm{xb.get(), 0, t, v.hidden, v.hidden};
      for (int waves : {1, 2}) {
        CAPTURE(waves);
        auto ob = grouped.alloc(out_floats * 4);
        for (int w = 0; w < waves; ++w) {
          std::vector<int32_t> entry_slot(count, -1);
          for (size_t j = 0; j < count; ++j)
            if (waves == 1 || (ids[j] % 2) == w)
              entry_slot[j] = slot_of[static_cast<size_t>(ids[j])];
          grouped.slot_expert_products(*slots, xm, ids, entry_slot, top_k);
        }
        grouped.combine_slot_products(*routes, ids, weights, top_k,
                                      Mat{ob.get(), 0, t, v.hidden, v.hidden});
        // The same tiles as the resident bank's: the same bits.
        CHECK(get(grouped, *ob) == got);
      }
    }
  }
}

TEST_CASE("gpu: sampling in place gives the CPU sampler's seeded choices") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  const int64_t vocab = 5003;  // five workgroups of the first pass, the last one partial
  auto logits = randn(static_cast<size_t>(vocab), 41, 3.0f);
  const float top = *std::max_element(logits.begin(), logits.end());
  logits[4000] = logits[17] = top + 1.0f;  // a tie at the top: the lower id wins
  logits[2500] = logits[2501] = top - 0.5f;
  const std::vector<int32_t> history = {5, 17, 4000, 17, 9, 2500, 77, 5};

  // The candidates themselves: ids, logits, max and exp-sum, against the host default.
  for (int k : {1, 7, 64}) {
    auto lc = put(*cpu, logits), lg = put(*gpu, logits);
    const auto a = cpu->top_logits(Mat{lc.get(), 0, 1, vocab, vocab}, k);
    const auto b = gpu->top_logits(Mat{lg.get(), 0, 1, vocab, vocab}, k);
    CHECK(a.ids == b.ids);
    CHECK(a.logits == b.logits);
    CHECK(a.max == b.max);
    CHECK(std::abs(a.exp_sum - b.exp_sum) / a.exp_sum < 1e-5);
    CHECK(b.finite);
  }

  std::vector<SamplerConfig> configs;
  auto config = [&](float t, int k, float p, float penalty) {
    SamplerConfig c;
    c.temperature = t;
    c.top_k = k;
    c.top_p = p;
    c.repetition_penalty = penalty;
    configs.push_back(c);
  };
  config(0.0f, 64, 0.95f, 1.0f);  // greedy
  config(0.0f, 64, 0.95f, 1.5f);  // greedy after the penalty
  config(0.7f, 64, 0.95f, 1.3f);  // the defaults' shape, with a penalty
  config(1.0f, 10, 1.0f, 1.0f);   // top-k only
  config(1.5f, 40, 0.5f, 1.1f);   // a tight top-p
  config(0.8f, 0, 0.9f, 1.0f);    // no top-k: the row is downloaded
  int in_place_draws = 0;
  // The GPU shape runs fewer seeds: lavapipe runs its 256-thread workgroups slowly.
  const uint64_t seeds = threads == 256 ? 2 : 6;
  for (size_t ci = 0; ci < configs.size(); ++ci)
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
      SamplerConfig c = configs[ci];
      c.seed = seed;
      Sampler on_cpu(c), on_gpu(c);
      for (int step = 0; step < 4; ++step) {
        CAPTURE(ci);
        CAPTURE(seed);
        CAPTURE(step);
        std::vector<float> host = logits;
        const int32_t expected = on_cpu.sample(host, history);
        auto row = put(*gpu, logits);
        const uint64_t before = gpu->work_counters().submissions;
        const int32_t got =
            on_gpu.sample_in_place(*gpu, Mat{row.get(), 0, 1, vocab, vocab}, history);
        CHECK(got == expected);
        if (c.top_k > 0) {
          // The penalty and both passes run in one submission; only the candidates come back.
          CHECK(gpu->work_counters().submissions == before + 1);
          ++in_place_draws;
        }
      }
    }
  CHECK(in_place_draws == 5 * static_cast<int>(seeds) * 4);

  // A NaN logit is the sampler's error, naming the entry, on the in-place path too.
  auto bad = logits;
  bad[123] = std::nanf("");
  auto row = put(*gpu, bad);
  SamplerConfig c;
  c.temperature = 0.7f;
  Sampler s(c);
  CHECK_THROWS_WITH_AS(s.sample_in_place(*gpu, Mat{row.get(), 0, 1, vocab, vocab}, history),
                       doctest::Contains("entry 123"), NonFiniteLogits);
}

TEST_CASE("gpu: KV store and attention match the CPU (f32 and f16, windows, rings, GQA)") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto gpu = gpu_backend(threads);
  const int kv_heads = 2, heads = 6, d = 40;
  const int64_t width = kv_heads * d;
  struct Case {
    int64_t capacity;
    bool ring;
    int64_t window;
    KvDType dtype;
    int64_t chunk;
  };
  // 300 positions cross the 256-key split of the decode kernel.
  for (const Case c : {Case{300, false, 0, KvDType::f32, 300}, Case{300, false, 0, KvDType::f16, 7},
                       Case{300, false, 0, KvDType::f32, 1}, Case{20, true, 20, KvDType::f32, 13},
                       Case{24, true, 17, KvDType::f16, 1}}) {
    CAPTURE(c.capacity);
    CAPTURE(c.chunk);
    // 300 one-token steps and 300 rows at once are most of this case's time through lavapipe's
    // 256-thread workgroups; the GPU shape is covered by the other cases (decode steps on rings
    // included).
    if (threads == 256 && !c.ring && c.chunk != 7) continue;
    const int64_t total = 300 / (c.ring ? 5 : 1);
    const size_t elem = c.dtype == KvDType::f32 ? 4 : 2;
    const auto k = randn(static_cast<size_t>(total * width), 31);
    const auto v = randn(static_cast<size_t>(total * width), 32);
    const auto q = randn(static_cast<size_t>(total * heads * d), 33);
    std::vector<float> outs[2];
    int which = 0;
    for (Backend* b : {cpu.get(), gpu.get()}) {
      auto kc = b->alloc(static_cast<size_t>(c.capacity * width) * elem);
      auto vc = b->alloc(static_cast<size_t>(c.capacity * width) * elem);
      KvLayerView kv{kc.get(), vc.get(), c.capacity, c.ring, c.window, kv_heads, d, c.dtype};
      auto kb = put(*b, k), vb = put(*b, v), qb = put(*b, q);
      auto ob = b->alloc(q.size() * 4);
      for (int64_t p0 = 0; p0 < total; p0 += c.chunk) {
        const int64_t n = std::min(c.chunk, total - p0);
        b->kv_store(kv, Mat{kb.get(), p0 * width, n, width, width},
                    Mat{vb.get(), p0 * width, n, width, width}, p0);
        b->attention(Mat{qb.get(), p0 * heads * d, n, heads * d, heads * d}, kv, p0, heads, 0.125f,
                     Mat{ob.get(), p0 * heads * d, n, heads * d, heads * d});
      }
      outs[which++] = get(*b, *ob);
    }
    CHECK(max_rel(outs[1], outs[0]) < 1e-5);
  }
}

// store_kv_normed: the GPU's one-dispatch k norm + RoPE, v norm and store (kv_norm_store.comp)
// writes the caches bit for bit as its separate ops do (REDWING_GPU_UNFUSED=kv), over f32 and f16
// caches, a ring, with and without the v norm and the k weight, 1 and 5 rows, head_dim 40 and
// 512; and attention over what it stored matches the CPU's ops.
TEST_CASE("gpu: the keys' and values' norms and store in one dispatch match the separate ops") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto fused = gpu_backend(threads);
  auto unfused = gpu_backend_unfused("kv", threads);
  struct Case {
    int d;
    KvDType dtype;
    bool ring, v_norm, k_weight;
    int64_t rows;
  };
  const RopeParams rope{10000, 0, 0, 1.0};
  for (const Case c :
       {Case{40, KvDType::f32, false, true, true, 1}, Case{40, KvDType::f16, false, true, true, 5},
        Case{40, KvDType::f16, true, false, true, 5},
        Case{512, KvDType::f16, false, true, false, 1},
        Case{512, KvDType::f32, true, true, true, 5}}) {
    CAPTURE(c.d);
    CAPTURE(c.rows);
    CAPTURE(c.ring);
    const int kv_heads = 2, heads = 4;
    const int64_t width = kv_heads * c.d, capacity = 8, pos0 = 6;
    RopeParams rp = rope;
    rp.rotary_pairs = c.d / 2;
    rp.freq_dim = c.d;
    const auto k = randn(static_cast<size_t>(c.rows * width), 61, 2.0f);
    const auto v = randn(static_cast<size_t>(c.rows * width), 62, 2.0f);
    const auto kw = randn(static_cast<size_t>(c.d), 63, 0.3f);
    const auto q = randn(static_cast<size_t>(c.rows * heads * c.d), 64);
    std::vector<float> caches[2][2], outs[3];
    int which = 0;
    for (Backend* b : {fused.get(), unfused.get(), cpu.get()}) {
      const ZeroedKvCache cache = zeroed_kv_cache(*b, capacity, c.ring, kv_heads, c.d, c.dtype);
      const KvLayerView& kv = cache.view;
      auto kb = put(*b, k), vb = put(*b, v), wb = put(*b, kw), qb = put(*b, q);
      const int64_t p0 = c.ring ? pos0 : 0;  // a ring wraps: positions 6.. go to rows 6, 7, 0..
      b->store_kv_normed(kv, Mat{kb.get(), 0, c.rows, width, width},
                         Mat{vb.get(), 0, c.rows, width, width}, c.k_weight ? wb.get() : nullptr,
                         1.0f, 1e-6f, rp, c.v_norm, p0);
      auto ob = b->alloc(q.size() * 4);
      b->attention(Mat{qb.get(), 0, c.rows, heads * c.d, heads * c.d}, kv, p0, heads, 0.125f,
                   Mat{ob.get(), 0, c.rows, heads * c.d, heads * c.d});
      outs[which] = get(*b, *ob);
      if (which < 2) {
        caches[which][0] = get(*b, *cache.k);
        caches[which][1] = get(*b, *cache.v);
      }
      ++which;
    }
    CHECK(caches[0][0] == caches[1][0]);
    CHECK(caches[0][1] == caches[1][1]);
    CHECK(max_rel(outs[0], outs[1]) == 0.0);
    CHECK(max_rel(outs[0], outs[2]) < 1e-5);
  }
}

// Attention's inputs of a layer (project_attention_inputs): the q/k/v products, then q's norm and
// rotation and the keys' and values' norms, rotation and store, which the GPU does in each
// product's last workgroup per head (qmatvec_heads.comp). Against the same GPU running the
// separate ops (REDWING_GPU_UNFUSED=heads: q and the caches must be the same bits) and against
// the CPU: with the input norm folded and without a norm, values from their own product and
// from the keys' (k_eq_v), with and without the value norm, f32 and f16 caches, a ring that
// wraps, 1 and 3 tokens fused and 5 through the separate ops, a head_dim the product's rows do
// not tile by head (40: separate ops) and the widest (512).
TEST_CASE("gpu: attention's q/k/v products with their heads' norms and store match the CPU") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  auto fused = gpu_backend(threads);
  auto unfused = gpu_backend_unfused("heads", threads);
  const bool last_workgroup = gpu_device_of(*fused)->info().workgroups_see_writes;
  struct Case {
    int d;
    KvDType dtype;
    bool ring, v_norm, k_eq_v, input_norm;
    int64_t rows;
  };
  const int kv_heads = 2, heads = 4;
  const int64_t hidden = 320, capacity = 8;
  for (const Case c : {Case{48, KvDType::f16, false, true, false, true, 1},
                       Case{48, KvDType::f32, true, true, false, false, 3},
                       Case{48, KvDType::f16, true, false, true, true, 3},
                       Case{48, KvDType::f32, false, true, true, false, 5},
                       Case{40, KvDType::f16, false, true, false, true, 1},
                       Case{512, KvDType::f16, true, true, false, true, 1},
                       Case{512, KvDType::f32, false, true, true, true, 3}}) {
    CAPTURE(c.d);
    CAPTURE(c.rows);
    CAPTURE(c.ring);
    CAPTURE(c.v_norm);
    CAPTURE(c.k_eq_v);
    CAPTURE(c.input_norm);
    const int64_t width = kv_heads * c.d, q_width = heads * c.d;
    HostQuant qw(q_width, hidden, 4, 64, DType::bf16, 1201);
    HostQuant kw(width, hidden, 4, 32, DType::f16, 1202);
    HostQuant vw(width, hidden, 8, 64, DType::bf16, 1203);
    RopeParams rope{10000, c.d / 2, c.d, 1.0};
    const auto x = randn(static_cast<size_t>(c.rows * hidden), 1204);
    const auto in_w = randn(static_cast<size_t>(hidden), 1205, 0.3f);
    const auto q_w = randn(static_cast<size_t>(c.d), 1206, 0.3f);
    const auto k_w = randn(static_cast<size_t>(c.d), 1207, 0.3f);
    const int64_t pos0 = c.ring ? 6 : 0;  // a ring wraps: positions 6.. go to rows 6, 7, 0..
    std::vector<float> qs[3], caches[3][2], outs[3];
    uint64_t dispatches[3] = {};
    int which = 0;
    for (Backend* b : {fused.get(), unfused.get(), cpu.get()}) {
      const ZeroedKvCache cache = zeroed_kv_cache(*b, capacity, c.ring, kv_heads, c.d, c.dtype);
      const KvLayerView& kv = cache.view;
      auto wq = b->import_qweight(qw.m), wk = b->import_qweight(kw.m), wv = b->import_qweight(vw.m);
      auto xb = put(*b, x), nb = put(*b, in_w), qnb = put(*b, q_w), knb = put(*b, k_w);
      auto hb = b->alloc(x.size() * 4), qb = b->alloc(static_cast<size_t>(c.rows * q_width) * 4),
           kb = b->alloc(static_cast<size_t>(c.rows * width) * 4),
           vb = b->alloc(static_cast<size_t>(c.rows * width) * 4);
      const Mat xm{xb.get(), 0, c.rows, hidden, hidden};
      // Without the input norm the products read x itself (an input normed beforehand).
      const Mat h = c.input_norm ? Mat{hb.get(), 0, c.rows, hidden, hidden} : xm;
      const Mat q{qb.get(), 0, c.rows, q_width, q_width};
      const Backend::QkvProducts qkv{
          {wq.get(), h, q},
          {wk.get(), h, Mat{kb.get(), 0, c.rows, width, width}},
          {c.k_eq_v ? nullptr : wv.get(), h, Mat{vb.get(), 0, c.rows, width, width}}};
      const Backend::InputNorm norm{nb.get(), 1.0f, 1e-6f, std::nullopt};
      const uint64_t before = b->work_counters().dispatches;
      b->project_attention_inputs(xm, c.input_norm ? &norm : nullptr, h, qkv,
                                  {qnb.get(), knb.get(), 1.0f, 1e-6f, rope, c.v_norm}, kv, pos0);
      dispatches[which] = b->work_counters().dispatches - before;
      qs[which] = get(*b, *qb);
      caches[which][0] = get(*b, *cache.k);
      caches[which][1] = get(*b, *cache.v);
      auto ob = b->alloc(static_cast<size_t>(c.rows * q_width) * 4);
      b->attention(q, kv, pos0, heads, 0.125f, Mat{ob.get(), 0, c.rows, q_width, q_width});
      outs[which] = get(*b, *ob);
      ++which;
    }
    CHECK(qs[0] == qs[1]);
    CHECK(caches[0][0] == caches[1][0]);
    CHECK(caches[0][1] == caches[1][1]);
    CHECK(max_rel(outs[0], outs[1]) == 0.0);
    CHECK(max_rel(qs[0], qs[2]) < 1e-4);
    // An f16 cache stores keys and values that differ from the CPU's in the last float bits;
    // now and then one rounds to the next f16 (2^-11 of it, relative), which moves the output
    // by that much of its weight: 1.6e-4 at head_dim 512 on the H200.
    CHECK(max_rel(outs[0], outs[2]) < (c.dtype == KvDType::f16 ? 1e-3 : 1e-4));
    // Fused: one dispatch per product. The input norm is its own dispatch where it is not folded
    // into the products (more than 4 tokens, or more rows in all than REDWING_GPU_FOLD_NORMS=small
    // takes); the separate ops add q's norm_rope, the keys' store and the values' copy.
    const uint64_t products = c.k_eq_v ? 2u : 3u;
    const int64_t rows_in_all = q_width + width * static_cast<int64_t>(products - 1);
    const uint64_t norm_op = c.input_norm && (c.rows > 4 || rows_in_all > 1024) ? 1u : 0u;
    const bool takes = last_workgroup && c.rows <= 4 && c.d % 16 == 0;
    const uint64_t separate = products + norm_op + 2u + (c.k_eq_v ? 1u : 0u);
    CHECK(dispatches[0] == (takes ? products + norm_op : separate));
    CHECK(dispatches[1] == separate);
  }
}

// A layer's attention from its input (attention_from_input) for one decode row at a time, with
// the heads normed, rotated and stored inside attention's dispatch (REDWING_GPU_ATTENTION_INPUTS=
// attention, the default: q, k and v plain products) against the products' per-head epilogues
// (products) and the CPU, over a run of decode steps (earlier keys from
// the cache, the current one from the dispatch itself): the outputs and both caches must be the
// default's bits, and within 1e-4 of the CPU (1e-3 with an f16 cache). Gemma 4's sliding kind
// (values of their own, normed) and global kind (the keys' raw product as values), Gemma 3's (no
// value norm); f32 and f16 caches, a ring that wraps, groups of 2 and 4 query heads, head_dim 40
// (the default's separate ops), 64, 256 and 512; the default split and splits of one key (the
// current key alone in its split). q.y keeps the raw product where the dispatch did the heads,
// which says that it did. A third GPU backend reads the layer's used cache first
// (REDWING_GPU_PREFETCH_KV=1, kv_prefetch.comp): the same bits, one dispatch more at every step
// with keys in the cache, and not one barrier more (the read must not wait for the step before).
TEST_CASE("gpu: attention from its input with the heads done in attention's dispatch") {
  FOR_EACH_WORKGROUP_SHAPE(threads);
  check_setting_refused("REDWING_GPU_ATTENTION_INPUTS",
                        {"yes", "attention,products", " attention"});
  check_setting_refused("REDWING_GPU_PREFETCH_KV", {"yes", "2"});
  auto cpu = make_cpu_backend(2);
  struct Case {
    int d, heads;
    KvDType dtype;
    bool ring, v_norm, k_eq_v, input_norm;
    float offset;
    const char* split;
  };
  const int kv_heads = 2;
  const int64_t hidden = 192, capacity = 8, steps = 11;
  for (const Case c : {Case{64, 4, KvDType::f16, true, true, false, true, 0.0f, ""},
                       Case{64, 8, KvDType::f32, false, true, true, false, 1.0f, "64,1"},
                       Case{256, 4, KvDType::f16, true, false, false, true, 1.0f, ""},
                       Case{256, 8, KvDType::f32, false, true, true, true, 0.0f, ""},
                       Case{512, 8, KvDType::f16, false, true, true, true, 0.0f, "64,1"},
                       Case{40, 4, KvDType::f32, true, true, false, true, 1.0f, ""}}) {
    CAPTURE(c.d);
    CAPTURE(c.heads);
    CAPTURE(c.ring);
    CAPTURE(c.k_eq_v);
    CAPTURE(c.split);
    const char* split = c.split;  // empty: the default split
    auto products = gpu_backend_with(
        {{"REDWING_GPU_ATTENTION", split}, {"REDWING_GPU_ATTENTION_INPUTS", "products"}}, threads);
    // The read-ahead is a GPU's default (not lavapipe's): off here, so that on any device
    // `prefetching` records exactly one dispatch more.
    auto inside = gpu_backend_with({{"REDWING_GPU_ATTENTION", split},
                                    {"REDWING_GPU_ATTENTION_INPUTS", "attention"},
                                    {"REDWING_GPU_PREFETCH_KV", "0"}},
                                   threads);
    auto prefetching = gpu_backend_with({{"REDWING_GPU_ATTENTION", split},
                                         {"REDWING_GPU_ATTENTION_INPUTS", "attention"},
                                         {"REDWING_GPU_PREFETCH_KV", "1"}},
                                        threads);
    const int64_t width = kv_heads * c.d, q_width = c.heads * c.d;
    HostQuant qw(q_width, hidden, 4, 64, DType::bf16, 1301);
    HostQuant kw(width, hidden, 4, 32, DType::f16, 1302);
    HostQuant vw(width, hidden, 8, 64, DType::bf16, 1303);
    const RopeParams rope{10000, c.d / 2, c.d, 1.0};
    const auto in_w = randn(static_cast<size_t>(hidden), 1305, 0.3f);
    const auto q_w = randn(static_cast<size_t>(c.d), 1306, 0.3f);
    const auto k_w = randn(static_cast<size_t>(c.d), 1307, 0.3f);
    std::vector<float> outs[4], caches[4][2], raw_q[4];
    Backend::WorkCounters work[4];
    int which = 0;
    for (Backend* b : {products.get(), inside.get(), cpu.get(), prefetching.get()}) {
      const ZeroedKvCache cache = zeroed_kv_cache(*b, capacity, c.ring, kv_heads, c.d, c.dtype);
      auto wq = b->import_qweight(qw.m), wk = b->import_qweight(kw.m), wv = b->import_qweight(vw.m);
      auto nb = put(*b, in_w), qnb = put(*b, q_w), knb = put(*b, k_w);
      auto hb = b->alloc(static_cast<size_t>(hidden) * 4);
      auto qb = b->alloc(static_cast<size_t>(q_width) * 4);
      auto kb = b->alloc(static_cast<size_t>(width) * 4),
           vb = b->alloc(static_cast<size_t>(width) * 4);
      auto ob = b->alloc(static_cast<size_t>(q_width) * 4);
      const int64_t positions = c.ring ? steps : capacity;  // a ring wraps; a flat cache fills
      for (int64_t pos = 0; pos < positions; ++pos) {
        const auto x = randn(static_cast<size_t>(hidden), static_cast<uint64_t>(1310 + pos));
        auto xb = put(*b, x);
        const Mat xm{xb.get(), 0, 1, hidden, hidden};
        const Mat h = c.input_norm ? Mat{hb.get(), 0, 1, hidden, hidden} : xm;
        const Backend::QkvProducts qkv{
            {wq.get(), h, Mat{qb.get(), 0, 1, q_width, q_width}},
            {wk.get(), h, Mat{kb.get(), 0, 1, width, width}},
            {c.k_eq_v ? nullptr : wv.get(), h, Mat{vb.get(), 0, 1, width, width}}};
        const Backend::InputNorm norm{nb.get(), 1.0f, 1e-6f, std::nullopt};
        const Backend::WorkCounters before = b->work_counters();
        b->attention_from_input(xm, c.input_norm ? &norm : nullptr, h, qkv,
                                {qnb.get(), knb.get(), c.offset, 1e-6f, rope, c.v_norm}, cache.view,
                                pos, 0.125f, Mat{ob.get(), 0, 1, q_width, q_width});
        const Backend::WorkCounters after = b->work_counters();
        work[which].dispatches += after.dispatches - before.dispatches;
        work[which].barriers += after.barriers - before.barriers;
        const auto o = get(*b, *ob);
        outs[which].insert(outs[which].end(), o.begin(), o.end());
      }
      raw_q[which] = get(*b, *qb);
      caches[which][0] = get(*b, *cache.k);
      caches[which][1] = get(*b, *cache.v);
      ++which;
    }
    CHECK(outs[1] == outs[0]);
    CHECK(caches[1][0] == caches[0][0]);
    CHECK(caches[1][1] == caches[0][1]);
    CHECK(raw_q[1] != raw_q[0]);  // normed and rotated by the default, raw where attention did it
    CHECK(max_rel(outs[1], outs[2]) < (c.dtype == KvDType::f16 ? 1e-3 : 1e-4));
    CHECK(outs[3] == outs[1]);
    CHECK(caches[3][0] == caches[1][0]);
    CHECK(caches[3][1] == caches[1][1]);
    const int64_t positions = c.ring ? steps : capacity;
    CHECK(work[3].dispatches == work[1].dispatches + static_cast<uint64_t>(positions - 1));
    CHECK(work[3].barriers == work[1].barriers);
  }
}

// Decode attention split other ways (REDWING_GPU_ATTENTION: a GPU's default 1,024 x 16, many
// short splits, one long split per row and head, odd minimums) still matches the CPU: the
// combine is exact for any split. A malformed setting is refused.
TEST_CASE("gpu: decode attention matches the CPU however its keys are split") {
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;  // the Metal device keeps the default split
  check_setting_refused("REDWING_GPU_ATTENTION",
                        {"0,32", "256,0", "256,257", "256", "256,32,1", "256,32,", "256,32,lastly",
                         "256,,32", "256,32,last,x", "-1,32"});
  auto cpu = make_cpu_backend(2);
  const int kv_heads = 2, heads = 4, d = 64;
  const int64_t width = kv_heads * d;
  struct Case {
    const char* split;
    int64_t keys;
  };
  // 300 keys in splits of one: more splits than the merge's chunk of 256.
  for (const Case c : {Case{"", 90},
                       {"1024,16", 90},
                       {"1024,16,separate", 90},
                       {"4096,8", 90},
                       {"4096,8,separate", 90},
                       {"2048,1", 90},
                       {"2048,1,last", 90},
                       {"1,256", 90},
                       {"1,256,last", 90},
                       {"96,48", 90},
                       {"96,48,separate", 90},
                       {"65536,1,last", 300},
                       {"65536,1,separate", 300}}) {
    CAPTURE(std::string(c.split));
    const int64_t total = c.keys;
    const auto k = randn(static_cast<size_t>(total * width), 41);
    const auto v = randn(static_cast<size_t>(total * width), 42);
    // Two decode rows (the last position, twice with other queries: the arrival counters must be
    // back at zero for the second), then 5 prefill rows whose visible ranges differ (some of the
    // first rows' splits hold no key).
    const auto q1 = randn(static_cast<size_t>(heads * d), 43);
    const auto q2 = randn(static_cast<size_t>(heads * d), 44);
    const auto q5 = randn(static_cast<size_t>(5 * heads * d), 45);
    setenv("REDWING_GPU_ATTENTION", c.split, 1);
    auto gpu = gpu_backend(64);
    unsetenv("REDWING_GPU_ATTENTION");
    std::vector<float> outs[2][3];
    int which = 0;
    for (Backend* b : {cpu.get(), gpu.get()}) {
      auto kc = b->alloc(static_cast<size_t>(total * width) * 2);
      auto vc = b->alloc(static_cast<size_t>(total * width) * 2);
      KvLayerView kv{kc.get(), vc.get(), total, false, 0, kv_heads, d, KvDType::f16};
      auto kb = put(*b, k), vb = put(*b, v);
      b->kv_store(kv, Mat{kb.get(), 0, total, width, width}, Mat{vb.get(), 0, total, width, width},
                  0);
      int call = 0;
      for (const auto* q : {&q1, &q2, &q5}) {
        const int64_t rows = static_cast<int64_t>(q->size()) / (heads * d);
        auto qb = put(*b, *q);
        auto ob = b->alloc(q->size() * 4);
        b->attention(Mat{qb.get(), 0, rows, heads * d, heads * d}, kv, total - rows, heads, 0.125f,
                     Mat{ob.get(), 0, rows, heads * d, heads * d});
        outs[which][call++] = get(*b, *ob);
      }
      ++which;
    }
    for (int call = 0; call < 3; ++call) {
      CAPTURE(call);
      CHECK(max_rel(outs[1][call], outs[0][call]) < 1e-5);
    }
  }
}

// Decode attention workgroups that score several query heads of one KV head from one read of
// each key and value (REDWING_GPU_ATTENTION_HEADS) give the one-head workgroups' bits, and match
// the CPU: groups of 4 and 2, head_dim 64, 256 and 512 (where the kernel's shared queries allow
// fewer heads than asked), f32 and f16 caches, a sliding window over a ring that wraps, splits
// merged in the last workgroup and by the combine, one split and many, decode rows and a few
// prefill rows. A malformed setting is refused.
TEST_CASE("gpu: decode attention over several query heads per workgroup gives the one-head bits") {
  if (const char* api = std::getenv("REDWING_GPU_TEST_API"); api && std::string(api) == "metal")
    return;  // the Metal device keeps the default
  check_setting_refused("REDWING_GPU_ATTENTION_HEADS", {"0", "5", "x", "2 heads", "-1"});
  auto cpu = make_cpu_backend(2);
  struct Case {
    int kv_heads, heads, d;
    KvDType dtype;
    int64_t capacity, window;  // window > 0: a ring of `capacity` positions
    const char* split;
  };
  for (const Case c : {Case{2, 8, 64, KvDType::f16, 90, 0, ""},
                       {2, 8, 64, KvDType::f32, 90, 0, "4096,8,separate"},
                       {1, 4, 256, KvDType::f16, 70, 0, "1,256"},
                       {4, 8, 256, KvDType::f32, 40, 32, "1024,4"},
                       {2, 8, 512, KvDType::f16, 90, 0, "2048,8,last"},
                       {1, 2, 40, KvDType::f16, 300, 0, "65536,1,last"}}) {
    const std::string shape = std::to_string(c.kv_heads) + " kv heads, " + std::to_string(c.heads) +
                              " heads, d " + std::to_string(c.d) + ", window " +
                              std::to_string(c.window) + ", split '" + c.split + "'";
    CAPTURE(shape);
    const int64_t width = static_cast<int64_t>(c.kv_heads) * c.d;
    const int64_t positions = c.window > 0 ? c.capacity + 25 : c.capacity;  // the ring wraps
    const auto k = randn(static_cast<size_t>(positions * width), 51);
    const auto v = randn(static_cast<size_t>(positions * width), 52);
    const auto q1 = randn(static_cast<size_t>(c.heads * c.d), 53);
    const auto q3 = randn(static_cast<size_t>(3 * c.heads * c.d), 54);
    const int cache_bytes = c.dtype == KvDType::f16 ? 2 : 4;
    // outs[backend][call]: backends cpu, then heads per workgroup 1, 2 and 4.
    std::vector<float> outs[4][3];
    std::vector<std::unique_ptr<Backend>> gpus;
    for (const char* heads : {"1", "2", "4"}) {
      setenv("REDWING_GPU_ATTENTION", c.split, 1);
      setenv("REDWING_GPU_ATTENTION_HEADS", heads, 1);
      gpus.push_back(gpu_backend(64));
      unsetenv("REDWING_GPU_ATTENTION");
      unsetenv("REDWING_GPU_ATTENTION_HEADS");
    }
    int which = 0;
    for (Backend* b : {cpu.get(), gpus[0].get(), gpus[1].get(), gpus[2].get()}) {
      auto kc = b->alloc(static_cast<size_t>(c.capacity * width * cache_bytes));
      auto vc = b->alloc(static_cast<size_t>(c.capacity * width * cache_bytes));
      KvLayerView kv{kc.get(), vc.get(),   c.capacity, c.window > 0,
                     c.window, c.kv_heads, c.d,        c.dtype};
      // Stored in chunks no longer than the ring, as the model stores a prompt.
      for (int64_t p0 = 0; p0 < positions; p0 += 20) {
        const int64_t n = std::min<int64_t>(20, positions - p0);
        const std::vector<float> kpart(k.begin() + p0 * width, k.begin() + (p0 + n) * width);
        const std::vector<float> vpart(v.begin() + p0 * width, v.begin() + (p0 + n) * width);
        auto kb = put(*b, kpart), vb = put(*b, vpart);
        b->kv_store(kv, Mat{kb.get(), 0, n, width, width}, Mat{vb.get(), 0, n, width, width}, p0);
      }
      int call = 0;
      for (const auto* q : {&q1, &q1, &q3}) {
        const int64_t rows = static_cast<int64_t>(q->size()) / (c.heads * c.d);
        auto qb = put(*b, *q);
        auto ob = b->alloc(q->size() * 4);
        const int64_t qd = static_cast<int64_t>(c.heads) * c.d;
        b->attention(Mat{qb.get(), 0, rows, qd, qd}, kv, positions - rows, c.heads, 0.125f,
                     Mat{ob.get(), 0, rows, qd, qd});
        outs[which][call++] = get(*b, *ob);
      }
      ++which;
    }
    for (int call = 0; call < 3; ++call) {
      CAPTURE(call);
      CHECK(max_rel(outs[1][call], outs[0][call]) < 1e-5);
      CHECK(outs[2][call] == outs[1][call]);
      CHECK(outs[3][call] == outs[1][call]);
    }
  }
}

// Prefill attention in tiles (attention_tiled.comp) against the CPU and against the split kernel
// (REDWING_GPU_ATTENTION_TILES=0) on the same GPU: head_dim 40 (neither a multiple of 4 nor of
// the 32-column slab), 256 and 512 (the tile rows the host picks shrink with it), f32 and f16
// caches, GQA, a sliding window over a ring that wraps, a chunk after earlier ones (pos0 > 0), row
// counts that leave the last tile part empty, and a tile whose first rows see keys its last rows
// do not (and the reverse). A malformed setting is refused.
TEST_CASE("gpu: tiled prefill attention matches the CPU and the split kernel") {
  check_setting_refused("REDWING_GPU_ATTENTION_TILES", {"-1", "x", "16 rows", "1234567"});
  FOR_EACH_WORKGROUP_SHAPE(threads);
  auto cpu = make_cpu_backend(2);
  setenv("REDWING_GPU_ATTENTION_TILES", "1", 1);
  auto tiled = gpu_backend(threads);
  setenv("REDWING_GPU_ATTENTION_TILES", "0", 1);
  auto split = gpu_backend(threads);
  unsetenv("REDWING_GPU_ATTENTION_TILES");
  struct Case {
    int d, kv_heads, heads;
    int64_t capacity;
    bool ring;
    int64_t window;
    KvDType dtype;
    int64_t before, rows;  // positions already stored, then one call of `rows` rows
  };
  for (const Case c : {Case{40, 2, 6, 200, false, 0, KvDType::f32, 0, 150},
                       Case{40, 2, 6, 200, false, 0, KvDType::f16, 37, 100},
                       Case{40, 1, 2, 40, true, 23, KvDType::f32, 61, 17},
                       Case{256, 2, 4, 160, false, 0, KvDType::f16, 70, 90},
                       Case{256, 2, 4, 48, true, 29, KvDType::f32, 50, 19},
                       Case{512, 1, 2, 120, false, 0, KvDType::f32, 40, 70},
                       Case{512, 2, 4, 64, true, 33, KvDType::f16, 80, 31}}) {
    CAPTURE(c.d);
    CAPTURE(c.dtype == KvDType::f16);
    CAPTURE(c.ring);
    CAPTURE(c.rows);
    const int64_t width = c.kv_heads * c.d, q_width = c.heads * c.d;
    const int64_t total = c.before + c.rows;
    const size_t elem = c.dtype == KvDType::f32 ? 4 : 2;
    const auto k = randn(static_cast<size_t>(total * width), 51);
    const auto v = randn(static_cast<size_t>(total * width), 52);
    const auto q = randn(static_cast<size_t>(c.rows * q_width), 53);
    std::vector<float> outs[3];
    int which = 0;
    for (Backend* b : {cpu.get(), tiled.get(), split.get()}) {
      auto kc = b->alloc(static_cast<size_t>(c.capacity * width) * elem);
      auto vc = b->alloc(static_cast<size_t>(c.capacity * width) * elem);
      KvLayerView kv{kc.get(), vc.get(), c.capacity, c.ring, c.window, c.kv_heads, c.d, c.dtype};
      auto kb = put(*b, k), vb = put(*b, v), qb = put(*b, q);
      // The earlier positions one row at a time (a ring keeps only the last of them), then the
      // call's rows, stored before their attention as the layers do.
      for (int64_t p0 = 0; p0 < c.before; ++p0)
        b->kv_store(kv, Mat{kb.get(), p0 * width, 1, width, width},
                    Mat{vb.get(), p0 * width, 1, width, width}, p0);
      b->kv_store(kv, Mat{kb.get(), c.before * width, c.rows, width, width},
                  Mat{vb.get(), c.before * width, c.rows, width, width}, c.before);
      auto ob = b->alloc(q.size() * 4);
      b->attention(Mat{qb.get(), 0, c.rows, q_width, q_width}, kv, c.before, c.heads, 0.125f,
                   Mat{ob.get(), 0, c.rows, q_width, q_width});
      outs[which++] = get(*b, *ob);
    }
    CHECK(max_rel(outs[1], outs[0]) < 1e-5);
    CHECK(max_rel(outs[1], outs[2]) < 1e-5);
  }
}

TEST_CASE("gpu: backend selection") {
  test_support::use_lavapipe();
  const auto all = available_backends();
  REQUIRE(all.size() >= 2);
  CHECK(all[0].name == "cpu");
  CHECK(all.back().name == "vulkan");
  // lavapipe is a software device: auto never picks it; on a Mac auto prefers Metal.
  bool hardware = false;
  bool metal = false;
  for (const auto& b : all) {
    hardware = hardware || (b.name == "vulkan" && b.discrete && !b.software);
    metal = metal || (b.name == "metal" && b.discrete);
  }
  CHECK(resolve_backend("auto") == (metal ? "metal" : hardware ? "vulkan" : "cpu"));
  CHECK_THROWS_AS(make_backend("mystery", 1), std::invalid_argument);
  if (!metal_built()) CHECK_THROWS_AS(make_backend("metal", 1), std::runtime_error);
  auto v = make_backend("vulkan", 1);
  CHECK(v->name() == "vulkan");
}

#else

TEST_CASE("gpu: this build has no Vulkan backend") {
  CHECK_FALSE(vulkan_built());
  CHECK_THROWS(make_backend("vulkan", 1));
}

#endif
