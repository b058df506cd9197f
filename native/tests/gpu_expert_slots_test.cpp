// GPU expert slots (backend.h, "streamed experts"; docs/gpu.md, "Expert streaming on the GPU"):
// the routed experts computed from a few slots, filled as a streaming store would fill them,
// give the same bits as routed_experts on a bank holding every expert, on the decode path (1
// and 3 tokens) and the prefill path (9 tokens), with every expert in a slot at once and in
// waves (fewer slots than the chosen experts). Runs through lavapipe where there is no GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "lavapipe.h"
#if defined(REDWING_HAVE_VULKAN)
#include "backend/gpu/gpu_backend.h"
#endif

using namespace redwing;

#if defined(REDWING_HAVE_VULKAN)

namespace {

std::unique_ptr<Backend> lavapipe_backend() {
  test_support::use_lavapipe();
  REQUIRE_MESSAGE(!gpu::list_vulkan_devices().empty(),
                  "no Vulkan device (install mesa-vulkan-drivers)");
  return make_gpu_backend(gpu::open_vulkan_device(0));
}

// A random 4-bit MLX-quantized matrix with bf16 scales and biases.
struct RandomQuant {
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases;
  HostQuantMatrix m;
  RandomQuant(int64_t rows, int64_t cols, uint64_t seed) {
    std::mt19937_64 rng(seed);
    packed.resize(static_cast<size_t>(rows * cols * 4 / 32));
    for (auto& w : packed) w = static_cast<uint32_t>(rng());
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (int64_t i = 0; i < rows * (cols / 32); ++i) {
      scales.push_back(cpu::f32_to_bf16(std::abs(d(rng)) + 1e-3f));
      biases.push_back(cpu::f32_to_bf16(d(rng) * 4.0f));
    }
    m.packed = packed.data();
    m.scales = scales.data();
    m.biases = biases.data();
    m.scale_dtype = DType::bf16;
    m.bits = 4;
    m.group_size = 32;
    m.rows = rows;
    m.cols = cols;
  }
};

std::vector<float> download_all(Backend& b, const Buffer& buf, size_t floats) {
  std::vector<float> v(floats);
  b.download(buf, 0, v.data(), floats * sizeof(float));
  return v;
}

}  // namespace

