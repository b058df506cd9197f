// redwing-bench-gpu-ops: what one decode op costs on a GPU, alone, at Gemma 4 26B-A4B shapes.
//
// A decode token on the GPU is a chain of ~200 dependent dispatches (docs/gpu.md), and whole-
// model runs say only how long the chain takes. This tool records the same op `--repeat` times
// in a row, twice:
//   - dependent: every repeat writes the same output, so the backend puts a barrier between
//     them (each waits for the previous one to drain, as the steps of a token do);
//   - independent: every repeat writes an output of its own, so there is no barrier and the GPU
//     may overlap them (what the op costs when its latency is hidden).
// Each case is timed on the host from the first recorded dispatch to the wait for the last
// (recording overlaps the GPU: work goes out every 64 dispatches), in `--rounds` rounds; the
// median per repeat is printed. "dependent - independent" is about what the op adds to a chain
// beyond its own work: launch, drain and the latency no other work hides. The smallest op (a
// scale of 64 floats) gives the floor of a dependent step on this device and driver.
//
//   redwing-bench-gpu-ops [--backend vulkan] [--repeat 200] [--rounds 5] [--only NAME,...]
//
// Prints JSON on stdout (bench/gpu-ops.ts formats it) and progress on stderr. Weights are
// random 4-bit (the router 8-bit) MLX-quantized matrices, group 64, bf16 scales.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_select.h"
#include "backend/cpu/kernels.h"
#include "bench_median.h"
#include "format/host_tensor.h"
#include "platform/file.h"

using namespace redwing;

namespace {

using Clock = std::chrono::steady_clock;

using bench::median;

// A random MLX-quantized matrix in host memory (the backend reads it at import).
struct HostQuant {
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases;
  HostQuantMatrix m;
  HostQuant(int64_t rows, int64_t cols, int bits, uint64_t seed) {
    std::mt19937_64 rng(seed);
    packed.resize(static_cast<size_t>(rows * cols * bits / 32));
    for (auto& w : packed) w = static_cast<uint32_t>(rng());
    const size_t groups = static_cast<size_t>(rows * (cols / 64));
    std::uniform_real_distribution<float> s(0.001f, 0.01f), b(-0.05f, 0.05f);
    for (size_t i = 0; i < groups; ++i) {
      scales.push_back(cpu::f32_to_bf16(s(rng)));
      biases.push_back(cpu::f32_to_bf16(b(rng)));
    }
    m = {packed.data(), scales.data(), biases.data(), DType::bf16, bits, 64, rows, cols};
  }
};

std::unique_ptr<Buffer> random_buffer(Backend& b, size_t floats, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(floats);
  for (float& x : v) x = d(rng);
  auto buf = b.alloc(floats * 4);
  b.upload(*buf, 0, v.data(), floats * 4);
  return buf;
}

// Host memory the device may read in place; the mapping goes before the memory it maps.
struct MappedBlock {
  platform::AlignedBytes block;
  std::unique_ptr<Backend::HostMapping> mapping;
};

// One benchmark case: record(i) records one repeat writing output `i` (independent) or output
// 0 every time (dependent); outputs() says how many distinct outputs it has room for.
struct Case {
  std::string name;
  std::string what;
  double weight_bytes = 0;  // weight bytes one repeat reads (0 for ops without weights)
  std::function<void(size_t output)> record;
  std::function<void()> wait;  // waits for everything recorded so far
};

struct Options {
  std::string backend = "vulkan";
  int repeat = 200;
  int rounds = 5;
  std::vector<std::string> only;
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--backend") {
      o.backend = value();
    } else if (a == "--repeat") {
      o.repeat = std::stoi(value());
    } else if (a == "--rounds") {
      o.rounds = std::stoi(value());
    } else if (a == "--only") {
      const std::string list = value();
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        if (q > p) o.only.push_back(list.substr(p, q - p));
        p = q + 1;
      }
    } else {
      throw std::invalid_argument("unknown option " + a +
                                  " (--backend, --repeat, --rounds, --only)");
    }
  }
  if (o.repeat < 1 || o.rounds < 1)
    throw std::invalid_argument("--repeat and --rounds must be >= 1");
  return o;
}