TEST_CASE("gpu expert slots: the same bits as every expert resident, at once and in waves") {
  auto gpu = lavapipe_backend();
  REQUIRE(gpu->supports_expert_slots());
  CHECK_FALSE(make_cpu_backend(1)->supports_expert_slots());
  const int experts = 7, top_k = 3;
  const int64_t hidden = 64, inter = 96;
  std::vector<RandomQuant> host;  // gate, up, down per expert
  for (int e = 0; e < experts; ++e) {
    host.emplace_back(inter, hidden, 100 + 3 * e);
    host.emplace_back(inter, hidden, 101 + 3 * e);
    host.emplace_back(hidden, inter, 102 + 3 * e);
  }
  auto mat = [&](int e, int part) -> const HostQuantMatrix& {
    return host[static_cast<size_t>(3 * e + part)].m;
  };
  std::vector<HostQuantMatrix> gate, up, down;
  for (int e = 0; e < experts; ++e) {
    gate.push_back(mat(e, 0));
    up.push_back(mat(e, 1));
    down.push_back(mat(e, 2));
  }
  auto bank = gpu->import_experts(gate, up, down);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> pes(experts);
  for (float& v : pes) v = d(rng);
  auto pes_buf = gpu->alloc(pes.size() * 4);
  gpu->upload(*pes_buf, 0, pes.data(), pes.size() * 4);
  // One routed layer of t random tokens: x, its routes (on the GPU and on the host, with the
  // distinct experts ascending) and the sum of every expert resident (want).
  struct RoutedLayer {
    std::vector<float> x;
    std::unique_ptr<Buffer> xb, routes, want;
    Mat xm;
    std::vector<int32_t> ids, distinct;
    std::vector<float> weights;
  };
  auto routed_layer = [&](int64_t t) {
    RoutedLayer r;
    const size_t count = static_cast<size_t>(t * top_k);
    std::vector<float> logits(static_cast<size_t>(t * experts));
    r.x.resize(static_cast<size_t>(t * hidden));
    for (float& v : logits) v = d(rng);
    for (float& v : r.x) v = d(rng);
    auto lb = gpu->alloc(logits.size() * 4);
    r.xb = gpu->alloc(r.x.size() * 4);
    gpu->upload(*lb, 0, logits.data(), logits.size() * 4);
    gpu->upload(*r.xb, 0, r.x.data(), r.x.size() * 4);
    r.routes = gpu->alloc(route_buffer_bytes(count));
    gpu->route_to(Mat{lb.get(), 0, t, experts, experts}, top_k, *pes_buf, *r.routes);
    r.xm = Mat{r.xb.get(), 0, t, hidden, hidden};
    r.want = gpu->alloc(r.x.size() * 4);
    gpu->routed_experts(*bank, r.xm, *r.routes, top_k, Mat{r.want.get(), 0, t, hidden, hidden});
    r.ids.resize(count);
    r.weights.resize(count);
    gpu->download(*r.routes, 0, r.ids.data(), count * 4);
    gpu->download(*r.routes, route_weights_offset(count), r.weights.data(), count * 4);
    r.distinct = r.ids;
    std::sort(r.distinct.begin(), r.distinct.end());
    r.distinct.erase(std::unique(r.distinct.begin(), r.distinct.end()), r.distinct.end());
    return r;
  };

  for (int64_t t : {1, 3, 9}) {       // decode path (<= 4 tokens), prefill path
    for (int slots : {1, 2, 4, 7}) {  // waves below the chosen experts' count
      CAPTURE(t);
      CAPTURE(slots);
      const size_t count = static_cast<size_t>(t * top_k);
      const RoutedLayer layer = routed_layer(t);
      const auto& [x, xb, route_buf, want_buf, xm, ids, distinct, weights] = layer;
      const Buffer& routes = *route_buf;
      const Buffer& want = *want_buf;
      auto got = gpu->alloc(x.size() * 4);

      // As the model does: the slots start holding experts that are not chosen (stale), each
      // chosen expert goes to slot k % slots, and a slot about to be refilled first has the
      // products of the experts already in it recorded.
      auto slot_bank = gpu->create_expert_slots(mat(0, 0), mat(0, 1), mat(0, 2), slots);
      for (int s = 0; s < slots; ++s) {
        const int stale = (s + 3) % experts;
        gpu->fill_expert_slot(*slot_bank, s, stale, mat(stale, 0), mat(stale, 1), mat(stale, 2));
        CHECK(gpu->slot_holds(*slot_bank, s, stale));
      }
      std::vector<int32_t> pending(count, -1);
      int fills = 0;
      for (size_t k = 0; k < distinct.size(); ++k) {
        const int s = static_cast<int>(k % static_cast<size_t>(slots));
        const int e = distinct[k];
        if (!gpu->slot_holds(*slot_bank, s, e)) {
          if (std::find(pending.begin(), pending.end(), s) != pending.end()) {
            gpu->slot_expert_products(*slot_bank, xm, ids, pending, top_k);
            std::fill(pending.begin(), pending.end(), -1);
          }
          gpu->fill_expert_slot(*slot_bank, s, e, mat(e, 0), mat(e, 1), mat(e, 2));
          ++fills;
        }
        for (size_t j = 0; j < count; ++j)
          if (ids[j] == e) pending[j] = s;
      }
      gpu->slot_expert_products(*slot_bank, xm, ids, pending, top_k);
      gpu->combine_slot_products(routes, ids, weights, top_k, Mat{got.get(), 0, t, hidden, hidden});
      CHECK(fills > 0);
      CHECK(download_all(*gpu, *got, x.size()) == download_all(*gpu, want, x.size()));
    }
  }

  // Hybrid experts: the experts in the slots on the GPU, the others on the CPU backend, their
  // products handed to host_expert_products; the combine adds them all. The CPU sums its products
  // in another order, so the result is close to (not the bits of) every expert resident.
  auto cpu = make_cpu_backend(2);
  for (int64_t t : {1, 3, 9}) {
    for (int on_gpu : {0, 2}) {  // distinct experts held by GPU slots; the rest on the host
      CAPTURE(t);
      CAPTURE(on_gpu);
      const size_t count = static_cast<size_t>(t * top_k);
      const RoutedLayer layer = routed_layer(t);
      const auto& [x, xb, route_buf, want_buf, xm, ids, distinct, weights] = layer;
      const Buffer& routes = *route_buf;
      const Buffer& want = *want_buf;
      auto got = gpu->alloc(x.size() * 4);

      auto slot_bank = gpu->create_expert_slots(mat(0, 0), mat(0, 1), mat(0, 2), 2);
      std::vector<int32_t> entry_slot(count, -1), host_entries;
      std::vector<float> host_products;
      auto x_host = cpu->alloc(x.size() * 4);
      cpu->upload(*x_host, 0, x.data(), x.size() * 4);
      for (size_t k = 0; k < distinct.size(); ++k) {
        const int e = distinct[k];
        if (static_cast<int>(k) < on_gpu) {
          const int s = static_cast<int>(k);
          gpu->fill_expert_slot(*slot_bank, s, e, mat(e, 0), mat(e, 1), mat(e, 2));
          for (size_t j = 0; j < count; ++j)
            if (ids[j] == e) entry_slot[j] = s;
          continue;
        }
        std::vector<int32_t> rows;
        for (size_t j = 0; j < count; ++j)
          if (ids[j] == e) {
            host_entries.push_back(static_cast<int32_t>(j));
            rows.push_back(static_cast<int32_t>(j / top_k));
          }
        const auto n = static_cast<int64_t>(rows.size());
        auto in = cpu->alloc(static_cast<size_t>(n * hidden) * 4);
        auto g = cpu->alloc(static_cast<size_t>(n * inter) * 4);
        auto u = cpu->alloc(static_cast<size_t>(n * inter) * 4);
        auto y = cpu->alloc(static_cast<size_t>(n * hidden) * 4);
        const Mat inm{in.get(), 0, n, hidden, hidden}, gm{g.get(), 0, n, inter, inter},
            um{u.get(), 0, n, inter, inter}, ym{y.get(), 0, n, hidden, hidden};
        cpu->gather_rows(Mat{x_host.get(), 0, t, hidden, hidden}, rows, inm);
        auto wg = cpu->import_qweight(mat(e, 0)), wu = cpu->import_qweight(mat(e, 1)),
             wd = cpu->import_qweight(mat(e, 2));
        cpu->qmatmul(*wg, inm, gm);
        cpu->qmatmul(*wu, inm, um);
        cpu->gelu_tanh_mul(gm, um, gm);
        cpu->qmatmul(*wd, gm, ym);
        const auto y_host = download_all(*cpu, *y, static_cast<size_t>(n * hidden));
        host_products.insert(host_products.end(), y_host.begin(), y_host.end());
      }
      if (on_gpu > 0) gpu->slot_expert_products(*slot_bank, xm, ids, entry_slot, top_k);
      REQUIRE(!host_entries.empty());
      gpu->host_expert_products(*slot_bank, xm, ids, host_entries, host_products, top_k);
      gpu->combine_slot_products(routes, ids, weights, top_k, Mat{got.get(), 0, t, hidden, hidden});
      const auto g_all = download_all(*gpu, *got, x.size());
      const auto w_all = download_all(*gpu, want, x.size());
      float scale = 0, diff = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        scale = std::max(scale, std::abs(w_all[i]));
        diff = std::max(diff, std::abs(g_all[i] - w_all[i]));
      }
      CHECK(scale > 0);
      CHECK(diff <= 1e-5f * scale);
    }
  }
  CHECK_THROWS_AS(
      gpu->host_expert_products(*gpu->create_expert_slots(mat(0, 0), mat(0, 1), mat(0, 2), 1),
                                Mat{nullptr, 0, 1, hidden, hidden}, std::vector<int32_t>(top_k, 0),
                                std::vector<int32_t>{5}, std::vector<float>(hidden), top_k),
      std::logic_error);

  // Bad input is refused: a slot outside the bank, other shapes, a bank of another backend.
  auto slot_bank = gpu->create_expert_slots(mat(0, 0), mat(0, 1), mat(0, 2), 2);
  CHECK_THROWS_AS(gpu->fill_expert_slot(*slot_bank, 2, 0, mat(0, 0), mat(0, 1), mat(0, 2)),
                  std::logic_error);
  CHECK_THROWS_AS(gpu->fill_expert_slot(*slot_bank, 0, 0, mat(0, 2), mat(0, 1), mat(0, 0)),
                  std::logic_error);
  CHECK_FALSE(gpu->slot_holds(*slot_bank, 0, 0));
  CHECK_THROWS_AS(gpu->slot_holds(*bank, 0, 0), std::logic_error);
  CHECK_THROWS_AS(gpu->create_expert_slots(mat(0, 0), mat(0, 1), mat(0, 2), 0), std::logic_error);
}

#endif