constexpr int64_t kHidden = 2816;
// 32 experts, not the model's 128: a token reads 8 either way, and 32 keep the stacked gate/up
// weights inside lavapipe's 128 MiB binding limit (more would take the host-grouped path).
constexpr int64_t kExperts = 32, kTopK = 8, kExpertInter = 704;
constexpr int kQHeads = 16, kKvHeads = 8, kHeadDim = 256;

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse_args(argc, argv);
  auto backend = make_backend(opt.backend, 0);
  Backend& b = *backend;
  const auto outputs = static_cast<size_t>(opt.repeat);
  std::fprintf(stderr, "redwing-bench-gpu-ops: %s\n", b.describe().c_str());

  // Everything the cases use stays alive until the end.
  std::vector<std::unique_ptr<HostQuant>> hosts;
  std::vector<std::unique_ptr<QWeight>> weights;
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<std::unique_ptr<ExpertBank>> banks;
  auto keep = [&](std::unique_ptr<Buffer> buf) {
    buffers.push_back(std::move(buf));
    return buffers.back().get();
  };
  // `count` output buffers of `floats` each: the backend tracks hazards per buffer, so
  // repeats that write different buffers need no barrier between them.
  auto outputs_of = [&](size_t floats, size_t count) {
    std::vector<Buffer*> outs;
    for (size_t i = 0; i < count; ++i) outs.push_back(keep(b.alloc(floats * 4)));
    return outs;
  };
  std::vector<Case> cases;
  auto wanted = [&](const std::string& name) {
    return opt.only.empty() || std::find(opt.only.begin(), opt.only.end(), name) != opt.only.end();
  };

  // The floor: an elementwise op on 64 floats.
  if (wanted("scale64")) {
    const auto outs = outputs_of(64, outputs);
    for (Buffer* o : outs) b.fill_zero(Mat{o, 0, 1, 64, 64});
    cases.push_back({"scale64", "x *= 1 on 64 floats (the floor of a dispatch)", 0,
                     [&b, outs](size_t i) {
                       b.scale(Mat{outs[i], 0, 1, 64, 64}, 1.0f);
                     },
                     [&b, outs] {
                       float f;
                       b.download(*outs[0], 0, &f, 4);
                     }});
  }
  if (wanted("rms_norm")) {
    Buffer* x = keep(random_buffer(b, kHidden, 2));
    const auto outs = outputs_of(kHidden, outputs);
    cases.push_back({"rms_norm", "RMSNorm of one 2,816-wide row", 0,
                     [&b, x, outs](size_t i) {
                       b.rms_norm(Mat{x, 0, 1, kHidden, kHidden}, nullptr, 0.0f, 1e-6f,
                                  Mat{outs[i], 0, 1, kHidden, kHidden});
                     },
                     [&b, outs] {
                       float f;
                       b.download(*outs[0], 0, &f, 4);
                     }});
  }

  // Decode products (one token): rows x cols, bits.
  struct Shape {
    const char* name;
    const char* what;
    int64_t rows, cols;
    int bits;
  };
  const Shape shapes[] = {
      {"router", "router 128 x 2,816, 8-bit", 128, kHidden, 8},
      {"rows512", "512 x 2,816", 512, kHidden, 4},
      {"kv", "k or v 2,048 x 2,816", 2048, kHidden, 4},
      {"q", "q 4,096 x 2,816", 4096, kHidden, 4},
      {"o", "o 2,816 x 4,096", kHidden, 4096, 4},
      {"dense_gate_up", "dense gate and up 4,224 x 2,816", 4224, kHidden, 4},
      {"dense_down", "dense down 2,816 x 2,112", kHidden, 2112, 4},
      {"rows16k", "16,384 x 2,816", 16384, kHidden, 4},
      {"head", "output head 262,144 x 2,816", 262144, kHidden, 4},
  };
  uint64_t seed = 10;
  for (const Shape& s : shapes) {
    if (!wanted(s.name)) continue;
    hosts.push_back(std::make_unique<HostQuant>(s.rows, s.cols, s.bits, seed++));
    weights.push_back(b.import_qweight(hosts.back()->m));
    const QWeight* w = weights.back().get();
    Buffer* x = keep(random_buffer(b, static_cast<size_t>(s.cols), seed++));
    // The head's outputs are 1 MB each: independent repeats cycle through 8 of them (a
    // repeat of this size is far longer than a barrier anyway).
    const size_t n_out = s.rows >= 65536 ? 8 : outputs;
    const auto ys = outputs_of(static_cast<size_t>(s.rows), n_out);
    const double bytes = static_cast<double>(s.rows) * s.cols * s.bits / 8 +
                         static_cast<double>(s.rows) * (s.cols / 64) * 4;
    const int64_t rows = s.rows, cols = s.cols;
    cases.push_back(
        {s.name, s.what, bytes,
         [&b, w, x, ys, rows, cols](size_t i) {
           b.qmatmul(*w, Mat{x, 0, 1, cols, cols}, Mat{ys[i % ys.size()], 0, 1, rows, rows});
         },
         [&b, ys] {
           float f;
           b.download(*ys[0], 0, &f, 4);
         }});
  }

  // Products whose last workgroup goes on: attention's output product with the residual add and
  // the feed-forward's two norms after it (qmatvec_norms.comp), and the router with its routing
  // (router.comp): a MoE layer's decode runs these instead of the plain "o" and "router".
  if (wanted("o_norms")) {
    hosts.push_back(std::make_unique<HostQuant>(kHidden, 4096, 4, seed++));
    weights.push_back(b.import_qweight(hosts.back()->m));
    const QWeight* w = weights.back().get();
    Buffer* x = keep(random_buffer(b, 4096, seed++));
    Buffer* norm_w = keep(random_buffer(b, kHidden, seed++));
    const auto accs = outputs_of(kHidden, outputs), ys = outputs_of(kHidden, outputs),
               y1s = outputs_of(kHidden, outputs), y2s = outputs_of(kHidden, outputs);
    for (Buffer* a : accs) b.fill_zero(Mat{a, 0, 1, kHidden, kHidden});
    const double bytes = static_cast<double>(kHidden) * 4096 / 2 + kHidden * (4096 / 64) * 4.0;
    cases.push_back({"o_norms", "o 2,816 x 4,096 with the residual add and the two norms after it",
                     bytes,
                     [&b, w, x, norm_w, accs, ys, y1s, y2s](size_t i) {
                       auto row = [](Buffer* buf) { return Mat{buf, 0, 1, kHidden, kHidden}; };
                       b.qmatmul_add_rms_norm_pair(*w, Mat{x, 0, 1, 4096, 4096}, row(ys[i]), norm_w,
                                                   1.0f, 1e-6f, row(accs[i]), 1.0f, norm_w, norm_w,
                                                   row(y1s[i]), row(y2s[i]));
                     },
                     [&b, y1s] {
                       float f;
                       b.download(*y1s[0], 0, &f, 4);
                     }});
  }
  if (wanted("router_route")) {
    constexpr int64_t kRouterExperts = 128;  // the 26B-A4B's
    hosts.push_back(std::make_unique<HostQuant>(kRouterExperts, kHidden, 8, seed++));
    weights.push_back(b.import_qweight(hosts.back()->m));
    const QWeight* w = weights.back().get();
    Buffer* x = keep(random_buffer(b, kHidden, seed++));
    Buffer* norm_w = keep(random_buffer(b, kHidden, seed++));
    Buffer* expert_scale = keep(random_buffer(b, kRouterExperts, seed++));
    const auto normed = outputs_of(kHidden, outputs), logits = outputs_of(kRouterExperts, outputs);
    std::vector<Buffer*> routes;
    for (size_t i = 0; i < outputs; ++i)
      routes.push_back(keep(b.alloc(route_weights_offset(kTopK) + kTopK * 4)));
    const double bytes =
        static_cast<double>(kRouterExperts) * kHidden + kRouterExperts * (kHidden / 64) * 4.0;
    cases.push_back(
        {"router_route", "router 128 x 2,816, 8-bit, with its norm and routing", bytes,
         [&b, w, x, norm_w, expert_scale, normed, logits, routes](size_t i) {
           Backend::InputNorm norm;  // the router's: weightless, times a vector and scalar
           norm.weight = norm_w;
           norm.eps = 1e-6f;
           norm.mul_cols = 0.0625f;
           const Mat in{normed[i], 0, 1, kHidden, kHidden};
           const Backend::QProduct router{w, in,
                                          Mat{logits[i], 0, 1, kRouterExperts, kRouterExperts}};
           b.route_product_to(Mat{x, 0, 1, kHidden, kHidden}, norm, in, router, kTopK,
                              *expert_scale, *routes[i]);
         },
         [&b, routes] {
           int32_t id;
           b.download(*routes[0], 0, &id, 4);
         }});
  }

  // The routed experts of one token: 8 of 128, gate/up then down, one dispatch each, then their
  // sum (experts) or the feed-forward's end with the next layer's input norm (experts_tail:
  // ffn_tail.comp summing the routed slots' rows; the difference is the tail's cost).
  if (wanted("experts") || wanted("experts_tail") || wanted("experts_qkv")) {
    std::vector<HostQuantMatrix> gate, up, down;
    for (int e = 0; e < kExperts; ++e) {
      hosts.push_back(std::make_unique<HostQuant>(kExpertInter, kHidden, 4, seed++));
      gate.push_back(hosts.back()->m);
      hosts.push_back(std::make_unique<HostQuant>(kExpertInter, kHidden, 4, seed++));
      up.push_back(hosts.back()->m);
      hosts.push_back(std::make_unique<HostQuant>(kHidden, kExpertInter, 4, seed++));
      down.push_back(hosts.back()->m);
    }
    banks.push_back(b.import_experts(gate, up, down));
    const ExpertBank* bank = banks.back().get();
    std::vector<std::byte> route(route_weights_offset(kTopK) + kTopK * 4);
    for (int j = 0; j < kTopK; ++j) {
      const int32_t id = 1 + 4 * j;
      const float wgt = 1.0f / kTopK;
      std::memcpy(route.data() + 4 * j, &id, 4);
      std::memcpy(route.data() + route_weights_offset(kTopK) + 4 * j, &wgt, 4);
    }
    Buffer* routes = keep(b.alloc(route.size()));
    b.upload(*routes, 0, route.data(), route.size());
    Buffer* x = keep(random_buffer(b, kHidden, seed++));
    const auto outs = outputs_of(kHidden, outputs);
    const double bytes = 3.0 * kTopK * (kExpertInter * kHidden / 2 + kExpertInter * kHidden / 16);
    if (wanted("experts"))
      cases.push_back({"experts", "8 routed experts, 704 x 2,816 (gate/up, down, combine)", bytes,
                       [&b, bank, x, routes, outs](size_t i) {
                         b.routed_experts(*bank, Mat{x, 0, 1, kHidden, kHidden}, *routes, kTopK,
                                          Mat{outs[i], 0, 1, kHidden, kHidden});
                       },
                       [&b, outs] {
                         float f;
                         b.download(*outs[0], 0, &f, 4);
                       }});
    const auto row = [](Buffer* buf, int64_t cols = kHidden) { return Mat{buf, 0, 1, cols, cols}; };
    // A feed-forward end of its own: the dense MLP's output m, the residual, the next layer's
    // input (tail.next) and the four norms' weights.
    const auto random_tail = [&] {
      Buffer* m = keep(random_buffer(b, kHidden, seed++));
      Buffer* res = keep(random_buffer(b, kHidden, seed++));
      Buffer* next = keep(random_buffer(b, kHidden, seed++));
      std::vector<Buffer*> norms;
      for (int n = 0; n < 4; ++n) norms.push_back(keep(random_buffer(b, kHidden, seed++)));
      return Backend::FfnTail{row(m), norms[0], norms[1], norms[2], 1.0f,
                              1e-6f,  row(res), 1.0f,     norms[3], row(next)};
    };
    if (wanted("experts_tail")) {
      const Backend::FfnTail tail = random_tail();
      Buffer* next = tail.next.buf;
      cases.push_back({"experts_tail",
                       "8 routed experts, 704 x 2,816, then the feed-forward's end (ffn_tail)",
                       bytes,
                       [&b, bank, x, routes, outs, tail](size_t i) {
                         b.routed_experts_tail(*bank, Mat{x, 0, 1, kHidden, kHidden}, *routes,
                                               kTopK, Mat{outs[i], 0, 1, kHidden, kHidden}, tail);
                       },
                       [&b, next] {
                         float f;
                         b.download(*next, 0, &f, 4);
                       }});
    }
    if (wanted("experts_qkv")) {
      // experts_tail followed by the next layer's q, k and v products of its h: the tail is its
      // own dispatch, or inside the products with REDWING_GPU_FFN_TAIL=next (one step fewer).
      const Backend::FfnTail tail = random_tail();
      Buffer* next = tail.next.buf;
      std::vector<Backend::QProduct> qkv;
      double qkv_bytes = 0;
      for (const int64_t rows : {int64_t{4096}, int64_t{2048}, int64_t{2048}}) {
        hosts.push_back(std::make_unique<HostQuant>(rows, kHidden, 4, seed++));
        weights.push_back(b.import_qweight(hosts.back()->m));
        qkv.push_back({weights.back().get(), row(next), row(keep(b.alloc(rows * 4)), rows)});
        qkv_bytes += static_cast<double>(rows) * kHidden / 2 + rows * (kHidden / 64) * 4.0;
      }
      cases.push_back({"experts_qkv",
                       "experts_tail, then q, k and v (4,096, 2,048, 2,048 x 2,816) of its h",
                       bytes + qkv_bytes,
                       [&b, bank, x, routes, outs, tail, qkv](size_t i) {
                         b.routed_experts_tail(*bank, Mat{x, 0, 1, kHidden, kHidden}, *routes,
                                               kTopK, Mat{outs[i], 0, 1, kHidden, kHidden}, tail);
                         b.qmatmul_batch(qkv);
                       },
                       [&b, qkv] {
                         float f;
                         b.download(*qkv[0].y.buf, 0, &f, 4);
                       }});
    }
  }

  // One expert copied into a GPU slot from host memory (streamed experts, issue 13): from a
  // block the device reads in place (Backend::map_host_memory, as the RAM tier's host slots are
  // when the backend can) and through the staging arena. Every fill writes the same slot buffers,
  // so the repeats are a chain either way; weight_bytes over the time is the copy rate.
  for (const bool mapped : {true, false}) {
    const char* name = mapped ? "expert_copy" : "expert_copy_staged";
    if (!wanted(name)) continue;
    // gate, up and down of one expert, laid out as an expert file's slot: packed, scales, biases.
    const int64_t gate_words = kExpertInter * kHidden / 8, down_words = kHidden * kExpertInter / 8;
    const int64_t gate_groups = kExpertInter * (kHidden / 64),
                  down_groups = kHidden * (kExpertInter / 64);
    const size_t bytes = static_cast<size_t>(2 * gate_words + down_words) * 4 +
                         static_cast<size_t>(2 * gate_groups + down_groups) * 2 * 2;
    const size_t block_bytes = (bytes + 4095) / 4096 * 4096;
    auto host = std::make_shared<MappedBlock>();
    host->block = platform::allocate_aligned(block_bytes, 4096);
    std::mt19937_64 rng(seed++);
    std::byte* p = host->block.get();
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t r = rng() & 0x3f3f3f3f3f3f3f3fULL;  // bf16 scales stay finite
      std::memcpy(p + i, &r, 8);
    }
    auto matrix = [&](int64_t rows, int64_t cols, std::byte*& at) {
      HostQuantMatrix m{};
      m.packed = reinterpret_cast<const uint32_t*>(at);
      at += rows * cols / 8 * 4;
      m.scales = at;
      at += rows * (cols / 64) * 2;
      m.biases = at;
      at += rows * (cols / 64) * 2;
      m.scale_dtype = DType::bf16;
      m.bits = 4;
      m.group_size = 64;
      m.rows = rows;
      m.cols = cols;
      return m;
    };
    std::byte* at = p;
    const HostQuantMatrix gate = matrix(kExpertInter, kHidden, at);
    const HostQuantMatrix up = matrix(kExpertInter, kHidden, at);
    const HostQuantMatrix down = matrix(kHidden, kExpertInter, at);
    if (mapped) {
      host->mapping = b.map_host_memory(std::span<const std::byte>(p, block_bytes));
      if (!host->mapping) {
        std::fprintf(stderr, "  %-14s skipped: the backend cannot read host memory in place\n",
                     name);
        continue;
      }
    }
    Buffer* probe = keep(b.alloc(4));
    banks.push_back(b.create_expert_slots(gate, up, down, 8));
    if (!banks.back()) throw std::invalid_argument(std::string(name) + ": no expert slots here");
    ExpertBank* bank = banks.back().get();
    cases.push_back({name,
                     mapped ? "one expert (3.4 MB) into a GPU slot, read in place"
                            : "one expert (3.4 MB) into a GPU slot, through the staging arena",
                     static_cast<double>(bytes),
                     [&b, bank, gate, up, down, host](size_t i) {
                       b.fill_expert_slot(*bank, static_cast<int>(i % 8), static_cast<int32_t>(i),
                                          gate, up, down);
                     },
                     [&b, probe] {
                       float f;
                       b.download(*probe, 0, &f, 4);  // waits for every copy recorded before
                     }});
  }

  // Decode attention of one token: a sliding layer's shape (16 heads of 256 over 8 KV heads)
  // over 512, 1,024 (its window) or 4,096 keys, and a full-attention layer's (16 heads of 512
  // over 2 KV heads) over 512 and 4,096; f16 caches. A case repeats one layer's attention, whose
  // keys and values then stay in the GPU's L2 cache; the _cold cases take the next of 16 copies
  // of the caches at each repeat (64 MB and more in all), so that they come from device memory
  // as in a decode step, where a token's weights pass between two reads of a layer's cache.
  struct AttentionCase {
    const char* name;
    int kv_heads, head_dim;
    int64_t keys;
    int copies;
  };
  for (const AttentionCase a : {AttentionCase{"attention512", kKvHeads, kHeadDim, 512, 1},
                                {"attention512_cold", kKvHeads, kHeadDim, 512, 16},
                                {"attention1024", kKvHeads, kHeadDim, 1024, 1},
                                {"attention4096", kKvHeads, kHeadDim, 4096, 1},
                                {"global512", 2, 512, 512, 1},
                                {"global512_cold", 2, 512, 512, 16},
                                {"global4096", 2, 512, 4096, 1}}) {
    const std::string name = a.name;
    if (!wanted(name)) continue;
    const int64_t capacity = std::max<int64_t>(1024, a.keys), pos = a.keys - 1;
    const size_t cache = static_cast<size_t>(capacity) * a.kv_heads * a.head_dim / 2;  // f16 pairs
    std::vector<KvLayerView> kvs;
    for (int c = 0; c < a.copies; ++c) {
      Buffer* k = keep(random_buffer(b, cache, seed++));
      Buffer* v = keep(random_buffer(b, cache, seed++));
      kvs.push_back({k, v, capacity, false, 0, a.kv_heads, a.head_dim, KvDType::f16});
    }
    const int64_t width = static_cast<int64_t>(kQHeads) * a.head_dim;
    Buffer* q = keep(random_buffer(b, static_cast<size_t>(width), seed++));
    const auto outs = outputs_of(static_cast<size_t>(width), outputs);
    cases.push_back(
        {name,
         "decode attention, " + std::to_string(kQHeads) + " heads of " +
             std::to_string(a.head_dim) + " over " + std::to_string(a.kv_heads) + " KV heads, " +
             std::to_string(a.keys) + " keys (f16" +
             (a.copies > 1 ? ", " + std::to_string(a.copies) + " copies" : std::string()) + ")",
         0,
         [&b, kvs, q, outs, width, pos](size_t i) {
           b.attention(Mat{q, 0, 1, width, width}, kvs[i % kvs.size()], pos, kQHeads, 1.0f,
                       Mat{outs[i], 0, 1, width, width});
         },
         [&b, outs] {
           float f;
           b.download(*outs[0], 0, &f, 4);
         }});
  }

  if (cases.empty()) throw std::invalid_argument("--only names no case");
  std::printf("{\"backend\":\"%s\",\"device\":\"%s\",\"repeat\":%d,\"rounds\":%d,\"cases\":[",
              b.name().c_str(), b.describe().c_str(), opt.repeat, opt.rounds);
  bool first = true;
  for (Case& c : cases) {
    // µs per repeat, for one round of the chain: `dependent` writes output 0 every time.
    auto run_chain = [&](bool dependent) {
      const auto before = b.work_counters();
      const auto t0 = Clock::now();
      for (int r = 0; r < opt.repeat; ++r) c.record(dependent ? 0 : static_cast<size_t>(r));
      b.submit();
      c.wait();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      const auto after = b.work_counters();
      struct {
        double us_per_repeat, barriers_per_repeat, dispatches_per_repeat, record_us_per_repeat;
      } r{us / opt.repeat, static_cast<double>(after.barriers - before.barriers) / opt.repeat,
          static_cast<double>(after.dispatches - before.dispatches) / opt.repeat,
          (after.record_ms - before.record_ms) * 1000.0 / opt.repeat};
      return r;
    };
    run_chain(true);  // warm-up: pipelines built, clocks up
    run_chain(false);
    std::vector<double> dep, ind;
    decltype(run_chain(true)) last_dep{}, last_ind{};
    for (int round = 0; round < opt.rounds; ++round) {
      // Alternate which goes first, so that a clock change hits both alike.
      if (round % 2 == 0) {
        last_dep = run_chain(true);
        last_ind = run_chain(false);
      } else {
        last_ind = run_chain(false);
        last_dep = run_chain(true);
      }
      dep.push_back(last_dep.us_per_repeat);
      ind.push_back(last_ind.us_per_repeat);
    }
    const double dep_us = median(dep), ind_us = median(ind);
    std::fprintf(stderr, "  %-14s dependent %8.2f us  independent %8.2f us  (%s)\n", c.name.c_str(),
                 dep_us, ind_us, c.what.c_str());
    std::printf(
        "%s{\"name\":\"%s\",\"what\":\"%s\",\"weight_bytes\":%.0f,\"dependent_us\":%.3f,"
        "\"independent_us\":%.3f,\"dependent_gbps\":%.2f,\"independent_gbps\":%.2f,"
        "\"dispatches\":%.2f,\"barriers_dependent\":%.2f,\"barriers_independent\":%.2f,"
        "\"record_us\":%.3f}",
        first ? "" : ",", c.name.c_str(), c.what.c_str(), c.weight_bytes, dep_us, ind_us,
        c.weight_bytes / dep_us / 1e3, c.weight_bytes / ind_us / 1e3,
        last_dep.dispatches_per_repeat, last_dep.barriers_per_repeat, last_ind.barriers_per_repeat,
        last_dep.record_us_per_repeat);
    first = false;
  }
  std::printf("]}\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "redwing-bench-gpu-ops: %s\n", e.what());
  return 1;
}
