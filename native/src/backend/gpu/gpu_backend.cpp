// The GPU backend over the device layer (device.h). Nothing here is specific to one GPU API.
//
// Ops are recorded, not run: the device batches them into one submission until the host needs
// data (download, route) or the device's per-batch resources fill up. A decode step is therefore
// one submission, MoE models included when every expert is resident: route_to keeps the chosen
// experts in device memory and routed_experts reads them there (a prefill chunk, or route(),
// still brings them to the host). Between ops, a barrier is recorded only when the next op touches
// a buffer that an op since the last barrier wrote (or writes one that such an op read).
//
// Host data an op needs (token ids, gather rows, RoPE tables) goes into an upload ring that is
// reused after every submission. Views larger than one storage binding may cover
// (DeviceInfo::max_binding_bytes) are bound from an aligned offset near their first element;
// weight matrices larger than that are split into row chunks, one dispatch each.
#include "backend/gpu/gpu_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/rope_tables.h"

namespace redwing {
namespace {

using gpu::Binding;
using gpu::DeviceBuffer;
using gpu::Kernel;

class GpuBuffer final : public Buffer {
 public:
  explicit GpuBuffer(std::unique_ptr<DeviceBuffer> d) : dev(std::move(d)) {}
  size_t size_bytes() const override { return dev->size_bytes(); }
  std::unique_ptr<DeviceBuffer> dev;
};

// packed words, scales and biases in one device buffer, each section 256-byte aligned.
// A weight may be one expert's matrix inside a bank's shared buffer (GpuExpertBank).
class GpuQWeight final : public QWeight {
 public:
  std::shared_ptr<DeviceBuffer> buf;
  size_t packed_offset = 0, scales_offset = 0, biases_offset = 0;
  size_t row_bytes = 0;    // packed bytes per row
  size_t scale_bytes = 0;  // bytes per scale (2 or 4)
  uint32_t bits = 4, group_size = 64, scale_type = 0;
};

// Every expert of a layer in two device buffers: gate and up stacked as one [2 * intermediate,
// hidden] matrix per expert (gate rows first), and down. Within a buffer every expert's packed
// rows, scales and biases start at a multiple of 256 bytes, so each expert is also an ordinary
// weight (the views below, used by the prefill path).
struct StackedExperts {
  std::shared_ptr<DeviceBuffer> buf;
  int64_t rows = 0, cols = 0;  // of one expert
  uint32_t bits = 4, group_size = 64, scale_type = 0;
  size_t packed_stride = 0;  // bytes between experts' packed rows (from 0)
  size_t scales_offset = 0;  // the scales section; biases follow at biases_offset
  size_t biases_offset = 0;
  size_t scale_stride = 0;  // bytes between experts' scales (and biases)
  size_t scale_bytes = 2;
  std::vector<std::unique_ptr<GpuQWeight>> views;  // per expert
};

class GpuExpertBank : public ExpertBank {
 public:
  StackedExperts gate_up, down;
};

// Streamed experts: a bank of slots (num_experts = the slot count), each slot laid out as one
// expert of a GpuExpertBank, so the same kernels run on it with slot indices for expert ids.
class GpuExpertSlots final : public GpuExpertBank {
 public:
  std::vector<int32_t> holds;  // per slot: the expert it holds, -1 for none
};

const DeviceBuffer& dev_of(const Buffer& b) { return *static_cast<const GpuBuffer&>(b).dev; }

uint32_t u32(int64_t v) {
  if (v < 0 || v > static_cast<int64_t>(UINT32_MAX))
    throw std::logic_error("gpu backend: value out of 32-bit range");
  return static_cast<uint32_t>(v);
}

void check_same_shape(const Mat& a, const Mat& b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols)
    throw std::logic_error(std::string(op) + ": shape mismatch");
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Push-constant blocks: the field order of each kernel's `Params` block.
struct QuantParams {
  uint32_t rows, cols, bits, group_size, scale_type, scale0, x_offset, x_stride, y_offset, y_stride,
      tokens;
  uint32_t norm_mode = 0;  // qmatvec.comp: an RMSNorm of x folded into the product
  float norm_offset = 0, norm_eps = 0, col_scale = 1;
  uint32_t geglu_half = 0;   // qmatvec.comp: x is GeGLU(x[c], x[c + geglu_half])
  uint32_t tile_rows = 0;    // qmatmul_tiled.comp: rows per tile
  uint32_t top_k = 0;        // router.comp: experts picked per token
  uint32_t loop_groups = 0;  // qmatvec.comp: workgroups per token looping over row blocks, or 0
};
enum NormMode : uint32_t { kNoNorm = 0, kNormWeighted, kNormMulCols, kNormPlain };
// qmatvec_norms.comp's push constants after qmatvec's block.
struct NormsFields {
  float weight_offset, eps, acc_scale;
  uint32_t acc_offset, acc_stride, y1_offset, y1_stride, y2_offset, y2_stride;
};
static_assert(sizeof(QuantParams) + sizeof(NormsFields) <= gpu::kMaxPushBytes);
struct EmbedParams {
  uint32_t rows, cols, bits, group_size, scale_type, scale0, out_offset, out_stride, count, row0;
  float scale;
};
struct NormParams {
  uint32_t rows, cols, x_offset, x_stride, y_offset, y_stride, has_weight;
  float weight_offset, eps;
  uint32_t accumulate;
  float acc_scale;
  uint32_t pair, y2_offset, y2_stride;
  float col_scale;
  uint32_t then_pair = 0, y3_offset = 0, y3_stride = 0, y4_offset = 0, y4_stride = 0;
};
struct FfnTailParams {
  uint32_t rows, cols, m_offset, m_stride, e_offset, e_stride, x_offset, x_stride;
  float weight_offset, eps, layer_scalar;
  uint32_t top_k, has_next, h_offset, h_stride;
};
// qmatvec_tail.comp's push constants after qmatvec's block.
struct TailProductFields {
  uint32_t m_offset, e_offset, e_stride, res_offset, h_offset;
  float layer_scalar;
  uint32_t arrivals, writer;
};
static_assert(sizeof(QuantParams) + sizeof(TailProductFields) <= gpu::kMaxPushBytes);
struct NormRopeParams {
  uint32_t rows, n_heads, half_dim, x_offset, x_stride, has_weight;
  float weight_offset, eps;
};
struct KvNormStoreParams {
  uint32_t rows, kv_heads, half_dim, k_offset, k_stride, v_offset, v_stride, has_weight;
  float weight_offset, eps;
  uint32_t v_norm, pos0, capacity, ring, f16;
};
// qmatvec_heads.comp's push constants after qmatvec's block.
struct HeadsFields {
  uint32_t half_dim, heads, target, has_weight;
  float weight_offset, eps;
  uint32_t v_norm, also_v, pos0, capacity, ring, f16;
  uint32_t counter0;  // this product's first arrival counter
};
static_assert(sizeof(QuantParams) + sizeof(HeadsFields) <= gpu::kMaxPushBytes);
enum HeadsTarget : uint32_t { kHeadsQuery = 0, kHeadsKey, kHeadsValue };
struct ElementParams {
  uint32_t op, rows, cols, a_offset, a_stride, b_offset, b_stride, out_offset, out_stride;
  float s;
};
struct RopeKernelParams {
  uint32_t rows, n_heads, half_dim, x_offset, x_stride;
};
struct RowsParams {
  uint32_t count, cols, src_offset, src_stride, dst_offset, dst_stride;
};
struct KvStoreParams {
  uint32_t rows, width, k_offset, k_stride, v_offset, v_stride, pos0, capacity, ring, f16;
};
// The leading push constants of both attention kernels: the queries and the layer's cache.
struct AttentionShape {
  uint32_t rows, n_heads, group, head_dim, width, q_offset, q_stride, pos0, capacity, ring, window,
      f16;
};
struct AttentionParams {
  AttentionShape shape;
  uint32_t splits;
  float scale;
  uint32_t split_len, combine, out_offset, out_stride, heads_per_group;
  // attention_partial.comp's p.fresh and what it reads (attention_from_input).
  uint32_t fresh = 0, q_has_weight = 0, k_has_weight = 0;
  float weight_offset = 0.0f, eps = 0.0f;
  uint32_t v_norm = 0, also_v = 0, k_offset = 0, v_offset = 0;
};
struct CombineParams {
  uint32_t rows, n_heads, head_dim, splits, out_offset, out_stride;
};
struct TiledAttentionParams {
  AttentionShape shape;
  float scale;
  uint32_t out_offset, out_stride, tile_rows;
};
struct RouteParams {
  uint32_t rows, experts, top_k, offset, stride;
};
struct MoeMatvecParams {
  uint32_t rows, cols, bits, group_size, scale_type, packed_stride, scale_stride, bias0, x_offset,
      x_stride, x_div, y_offset, y_stride, experts, geglu_half;
  uint32_t loop_groups = 0;  // moe_matvec.comp: workgroups per slot looping over row blocks, or 0
};
struct MoeMatmulParams {
  uint32_t rows, cols, bits, group_size, scale_type, packed_stride, scale_stride, x_offset,
      x_stride, y_offset, y_stride, tile0, tile_rows;
};
struct MoeCombineParams {
  uint32_t rows, cols, top_k, y_offset, y_stride, out_offset, out_stride;
};
struct PenalizeParams {
  uint32_t count, offset;
  float penalty;
};
struct TopkParams {
  uint32_t n, offset, k, chunk;
};
struct TopkMergeParams {
  uint32_t groups, k;
};
constexpr int kMaxSampleK = 64;          // topk_partial.comp's MAX_K
constexpr uint32_t kSampleChunk = 1024;  // logits per topk_partial workgroup
enum ElementOp : uint32_t { kFill = 0, kCopy, kAdd, kScale, kMulCols, kGeluMul, kSoftcap };

constexpr int64_t kAttentionSplit = 256;    // attention_partial.comp's SPLIT
constexpr int kMaxHeadDim = 512;            // attention_partial.comp's MAX_HEAD_DIM
constexpr int kMaxAttentionGroup = 4;       // attention_partial.comp's MAX_GROUP
constexpr int kMaxAttentionQuery = 1024;    // attention_partial.comp's MAX_QUERY
constexpr int kMaxTopK = 32;                // route.comp's MAX_TOP_K
constexpr int kMaxExperts = 512;            // route.glsl's RT_MAX_EXPERTS
constexpr int64_t kMatvecMaxTokens = 4;     // more tokens: the tiled qmatmul kernel
constexpr int64_t kMatvecRowsPerGroup = 8;  // qmatvec/moe_matvec rows per workgroup (matvec.glsl)
constexpr int64_t kMatvecChunkCols = 4096;  // matvec.glsl's MV_CHUNK: columns staged at once
constexpr int64_t kNormHeld = 16;           // rms_norm.comp's and ffn_tail.comp's NORM_HELD

// The workgroups of a decode product that stage x once and loop over its blocks of rows
// (qmatvec.glsl's qmatvec_blocks, moe_matvec.comp): `groups` where the product has more blocks
// than that and its rows fit one staging pass, else 0 (a workgroup per block).
uint32_t looping_groups(uint32_t groups, uint64_t blocks, int64_t cols) {
  return groups != 0 && blocks > groups && cols <= kMatvecChunkCols ? groups : 0;
}

// Setting `name` where it is set and not empty: one of `options`, else std::invalid_argument
// that lists them.
std::optional<std::string> choice_setting(const char* name,
                                          std::initializer_list<const char*> options) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  std::string expected;
  for (const char* o : options) {
    if (std::string(value) == o) return std::string(value);
    expected += (expected.empty() ? "" : ", ") + std::string(o);
  }
  throw std::invalid_argument(std::string(name) + "=" + value + ": expected one of " + expected);
}

// A host range the device reads in place (Backend::map_host_memory), unmapped when it goes.
class DeviceHostMapping final : public Backend::HostMapping {
 public:
  DeviceHostMapping(gpu::Device& device, const void* base) : device_(device), base_(base) {}
  ~DeviceHostMapping() override {
    try {
      device_.unmap_host(base_);
    } catch (...) {  // a lost device: nothing left to wait for
    }
  }
  DeviceHostMapping(const DeviceHostMapping&) = delete;
  DeviceHostMapping& operator=(const DeviceHostMapping&) = delete;

 private:
  gpu::Device& device_;
  const void* base_;
};

class GpuBackend final : public Backend {
 public:
  explicit GpuBackend(std::unique_ptr<gpu::Device> device) : dev_(std::move(device)) {
    align_ = std::max<uint64_t>(dev_->info().binding_alignment, 16);
    max_binding_ = dev_->info().max_binding_bytes;
    // REDWING_GPU_PROFILE=1: per-kernel GPU time, printed to stderr when the backend closes.
    const char* profile = std::getenv("REDWING_GPU_PROFILE");
    profile_ = profile != nullptr && std::string(profile) == "1";
    // REDWING_GPU_UNFUSED=geglu,tail,kv,route,norms,heads: run those fusions as separate ops
    // (A/B measurements).
    // REDWING_GPU_FOLD_NORMS=small (the default): fold input norms into the decode products
    // (qmatmul_normed) of at most kFoldSmallRows rows in all (the router's), where the few
    // workgroups that each recompute the norm leave the GPU mostly idle anyway, so the fold only
    // saves the norm's dependent step (H200: 3 of 3 runs faster, docs/gpu.md "Twelfth round").
    // "1": into every decode product: on the H200 it cut 61 dispatches per token but made the
    // products slower than the norm dispatches it saved (fifth round). "0": none.
    if (const char* unfused = std::getenv("REDWING_GPU_UNFUSED")) {
      const std::string u = unfused;
      fold_geglu_ = u.find("geglu") == std::string::npos;
      fuse_tail_ = u.find("tail") == std::string::npos;
      fuse_kv_ = u.find("kv") == std::string::npos;
      fuse_router_ = u.find("route") == std::string::npos;
      fuse_norm_pair_ = u.find("norms") == std::string::npos;
      fuse_heads_ = u.find("heads") == std::string::npos;
    }
    // REDWING_GPU_MOE_PREFILL=per-expert: the routed experts' prefill products one expert at a
    // time (the path of banks too large for one binding), for A/B runs and tests; "grouped" (the
    // default): every expert's tiles in one moe_matmul dispatch per product.
    // REDWING_GPU_ATTENTION_INPUTS=attention (the default): a decode row's heads normed, rotated
    // and stored in attention's dispatch (attention_from_input; q, k and v plain products): one
    // dependent step a layer fewer (lavapipe: the demo model's decode 40-52 -> 49-55 tok/s; H100:
    // the 26B after 512 tokens 145 -> 147, after 3,584 131 -> 134, the same logits; docs/gpu.md
    // "Twenty-seventh round"). "products": in the products' last workgroups per head, as rows
    // above one still do.
    if (const auto i = choice_setting("REDWING_GPU_ATTENTION_INPUTS", {"products", "attention"}))
      inputs_in_attention_ = *i == "attention";
    // REDWING_GPU_PREFETCH_KV=1 (the default on a GPU): before a decode row's attention inputs,
    // kv_prefetch.comp reads the layer's used keys and values with no barrier before it, so that
    // they reach the L2 cache while the previous layer's last step (ffn_tail, one workgroup) runs.
    // H100, the 26B with every expert resident: after 512 tokens 151.9 -> 156.0 tok/s, after
    // 3,584 138.4 -> 141.6, every pair (docs/gpu.md "Twenty-ninth round"). A CPU device (lavapipe)
    // would only read the caches twice: "0" there.
    prefetch_kv_ = !dev_->info().software;
    if (const auto f = choice_setting("REDWING_GPU_PREFETCH_KV", {"0", "1"}))
      prefetch_kv_ = *f == "1";
    // REDWING_GPU_FFN_TAIL=next: a decode row's feed-forward end (ffn_tail.comp, one workgroup)
    // is computed by every workgroup of the next layer's q/k/v products, which stage its h
    // themselves (qmatvec_tail.comp): a dependent step a MoE layer fewer, the same bits. "own"
    // (the default until a GPU measures it): its own dispatch.
    if (const auto f = choice_setting("REDWING_GPU_FFN_TAIL", {"own", "next"}))
      tail_in_next_products_ = *f == "next";
    if (const auto m = choice_setting("REDWING_GPU_MOE_PREFILL", {"grouped", "per-expert"}))
      grouped_experts_ = *m == "grouped";
    if (const auto f = choice_setting("REDWING_GPU_FOLD_NORMS", {"0", "1", "small"}))
      fold_norms_ = *f == "1" ? FoldNorms::all : *f == "small" ? FoldNorms::small : FoldNorms::none;
    dev_->enable_timestamps(profile_);
    // Every kernel's pipeline built while the caller loads the model's weights, not in the first
    // prompt's dispatches: on an H100 with a cold shader cache the first decode after a 512-token
    // prompt read 21-38 tok/s against 150 (docs/gpu.md, "Twenty-seventh round"). A CPU device
    // (lavapipe: CI's many short-lived backends) builds the kernels it uses when it uses them;
    // REDWING_GPU_PREPARE_KERNELS=0|1 decides either way.
    bool prepare = !dev_->info().software;
    if (const auto v = choice_setting("REDWING_GPU_PREPARE_KERNELS", {"0", "1"}))
      prepare = *v == "1";
    if (prepare) dev_->prepare_kernels();
  }
  ~GpuBackend() override {
    // Device buffers must go before the device.
    try {
      dev_->flush();
    } catch (...) {
    }
    if (profile_) print_profile();
    release_default_scratch();
    ring_.reset();
    partials_.reset();
    attention_counters_.reset();
    route_out_.reset();
    router_counters_.reset();
    norms_counters_.reset();
    heads_counters_.reset();
    tail_counters_.reset();
  }

  gpu::Device& device() { return *dev_; }

  std::unique_ptr<HostMapping> map_host_memory(std::span<const std::byte> block) override {
    if (!dev_->map_host(block.data(), block.size())) return nullptr;
    return std::make_unique<DeviceHostMapping>(*dev_, block.data());
  }

  WorkCounters work_counters() const override {
    const gpu::Device::HostTimes host = dev_->host_times();
    return {dev_->submissions(), dispatches_,    barriers_,
            host.record_ms,      host.submit_ms, host.wait_ms};
  }
  std::vector<KernelTiming> kernel_timings() const override {
    std::vector<KernelTiming> out;
    if (!profile_) return out;
    const auto times = dev_->kernel_times();
    for (size_t k = 0; k < times.size(); ++k)
      if (times[k].dispatches > 0)
        out.push_back({gpu::kernel_name(static_cast<Kernel>(k)), times[k].dispatches, times[k].ms});
    return out;
  }

  std::string name() const override { return dev_->info().api; }
  uint64_t device_memory_bytes() const override { return dev_->allocated_bytes(); }
  std::string describe() const override {
    const auto& i = dev_->info();
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(i.memory_bytes) / (1 << 30));
    return i.api + " " + i.name + " (" + mem + (i.software ? ", software" : "") + ")";
  }

  // ---- memory ----

  std::unique_ptr<Buffer> alloc(size_t bytes) override {
    settle_tail();  // a buffer it names may go once this returns (Scratch's growth)
    return std::make_unique<GpuBuffer>(dev_->create_buffer(bytes));
  }

  void upload(Buffer& dst, size_t off, const void* src, size_t bytes) override {
    if (off + bytes > dst.size_bytes()) throw std::logic_error("upload outside the buffer");
    const DeviceBuffer& d = dev_of(dst);
    touch({}, {&d});
    dev_->write(const_cast<DeviceBuffer&>(d), off, src, bytes);
  }

  void submit() override {
    settle_tail();
    dev_->submit();
  }

  void download(const Buffer& src, size_t off, void* dst, size_t bytes) override {
    if (off + bytes > src.size_bytes()) throw std::logic_error("download outside the buffer");
    settle_tail();
    dev_->read(dev_of(src), off, dst, bytes);
    after_flush();
  }

  std::unique_ptr<QWeight> import_qweight(const HostQuantMatrix& h) override {
    if (h.bits != 4 && h.bits != 8) throw std::invalid_argument("gpu: unsupported bit width");
    if (h.row_group != 1)
      throw std::invalid_argument("gpu: row-grouped matrices are the CPU backend's layout");
    if (h.cols % h.group_size != 0 || h.group_size % 32 != 0)
      throw std::invalid_argument("gpu: unsupported group size");
    auto w = std::make_unique<GpuQWeight>();
    w->rows = h.rows;
    w->cols = h.cols;
    w->bits = static_cast<uint32_t>(h.bits);
    w->group_size = static_cast<uint32_t>(h.group_size);
    w->scale_bytes = h.scale_dtype == DType::f32 ? 4 : 2;
    w->scale_type = h.scale_dtype == DType::bf16 ? 0 : h.scale_dtype == DType::f16 ? 1 : 2;
    w->row_bytes = static_cast<size_t>(h.cols) * static_cast<size_t>(h.bits) / 8;
    const size_t packed = w->row_bytes * static_cast<size_t>(h.rows);
    const size_t scales = static_cast<size_t>(h.rows * (h.cols / h.group_size)) * w->scale_bytes;
    w->packed_offset = 0;
    w->scales_offset = align_up(packed, 256);
    w->biases_offset = align_up(w->scales_offset + scales, 256);
    w->buf = dev_->create_buffer(align_up(w->biases_offset + scales, 4));
    touch({}, {w->buf.get()});
    dev_->write(*w->buf, w->packed_offset, h.packed, packed);
    dev_->write(*w->buf, w->scales_offset, h.scales, scales);
    dev_->write(*w->buf, w->biases_offset, h.biases, scales);
    return w;
  }

  // ---- element-wise ----

  void fill_zero(Mat x) override { elementwise(kFill, x, x, x, nullptr, 0.0f); }
  void copy(Mat src, Mat dst) override {
    check_same_shape(src, dst, "copy");
    elementwise(kCopy, src, src, dst, nullptr, 0.0f);
  }
  void add(Mat a, Mat b, Mat out) override {
    check_same_shape(a, b, "add");
    check_same_shape(a, out, "add");
    elementwise(kAdd, a, b, out, nullptr, 0.0f);
  }
  void scale(Mat x, float s) override { elementwise(kScale, x, x, x, nullptr, s); }
  void mul_cols(Mat x, const Buffer& v, float s) override {
    if (v.size_bytes() < sizeof(float) * x.cols)
      throw std::logic_error("mul_cols: vector too short");
    elementwise(kMulCols, x, x, x, &v, s);
  }
  void gelu_tanh_mul(Mat gate, Mat up, Mat out) override {
    check_same_shape(gate, up, "gelu_tanh_mul");
    check_same_shape(gate, out, "gelu_tanh_mul");
    elementwise(kGeluMul, gate, up, out, nullptr, 0.0f);
  }
  void softcap(Mat x, float cap) override { elementwise(kSoftcap, x, x, x, nullptr, cap); }

  void rms_norm(Mat x, const Buffer* weight, float offset, float eps, Mat y) override {
    norm(x, weight, offset, eps, y, false, 1.0f);
  }

  void rms_norm_mul_cols(Mat x, float eps, const Buffer& v, float s, Mat y) override {
    norm(x, &v, 0.0f, eps, y, false, 1.0f, nullptr, nullptr, s);
  }

  void rms_norm_pair(Mat x, const Buffer* weight1, const Buffer* weight2, float offset, float eps,
                     Mat y1, Mat y2) override {
    if (!weight1 || !weight2)
      return Backend::rms_norm_pair(x, weight1, weight2, offset, eps, y1, y2);
    check_same_shape(x, y2, "rms_norm_pair");
    if (weight2->size_bytes() < sizeof(float) * x.cols)
      throw std::logic_error("rms_norm_pair: weight too short");
    norm(x, weight1, offset, eps, y1, false, 1.0f, weight2, &y2);
  }

  void add_rms_norm(Mat x, const Buffer* weight, float offset, float eps, Mat acc,
                    float acc_scale) override {
    if (x.buf == acc.buf && x.offset == acc.offset)
      throw std::logic_error("add_rms_norm: x and acc are the same view");
    norm(x, weight, offset, eps, acc, true, acc_scale);
  }

  void add_rms_norm_pair(Mat x, const Buffer* weight, float offset, float eps, Mat acc,
                         float acc_scale, const Buffer* weight1, const Buffer* weight2, Mat y1,
                         Mat y2) override {
    // One dispatch where rms_norm.comp holds the row in registers (its then_pair pass reads the
    // new row from them).
    const bool fused = fuse_norm_pair_ && weight1 && weight2 &&
                       acc.cols <= kNormHeld * dev_->info().workgroup_threads;
    if (!fused)
      return Backend::add_rms_norm_pair(x, weight, offset, eps, acc, acc_scale, weight1, weight2,
                                        y1, y2);
    if (x.buf == acc.buf && x.offset == acc.offset)
      throw std::logic_error("add_rms_norm_pair: x and acc are the same view");
    check_same_shape(acc, y1, "add_rms_norm_pair");
    check_same_shape(acc, y2, "add_rms_norm_pair");
    for (const Buffer* w : {weight1, weight2})
      if (w->size_bytes() < sizeof(float) * acc.cols)
        throw std::logic_error("add_rms_norm_pair: weight too short");
    const NormPair pair{weight1, weight2, y1, y2};
    norm(x, weight, offset, eps, acc, true, acc_scale, nullptr, nullptr, std::nullopt, &pair);
  }

  void qmatmul_add_rms_norm_pair(const QWeight& wq, Mat x, Mat out, const Buffer* weight,
                                 float offset, float eps, Mat acc, float acc_scale,
                                 const Buffer* weight1, const Buffer* weight2, Mat y1,
                                 Mat y2) override {
    const auto& w = static_cast<const GpuQWeight&>(wq);
    const bool fused = fuse_norm_pair_ && last_workgroup_product(w, x.rows) && weight && weight1 &&
                       weight2 && acc.cols <= kNormHeld * dev_->info().workgroup_threads;
    if (!fused)
      return Backend::qmatmul_add_rms_norm_pair(wq, x, out, weight, offset, eps, acc, acc_scale,
                                                weight1, weight2, y1, y2);
    check_same_shape(out, acc, "qmatmul_add_rms_norm_pair");
    check_same_shape(acc, y1, "qmatmul_add_rms_norm_pair");
    check_same_shape(acc, y2, "qmatmul_add_rms_norm_pair");
    for (const Buffer* b : {weight, weight1, weight2})
      if (b->size_bytes() < sizeof(float) * acc.cols)
        throw std::logic_error("qmatmul_add_rms_norm_pair: weight too short");
    const Binding counters = arrival_counters(norms_counters_, static_cast<size_t>(x.rows));
    const View va = view(acc), v1 = view(y1), v2 = view(y2);
    const NormsFields fields{offset,          eps,       acc_scale,      va.offset,
                             u32(acc.stride), v1.offset, u32(y1.stride), v2.offset,
                             u32(y2.stride)};
    const Binding weight_b = whole(dev_of(*weight)), weight1_b = whole(dev_of(*weight1)),
                  weight2_b = whole(dev_of(*weight2));
    // qmatvec_norms.comp takes binding 5 for the post-norm's weight (no folded input norm).
    DecodeEpilogue e{Kernel::qmatvec_norms,
                     {weight_b, va.b, weight1_b, v1.b, weight2_b, v2.b, counters},
                     /*own_binding5=*/true};
    e.may_loop = true;
    e.set_tail(fields);
    touch({view(x).b.buffer, w.buf.get(), weight_b.buffer, weight1_b.buffer, weight2_b.buffer,
           va.b.buffer},
          {view(out).b.buffer, va.b.buffer, v1.b.buffer, v2.b.buffer, counters.buffer});
    qmatmul(w, x, out, nullptr, false, 0, &e);
  }

  void moe_ffn_tail(Mat experts, const FfnTail& t) override {
    check_same_shape(t.m, experts, "moe_ffn_tail");
    if (!fused_tail(t)) return Backend::moe_ffn_tail(experts, t);
    ffn_tail(experts, nullptr, 0, t);
  }

  // Whether ffn_tail.comp takes this tail: it holds a row in registers, so wider rows take the
  // separate ops.
  bool fused_tail(const FfnTail& t) const {
    return fuse_tail_ && t.m.cols <= kNormHeld * dev_->info().workgroup_threads;
  }

  // ffn_tail.comp over `experts` (the experts' sum, routes null) or over the routed slots'
  // products (routes and top_k: experts' rows are the entries t * top_k + j, moe_combine's y).
  void ffn_tail(Mat experts, const DeviceBuffer* routes, int top_k, const FfnTail& t) {
    const int64_t rows = t.m.rows, cols = t.m.cols;
    check_same_shape(t.m, t.x, "moe_ffn_tail");
    if (experts.cols != cols || experts.rows != (routes ? rows * top_k : rows))
      throw std::logic_error("moe_ffn_tail: experts' shape mismatch");
    if (t.next_norm) check_same_shape(t.x, t.next, "moe_ffn_tail");
    if (!t.dense_norm || !t.experts_norm || !t.ffn_norm)
      throw std::logic_error("moe_ffn_tail: a norm weight is missing");
    for (const Buffer* w : {t.dense_norm, t.experts_norm, t.ffn_norm, t.next_norm})
      if (w != nullptr && w->size_bytes() < sizeof(float) * cols)
        throw std::logic_error("moe_ffn_tail: weight too short");
    if (rows == 0) return;
    settle_tail();
    // A decode row's tail with the next layer's norm waits for that layer's q/k/v products.
    if (tail_in_next_products_ && rows == 1 && t.next_norm && cols <= kMatvecChunkCols &&
        top_k <= kMaxTopK && dev_->info().workgroups_see_writes) {
      pending_tail_ = PendingTail{experts, routes, top_k, t};
      return;
    }
    record_ffn_tail(experts, routes, top_k, t);
  }

  // Records the pending feed-forward end, if any, as its own dispatch (ffn_tail.comp).
  void settle_tail() {
    if (!pending_tail_) return;
    const PendingTail p = std::move(*pending_tail_);
    pending_tail_.reset();
    record_ffn_tail(p.experts, p.routes, p.top_k, p.tail);
  }

  // Whether the pending feed-forward end can be computed by these products (qmatvec_tail.comp):
  // decode products of its one row's h with nothing else in common with the tail.
  bool tail_feeds(std::span<const QProduct> products) const {
    if (!pending_tail_ || products.empty()) return false;
    const FfnTail& t = pending_tail_->tail;
    const Mat h = t.next;
    std::vector<const Buffer*> tail_buffers{t.m.buf, pending_tail_->experts.buf, t.x.buf, h.buf};
    for (const QProduct& p : products) {
      const auto& w = static_cast<const GpuQWeight&>(*p.w);
      if (p.x.buf != h.buf || p.x.offset != h.offset || p.x.rows != 1 || p.x.cols != h.cols ||
          w.cols != h.cols || p.y.rows != 1 || p.y.cols != w.rows)
        return false;
      for (const Buffer* b : tail_buffers)
        if (p.y.buf == b) return false;
      tail_buffers.push_back(p.y.buf);  // nor with each other
    }
    return true;
  }

  // The products of the pending tail's h (tail_feeds), each workgroup computing the tail and
  // staging h itself (qmatvec_tail.comp): one dependent step instead of two, the same bits. The
  // products' dispatches share one arrival counter, whose last arrival writes the residual.
  void products_with_tail(std::span<const QProduct> products) {
    const PendingTail pt = std::move(*pending_tail_);
    pending_tail_.reset();
    const FfnTail& t = pt.tail;
    const int64_t cols = t.m.cols;
    struct Part {
      const GpuQWeight* w;
      Mat y;
      int64_t r0, n;
      Binding packed, scales, biases;
      uint32_t scale0, groups = 0;
    };
    std::vector<Part> parts;
    uint64_t blocks = 0;
    for (const QProduct& p : products) {
      const auto& w = static_cast<const GpuQWeight&>(*p.w);
      for_each_chunk(w, [&](int64_t r0, int64_t n, const Binding& packed, const Binding& scales,
                            const Binding& biases, uint32_t scale0) {
        parts.push_back({&w, p.y, r0, n, packed, scales, biases, scale0});
        blocks += static_cast<uint64_t>((n + kMatvecRowsPerGroup - 1) / kMatvecRowsPerGroup);
      });
    }
    // The device's looping grid shared among the parts by their blocks (each computes the tail
    // once, so fewer workgroups than one per block); one per block where the device loops none.
    const uint64_t loop = dev_->info().matvec_loop_groups;
    uint32_t arrivals = 0;
    for (Part& part : parts) {
      const uint64_t own =
          static_cast<uint64_t>((part.n + kMatvecRowsPerGroup - 1) / kMatvecRowsPerGroup);
      const uint64_t share = loop == 0 ? own : (loop * own + blocks / 2) / blocks;
      part.groups = u32(static_cast<int64_t>(std::clamp<uint64_t>(share, 1, own)));
      arrivals += part.groups;
    }
    TailInputs in = tail_inputs(pt.experts, pt.routes, pt.top_k, t);
    const Binding counters = arrival_counters(tail_counters_, static_cast<size_t>(1 + cols));
    in.writes.push_back(counters.buffer);
    for (const Part& part : parts) {
      in.reads.push_back(part.w->buf.get());
      in.writes.push_back(view(part.y).b.buffer);
    }
    touch(in.reads, in.writes);
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& part = parts[i];
      const View vy = view(part.y);
      QuantParams p{u32(part.n),
                    u32(cols),
                    part.w->bits,
                    part.w->group_size,
                    part.w->scale_type,
                    part.scale0,
                    0,
                    0,
                    vy.offset + u32(part.r0),
                    u32(part.y.stride),
                    1};
      p.norm_offset = t.weight_offset;  // the tail's (no norm is folded: norm_mode 0)
      p.norm_eps = t.eps;
      p.top_k = u32(pt.top_k);
      p.loop_groups = part.groups;
      const TailProductFields f{in.m.offset, in.e.offset,     u32(pt.experts.stride),
                                in.x.offset, in.h.offset,     t.layer_scalar,
                                arrivals,    i == 0 ? 1u : 0u};
      std::array<std::byte, gpu::kMaxPushBytes> push{};
      std::memcpy(push.data(), &p, sizeof p);
      std::memcpy(push.data() + sizeof p, &f, sizeof f);
      const Binding binds[] = {part.packed, part.scales, part.biases, in.m.b, vy.b,
                               in.w4,       in.e.b,      in.x.b,      in.w1,  in.w2,
                               in.w3,       in.ids,      in.weights,  in.h.b, counters};
      dispatch(Kernel::qmatvec_tail, binds, push.data(), sizeof p + sizeof f, part.groups, 1, 1);
    }
  }

  // ffn_tail.comp for a checked tail (ffn_tail's arguments).
  void record_ffn_tail(Mat experts, const DeviceBuffer* routes, int top_k, const FfnTail& t) {
    const int64_t rows = t.m.rows, cols = t.m.cols;
    const TailInputs in = tail_inputs(experts, routes, top_k, t);
    FfnTailParams p{u32(rows),
                    u32(cols),
                    in.m.offset,
                    u32(t.m.stride),
                    in.e.offset,
                    u32(experts.stride),
                    in.x.offset,
                    u32(t.x.stride),
                    t.weight_offset,
                    t.eps,
                    t.layer_scalar,
                    u32(routes ? top_k : 0),
                    t.next_norm ? 1u : 0u,
                    in.h.offset,
                    u32(t.next.stride)};
    touch(in.reads, in.writes);
    const Binding binds[] = {in.m.b, in.e.b, in.x.b,     in.w1, in.w2,
                             in.w3,  in.ids, in.weights, in.w4, in.h.b};
    dispatch_linear(Kernel::ffn_tail, binds, &p, sizeof p, static_cast<uint64_t>(rows));
  }

  void rope(Mat x, int n_heads, int head_dim, const RopeParams& rp, int64_t pos0) override {
    if (x.cols != static_cast<int64_t>(n_heads) * head_dim)
      throw std::logic_error("rope: bad width");
    if (x.rows == 0) return;
    const int half = head_dim / 2;
    const Binding tb = rope_table(x.rows, head_dim, rp, pos0);
    const View vx = view(x);
    RopeKernelParams p{u32(x.rows), u32(n_heads), u32(half), vx.offset, u32(x.stride)};
    touch({tb.buffer, vx.b.buffer}, {vx.b.buffer});
    const Binding binds[] = {vx.b, tb};
    dispatch_linear(Kernel::rope, binds, &p, sizeof p,
                    (static_cast<uint64_t>(x.rows) * n_heads * half + 63) / 64);
  }

  void rms_norm_rope(Mat x, int n_heads, int head_dim, const Buffer* weight, float offset,
                     float eps, const RopeParams& rp, int64_t pos0) override {
    if (x.cols != static_cast<int64_t>(n_heads) * head_dim || head_dim % 2 != 0)
      throw std::logic_error("rms_norm_rope: bad width");
    if (weight && weight->size_bytes() < sizeof(float) * static_cast<size_t>(head_dim))
      throw std::logic_error("rms_norm_rope: weight too short");
    if (x.rows == 0) return;
    const Binding tb = rope_table(x.rows, head_dim, rp, pos0);
    const View vx = view(x);
    NormRopeParams p{
        u32(x.rows), u32(n_heads), u32(head_dim / 2), vx.offset, u32(x.stride), weight ? 1u : 0u,
        offset,      eps};
    const Binding wb = weight ? whole(dev_of(*weight)) : Binding{};
    std::vector<const DeviceBuffer*> reads{tb.buffer, vx.b.buffer};
    if (weight) reads.push_back(&dev_of(*weight));
    touch(reads, {vx.b.buffer});
    const Binding binds[] = {vx.b, wb, tb};
    dispatch_linear(Kernel::norm_rope, binds, &p, sizeof p,
                    static_cast<uint64_t>(x.rows) * static_cast<uint64_t>(n_heads));
  }

  // ---- products ----

  // An RMSNorm folded into a decode product (qmatvec.comp's norm_mode).
  struct FoldedNorm {
    NormMode mode = kNoNorm;
    const DeviceBuffer* weight = nullptr;
    float offset = 0, eps = 0, col_scale = 1;
  };

  void qmatmul_normed(Mat x, const InputNorm& norm, Mat normed,
                      std::span<const QProduct> products) override {
    const std::optional<FoldedNorm> f = folded_norm(x, norm, normed, products);
    if (!f) return Backend::qmatmul_normed(x, norm, normed, products);
    touch_products(products, &x, f->weight);
    for (const QProduct& p : products) qmatmul(*p.w, x, p.y, &*f, false);
  }

  // The norm of qmatmul_normed folded into its decode products, where it applies.
  std::optional<FoldedNorm> folded_norm(Mat x, const InputNorm& norm, Mat normed,
                                        std::span<const QProduct> products) {
    bool fold = x.rows <= kMatvecMaxTokens && x.rows > 0;
    for (const QProduct& p : products)
      fold = fold && p.x.buf == normed.buf && p.x.offset == normed.offset && p.x.rows == x.rows &&
             p.x.cols == x.cols;
    int64_t rows = 0;
    for (const QProduct& p : products) rows += p.w->rows;
    const bool allowed = fold_norms_ == FoldNorms::all ||
                         (fold_norms_ == FoldNorms::small && rows <= kFoldSmallRows);
    if ((norm.mul_cols && !norm.weight) || !allowed || !fold) return std::nullopt;
    check_same_shape(x, normed, "qmatmul_normed");
    if (norm.weight && norm.weight->size_bytes() < sizeof(float) * x.cols)
      throw std::logic_error("qmatmul_normed: norm weight too short");
    FoldedNorm f;
    f.mode = norm.mul_cols ? kNormMulCols : norm.weight ? kNormWeighted : kNormPlain;
    f.weight = norm.weight ? &dev_of(*norm.weight) : nullptr;
    f.offset = norm.weight_offset;
    f.eps = norm.eps;
    f.col_scale = norm.mul_cols.value_or(1.0f);
    return f;
  }

  // Whether a decode product of `rows` tokens by w can end in its last workgroup (router.comp,
  // qmatvec_norms.comp): one dispatch (w in one binding), a device whose workgroups see each
  // other's writes.
  bool last_workgroup_product(const GpuQWeight& w, int64_t rows) const {
    return dev_->info().workgroups_see_writes && rows > 0 && rows <= kMatvecMaxTokens &&
           static_cast<uint64_t>(w.row_bytes) * static_cast<uint64_t>(w.rows) <= max_binding_;
  }

  // The decode path: one router.comp dispatch, the product's last workgroup routing each token
  // (the norm folded in as qmatmul_normed would, else its own dispatch first).
  void route_product_to(Mat x, const InputNorm& norm, Mat normed, const QProduct& router, int top_k,
                        const Buffer& per_expert_scale, Buffer& routes) override {
    const auto& w = static_cast<const GpuQWeight&>(*router.w);
    const bool fused = fuse_router_ && last_workgroup_product(w, x.rows);
    if (!fused)
      return Backend::route_product_to(x, norm, normed, router, top_k, per_expert_scale, routes);
    const size_t count = check_route_args(router.y, top_k, per_expert_scale, routes);
    const std::span<const QProduct> products(&router, 1);
    const std::optional<FoldedNorm> f = folded_norm(x, norm, normed, products);
    if (!f) input_norm(x, norm, normed);
    const Binding counters = arrival_counters(router_counters_, static_cast<size_t>(x.rows));
    const DeviceBuffer& rb = dev_of(routes);
    const DeviceBuffer& pes = dev_of(per_expert_scale);
    DecodeEpilogue epilogue{Kernel::router,
                            {whole(pes), route_ids(rb, count), route_weights(rb, count), counters}};
    epilogue.top_k = u32(top_k);
    epilogue.may_loop = true;
    std::vector<const DeviceBuffer*> reads{view(f ? x : normed).b.buffer, w.buf.get(), &pes};
    if (f && f->weight) reads.push_back(f->weight);
    touch(reads, {view(router.y).b.buffer, &rb, counters.buffer});
    qmatmul(w, f ? x : normed, router.y, f ? &*f : nullptr, false, 0, &epilogue);
  }

  // One hazard check for the whole batch: the products read their x and write their y, so none
  // needs to wait for another, also where their outputs share a buffer (gate and up side by
  // side). A batch where one product reads another's output takes the one-by-one default.
  void qmatmul_batch(std::span<const QProduct> products) override {
    if (tail_feeds(products)) return products_with_tail(products);
    for (const QProduct& a : products)
      for (const QProduct& b : products)
        if (a.y.buf == b.x.buf) return Backend::qmatmul_batch(products);
    touch_products(products, nullptr, nullptr);
    for (const QProduct& p : products) qmatmul(*p.w, p.x, p.y, nullptr, false);
  }

  // gelu_tanh(gate) * up, then the down product: on the decode path the product computes the
  // GeGLU while staging its input (one dispatch and one dependent step less), when gate and up
  // are column ranges of one buffer with up after gate.
  void geglu_qmatmul(const QWeight& down, Mat gate, Mat up, Mat out) override {
    check_same_shape(gate, up, "geglu_qmatmul");
    const int64_t half = up.offset - gate.offset;
    const bool fused = gate.rows <= kMatvecMaxTokens && gate.buf == up.buf &&
                       gate.stride == up.stride && half >= gate.cols &&
                       half + up.cols <= gate.stride;
    if (!fused || !fold_geglu_) return Backend::geglu_qmatmul(down, gate, up, out);
    if (gate.rows == 0) return;
    qmatmul(down, gate, out, nullptr, true, u32(half));
  }

  void qmatmul(const QWeight& wq, Mat x, Mat y) override { qmatmul(wq, x, y, nullptr); }

  // The hazard check of products reading `x` (each product's own where null) and the norm
  // weight, writing their outputs.
  void touch_products(std::span<const QProduct> products, const Mat* x,
                      const DeviceBuffer* norm_weight) {
    std::vector<const DeviceBuffer*> reads, writes;
    for (const QProduct& p : products) {
      reads.push_back(view(x ? *x : p.x).b.buffer);
      reads.push_back(static_cast<const GpuQWeight&>(*p.w).buf.get());
      writes.push_back(view(p.y).b.buffer);
    }
    if (norm_weight) reads.push_back(norm_weight);
    touch(reads, writes);
  }

  // `count` 32-bit arrival counters in `slot`, grown as needed. They are zero between dispatches:
  // create_buffer zeroes them and each kernel's last arrival resets its counter.
  Binding arrival_counters(std::unique_ptr<DeviceBuffer>& slot, size_t count) {
    const size_t bytes = count * sizeof(uint32_t);
    if (!slot || slot->size_bytes() < bytes)
      slot = dev_->create_buffer(std::max<size_t>(bytes, 4096));
    return Binding{slot.get(), 0, bytes};
  }

  // A decode product whose last workgroups go on with more work: router.comp (route_product_to),
  // qmatvec_norms.comp (qmatmul_add_rms_norm_pair), qmatvec_heads.comp
  // (project_attention_inputs). The kernel's bindings are the product's five (packed, scales,
  // biases, x, y), the folded norm's weight (unless own_binding5: the kernel's own binding 5 is
  // the first of `bindings`), then `bindings`; its push constants are qmatvec's block (with
  // top_k) followed by `tail`. Fixed-size storage: one is built per product while a decode
  // step is recorded.
  struct DecodeEpilogue {
    DecodeEpilogue(Kernel k, std::initializer_list<Binding> b, bool own5 = false)
        : kernel(k), binding_count(b.size()), own_binding5(own5) {
      if (b.size() > bindings.size()) throw std::logic_error("DecodeEpilogue: too many bindings");
      std::copy(b.begin(), b.end(), bindings.begin());
    }
    Kernel kernel;
    std::array<Binding, gpu::kMaxBindings> bindings{};
    size_t binding_count;
    bool own_binding5;
    // The kernel counts its workgroups per token, so it may run the looping grid (router,
    // qmatvec_norms); qmatvec_heads counts a head's blocks and needs one workgroup per block.
    bool may_loop = false;
    uint32_t top_k = 0;
    std::array<std::byte, gpu::kMaxPushBytes - sizeof(QuantParams)> tail{};
    size_t tail_bytes = 0;
    template <class Fields>
    void set_tail(const Fields& fields) {
      static_assert(std::is_trivially_copyable_v<Fields> && sizeof(Fields) <= sizeof tail);
      std::memcpy(tail.data(), &fields, sizeof fields);
      tail_bytes = sizeof fields;
    }
  };

  // With geglu_half, x is the gate half: the view spans up too (geglu_half columns on). With an
  // epilogue, the decode product ends in it (DecodeEpilogue).
  void qmatmul(const QWeight& wq, Mat x, Mat y, const FoldedNorm* fold, bool check_hazards = true,
               uint32_t geglu_half = 0, const DecodeEpilogue* epilogue = nullptr) {
    const auto& w = static_cast<const GpuQWeight&>(wq);
    if (x.cols != w.cols || y.cols != w.rows || x.rows != y.rows)
      throw std::logic_error("qmatmul: shape mismatch (" + std::to_string(x.rows) + "x" +
                             std::to_string(x.cols) + " by " + std::to_string(w.rows) + "x" +
                             std::to_string(w.cols) + ")");
    if (x.rows == 0) return;
    const View vx =
        view(geglu_half ? Mat{x.buf, x.offset, x.rows, x.cols + geglu_half, x.stride} : x);
    const View vy = view(y);
    if (check_hazards) {
      if (fold && fold->weight)
        touch({vx.b.buffer, w.buf.get(), fold->weight}, {vy.b.buffer});
      else
        touch({vx.b.buffer, w.buf.get()}, {vy.b.buffer});
    }
    const bool matvec = x.rows <= kMatvecMaxTokens;
    if ((fold || geglu_half) && !matvec)
      throw std::logic_error("qmatmul: a folded norm or GeGLU needs the decode product");
    for_each_chunk(w, [&](int64_t r0, int64_t n, const Binding& packed, const Binding& scales,
                          const Binding& biases, uint32_t scale0) {
      QuantParams p{u32(n),     u32(w.cols), w.bits,        w.group_size,        w.scale_type,
                    scale0,     vx.offset,   u32(x.stride), vy.offset + u32(r0), u32(y.stride),
                    u32(x.rows)};
      p.geglu_half = geglu_half;
      Binding norm_weight{};
      if (fold) {
        p.norm_mode = fold->mode;
        p.norm_offset = fold->offset;
        p.norm_eps = fold->eps;
        p.col_scale = fold->col_scale;
        if (fold->weight) norm_weight = whole(*fold->weight);
      }
      const Binding binds[] = {packed, scales, biases, vx.b, vy.b, norm_weight};
      if (matvec) {
        const uint64_t groups =
            static_cast<uint64_t>((n + kMatvecRowsPerGroup - 1) / kMatvecRowsPerGroup);
        const auto [gx, gy] = grid(groups);
        // Fewer workgroups than blocks, each staging x once for several (qmatvec_blocks); an
        // epilogue kernel only where it counts workgroups (may_loop).
        const uint32_t loop = !epilogue || epilogue->may_loop
                                  ? looping_groups(dev_->info().matvec_loop_groups, groups, w.cols)
                                  : 0;
        p.loop_groups = loop;
        const uint32_t grid_x = loop ? loop : gx, grid_y = loop ? 1 : gy;
        if (epilogue) {
          p.top_k = epilogue->top_k;
          std::array<std::byte, gpu::kMaxPushBytes> push{};
          std::memcpy(push.data(), &p, sizeof p);
          std::memcpy(push.data() + sizeof p, epilogue->tail.data(), epilogue->tail_bytes);
          std::array<Binding, gpu::kMaxBindings> ebinds{packed, scales, biases, vx.b, vy.b};
          size_t count = 5;
          if (!epilogue->own_binding5) ebinds[count++] = norm_weight;
          if (count + epilogue->binding_count > ebinds.size())
            throw std::logic_error("qmatmul: too many epilogue bindings");
          for (size_t i = 0; i < epilogue->binding_count; ++i)
            ebinds[count++] = epilogue->bindings[i];
          dispatch(epilogue->kernel, std::span<const Binding>(ebinds.data(), count), push.data(),
                   sizeof p + epilogue->tail_bytes, grid_x, grid_y, u32(x.rows));
          return;
        }
        const bool wide = loop && dev_->info().matvec_loop_rows < 4 &&
                          groups >= static_cast<uint64_t>(loop) * gpu::kWideBlocksPerGroup;
        dispatch(wide ? Kernel::qmatvec_wide : Kernel::qmatvec, binds, &p, sizeof p, grid_x, grid_y,
                 u32(x.rows));
      } else {
        // The register-tiled product where its tiles fill the device, else the narrow one
        // (device.h's choose_matmul_tile).
        const gpu::MatmulTile tile = gpu::choose_matmul_tile(dev_->info(), n, x.rows);
        p.tile_rows = tile.tiled ? tile.rows : 0;
        const Kernel kernel = !tile.tiled ? Kernel::qmatmul
                              : tile.r8   ? Kernel::qmatmul_tiled_r8
                                          : Kernel::qmatmul_tiled;
        dispatch(kernel, binds, &p, sizeof p, u32((n + tile.rows - 1) / tile.rows),
                 u32((x.rows + tile.tokens - 1) / tile.tokens), 1);
      }
    });
  }

  void embed(const QWeight& tq, std::span<const int32_t> ids, float s, Mat out) override {
    const auto& t = static_cast<const GpuQWeight&>(tq);
    check_embed_args(t.rows, t.cols, ids, out);
    if (ids.empty()) return;
    const Binding idb = upload_host(ids.data(), ids.size_bytes());
    const View vo = view(out);
    touch({idb.buffer, t.buf.get()}, {vo.b.buffer});
    for_each_chunk(t, [&](int64_t r0, int64_t n, const Binding& packed, const Binding& scales,
                          const Binding& biases, uint32_t scale0) {
      EmbedParams p{u32(n),        u32(t.cols), t.bits,    t.group_size,
                    t.scale_type,  scale0,      vo.offset, u32(out.stride),
                    u32(out.rows), u32(r0),     s};
      const Binding binds[] = {packed, scales, biases, idb, vo.b};
      dispatch_linear(Kernel::embed, binds, &p, sizeof p,
                      (static_cast<uint64_t>(out.rows) * out.cols + 63) / 64);
    });
  }

  void gather_rows(Mat src, std::span<const int32_t> rows, Mat dst) override {
    if (dst.rows != static_cast<int64_t>(rows.size()) || dst.cols != src.cols)
      throw std::logic_error("gather_rows: shape mismatch");
    for (int32_t r : rows)
      if (r < 0 || r >= src.rows) throw std::logic_error("gather_rows: row out of range");
    if (rows.empty()) return;
    const Binding rb = upload_host(rows.data(), rows.size_bytes());
    const View vs = view(src), vd = view(dst);
    RowsParams p{u32(dst.rows),   u32(dst.cols), vs.offset,
                 u32(src.stride), vd.offset,     u32(dst.stride)};
    touch({vs.b.buffer, rb.buffer}, {vd.b.buffer});
    const Binding binds[] = {vs.b, rb, vd.b};
    dispatch_linear(Kernel::gather_rows, binds, &p, sizeof p,
                    (static_cast<uint64_t>(dst.rows) * dst.cols + 63) / 64);
  }

  void scatter_add_rows(Mat src, std::span<const int32_t> rows, std::span<const float> weights,
                        Mat dst) override {
    if (src.rows != static_cast<int64_t>(rows.size()) || rows.size() != weights.size() ||
        dst.cols != src.cols)
      throw std::logic_error("scatter_add_rows: shape mismatch");
    for (int32_t r : rows)
      if (r < 0 || r >= dst.rows) throw std::logic_error("scatter_add_rows: row out of range");
    if (rows.empty()) return;
    const Binding rb = upload_host(rows.data(), rows.size_bytes());
    const Binding wb = upload_host(weights.data(), weights.size_bytes());
    const View vs = view(src), vd = view(dst);
    RowsParams p{u32(src.rows),   u32(src.cols), vs.offset,
                 u32(src.stride), vd.offset,     u32(dst.stride)};
    touch({vs.b.buffer, rb.buffer, vd.b.buffer}, {vd.b.buffer});
    const Binding binds[] = {vs.b, rb, wb, vd.b};
    dispatch_linear(Kernel::scatter_add_rows, binds, &p, sizeof p,
                    (static_cast<uint64_t>(src.cols) + 63) / 64);
  }

  // ---- attention ----

  void kv_store(const KvLayerView& kv, Mat k, Mat v, int64_t pos0) override {
    check_kv_store_args(kv, k, v, pos0);
    const int64_t width = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
    if (width % 2 != 0) throw std::logic_error("kv_store: odd row width");
    if (k.rows == 0) return;
    const View vk = view(k), vv = view(v);
    const DeviceBuffer& kc = dev_of(*kv.k);
    const DeviceBuffer& vc = dev_of(*kv.v);
    KvStoreParams p{u32(k.rows),       u32(width),
                    vk.offset,         u32(k.stride),
                    vv.offset,         u32(v.stride),
                    u32(pos0),         u32(kv.capacity),
                    kv.ring ? 1u : 0u, kv.dtype == KvDType::f16 ? 1u : 0u};
    touch({vk.b.buffer, vv.b.buffer}, {&kc, &vc});
    const Binding binds[] = {vk.b, vv.b, whole(kc), whole(vc)};
    dispatch_linear(Kernel::kv_store, binds, &p, sizeof p,
                    (static_cast<uint64_t>(k.rows) * (width / 2) + 63) / 64);
  }

  void store_kv_normed(const KvLayerView& kv, Mat k, Mat v, const Buffer* k_norm,
                       float weight_offset, float eps, const RopeParams& rp, bool v_norm,
                       int64_t pos0) override {
    const int d = kv.head_dim;
    if (!fuse_kv_ || d > kMaxHeadDim || d % 2 != 0)
      return Backend::store_kv_normed(kv, k, v, k_norm, weight_offset, eps, rp, v_norm, pos0);
    check_kv_store_args(kv, k, v, pos0);
    if (k_norm && k_norm->size_bytes() < sizeof(float) * static_cast<size_t>(d))
      throw std::logic_error("store_kv_normed: k norm weight too short");
    if (k.rows == 0) return;
    const Binding tb = rope_table(k.rows, d, rp, pos0);
    const View vk = view(k), vv = view(v);
    const DeviceBuffer& kc = dev_of(*kv.k);
    const DeviceBuffer& vc = dev_of(*kv.v);
    KvNormStoreParams p{u32(k.rows),
                        u32(kv.num_kv_heads),
                        u32(d / 2),
                        vk.offset,
                        u32(k.stride),
                        vv.offset,
                        u32(v.stride),
                        k_norm ? 1u : 0u,
                        weight_offset,
                        eps,
                        v_norm ? 1u : 0u,
                        u32(pos0),
                        u32(kv.capacity),
                        kv.ring ? 1u : 0u,
                        kv.dtype == KvDType::f16 ? 1u : 0u};
    const Binding wb = k_norm ? whole(dev_of(*k_norm)) : Binding{};
    std::vector<const DeviceBuffer*> reads{vk.b.buffer, vv.b.buffer, tb.buffer};
    if (k_norm) reads.push_back(&dev_of(*k_norm));
    touch(reads, {&kc, &vc});
    const Binding binds[] = {vk.b, vv.b, wb, tb, whole(kc), whole(vc)};
    dispatch_linear(Kernel::kv_norm_store, binds, &p, sizeof p,
                    static_cast<uint64_t>(k.rows) * kv.num_kv_heads * 2);
  }

  // The decode path: three qmatvec_heads.comp dispatches in one step, each product's last
  // workgroup per head doing that head's norm, rotation and store (the norm of the input folded
  // as qmatmul_normed would, else its own dispatch first).
  void project_attention_inputs(Mat x, const InputNorm* norm, Mat normed, const QkvProducts& qkv,
                                const HeadNorms& hn, const KvLayerView& kv, int64_t pos0) override {
    const int d = kv.head_dim;
    const QProduct all[] = {qkv.q, qkv.k, qkv.v};
    const std::span<const QProduct> products(all, qkv.v.w ? 3 : 2);
    bool fused = fuse_heads_ && d <= kMaxHeadDim && d % (2 * kMatvecRowsPerGroup) == 0 &&
                 qkv.q.y.cols % d == 0 && qkv.k.y.cols == int64_t{kv.num_kv_heads} * d;
    for (const QProduct& p : products)
      fused = fused && p.x.buf == qkv.q.x.buf && p.x.offset == qkv.q.x.offset &&
              p.x.rows == qkv.q.x.rows && p.x.cols == qkv.q.x.cols &&
              last_workgroup_product(static_cast<const GpuQWeight&>(*p.w), p.x.rows);
    if (!fused) return Backend::project_attention_inputs(x, norm, normed, qkv, hn, kv, pos0);
    const Mat q = qkv.q.y, k = qkv.k.y, v = qkv.v.y;
    check_kv_store_args(kv, k, v, pos0);
    check_head_norms(hn, d, "project_attention_inputs");
    const int64_t T = q.rows;
    const auto q_heads = static_cast<uint32_t>(q.cols / d);
    const auto kv_heads = static_cast<uint32_t>(kv.num_kv_heads);

    std::optional<FoldedNorm> f;
    if (norm) {
      f = folded_norm(x, *norm, normed, products);
      if (!f) input_norm(x, *norm, normed);
    }
    const Mat in = f ? x : qkv.q.x;
    const Binding table = rope_table(T, d, hn.rope, pos0);
    const size_t counter_count = static_cast<size_t>(T) * (q_heads + 2 * kv_heads);
    const Binding counters = arrival_counters(heads_counters_, counter_count);
    const DeviceBuffer& kc = dev_of(*kv.k);
    const DeviceBuffer& vc = dev_of(*kv.v);

    std::vector<const DeviceBuffer*> reads{view(in).b.buffer, table.buffer};
    std::vector<const DeviceBuffer*> writes{&kc, &vc, counters.buffer};
    for (const QProduct& p : products) {
      reads.push_back(static_cast<const GpuQWeight&>(*p.w).buf.get());
      writes.push_back(view(p.y).b.buffer);
    }
    for (const Buffer* w : {hn.q_norm, hn.k_norm})
      if (w) reads.push_back(&dev_of(*w));
    if (f && f->weight) reads.push_back(f->weight);
    touch(reads, writes);

    HeadsFields h{};
    h.weight_offset = hn.weight_offset;
    h.eps = hn.eps;
    h.v_norm = hn.v_norm ? 1u : 0u;
    h.pos0 = u32(pos0);
    h.capacity = u32(kv.capacity);
    h.ring = kv.ring ? 1u : 0u;
    h.f16 = kv.dtype == KvDType::f16 ? 1u : 0u;
    h.half_dim = u32(d / 2);
    size_t first_counter = 0;
    auto run = [&](const QProduct& p, HeadsTarget target, const Buffer* weight, uint32_t heads) {
      h.target = target;
      h.heads = heads;
      h.has_weight = weight ? 1u : 0u;
      h.counter0 = u32(static_cast<int64_t>(first_counter));
      first_counter += static_cast<size_t>(T) * heads;
      // qmatvec_heads.comp: after the folded norm's weight, the head norm's weight, the RoPE
      // table, both caches and the arrival counters.
      DecodeEpilogue e{
          Kernel::qmatvec_heads,
          {weight ? whole(dev_of(*weight)) : Binding{}, table, whole(kc), whole(vc), counters}};
      e.set_tail(h);
      qmatmul(*p.w, in, p.y, f ? &*f : nullptr, false, 0, &e);
    };
    run(qkv.q, kHeadsQuery, hn.q_norm, q_heads);
    h.also_v = qkv.v.w ? 0u : 1u;  // the keys' raw product is the values' too
    run(qkv.k, kHeadsKey, hn.k_norm, kv_heads);
    h.also_v = 0;
    if (qkv.v.w) run(qkv.v, kHeadsValue, nullptr, kv_heads);
  }

  static void check_head_norms(const HeadNorms& hn, int d, const char* what) {
    for (const Buffer* w : {hn.q_norm, hn.k_norm})
      if (w && w->size_bytes() < sizeof(float) * static_cast<size_t>(d))
        throw std::logic_error(std::string(what) + ": head norm weight too short");
  }

  // Whether attention over `rows` query rows takes the tiled prefill kernel
  // (AttentionSplit::tiled_min_rows) rather than attention_partial.comp.
  bool tiled_attention_rows(int64_t rows) const {
    const uint32_t from = dev_->info().attention.tiled_min_rows;
    return from > 0 && rows >= from;
  }

  // A decode row's raw attention inputs (attention_partial.comp's p.fresh): the head norms, the
  // row's RoPE table, the raw key and value rows.
  struct FreshInputs {
    const HeadNorms& heads;
    bool also_v;  // the values are the keys' raw product (v unused)
    Binding table;
    Mat k, v;
  };

  // One decode row: the products plain, then attention_partial.comp norming, rotating and storing
  // the heads (p.fresh), where REDWING_GPU_ATTENTION_INPUTS=attention; else the default.
  void attention_from_input(Mat x, const InputNorm* norm, Mat normed, const QkvProducts& qkv,
                            const HeadNorms& hn, const KvLayerView& kv, int64_t pos0, float scale,
                            Mat out) override {
    if (prefetch_kv_ && qkv.q.y.rows == 1) prefetch_kv(kv, pos0);
    const int d = kv.head_dim;
    const Mat q = qkv.q.y, k = qkv.k.y, v = qkv.v.y;
    const bool inside = inputs_in_attention_ && q.rows == 1 && !tiled_attention_rows(1) &&
                        d <= kMaxHeadDim && d % 2 == 0 && q.cols % d == 0 &&
                        k.cols == int64_t{kv.num_kv_heads} * d;
    if (!inside)
      return Backend::attention_from_input(x, norm, normed, qkv, hn, kv, pos0, scale, out);
    check_kv_store_args(kv, k, v, pos0);
    check_head_norms(hn, d, "attention_from_input");
    qkv_products(x, norm, normed, qkv);
    const FreshInputs f{hn, qkv.v.w == nullptr, rope_table(1, d, hn.rope, pos0), k, v};
    split_attention(q, kv, pos0, static_cast<int>(q.cols / d), scale, out, &f);
  }

  // kv_prefetch.comp over the cache slots positions before pos0 occupy (a ring's whole window
  // once it wraps), up to kPrefetchMaxBytes a cache; it writes nothing the hazard tracking must
  // know about, so no barrier precedes it.
  static constexpr size_t kPrefetchMaxBytes = size_t{8} << 20;
  void prefetch_kv(const KvLayerView& kv, int64_t pos0) {
    const int64_t slots = std::min<int64_t>(pos0, kv.capacity);
    const size_t elem = kv.dtype == KvDType::f16 ? 2 : 4;
    const size_t bytes = static_cast<size_t>(slots) * static_cast<size_t>(kv.num_kv_heads) *
                         static_cast<size_t>(kv.head_dim) * elem;
    if (bytes < 16 || bytes > kPrefetchMaxBytes) return;
    const DeviceBuffer& kc = dev_of(*kv.k);
    const DeviceBuffer& vc = dev_of(*kv.v);
    // A feed-forward end waiting for the products after this stays waiting: the read touches
    // nothing it does.
    std::optional<PendingTail> held = std::exchange(pending_tail_, std::nullopt);
    touch({&kc, &vc}, {});
    struct {
      uint32_t words, never;
    } p{u32(static_cast<int64_t>(bytes / 16)), 0xdeadbeefu};
    // Binding 2, the store that never happens, is the device's dummy buffer (an empty Binding).
    const Binding binds[] = {whole(kc), whole(vc), Binding{}};
    // A thread loads one word of each 32 bytes: enough workgroups for a few words a thread.
    const uint64_t groups = std::clamp<uint64_t>(bytes / (32 * 256 * 4), 1, 256);
    dispatch_linear(Kernel::kv_prefetch, binds, &p, sizeof p, groups);
    pending_tail_ = std::move(held);
  }

  void attention(Mat q, const KvLayerView& kv, int64_t pos0, int n_heads, float scale,
                 Mat out) override {
    split_attention(q, kv, pos0, n_heads, scale, out, nullptr);
  }

  // Decode attention (attention_partial.comp), or the tiled prefill kernel for many rows; with
  // `fresh`, q is a decode row's raw product and the kernel does the heads' inputs too.
  void split_attention(Mat q, const KvLayerView& kv, int64_t pos0, int n_heads, float scale,
                       Mat out, const FreshInputs* fresh) {
    check_attention_args(q, kv, n_heads, out);
    const int d = kv.head_dim;
    if (d > kMaxHeadDim) throw std::logic_error("attention: head_dim above 512");
    if (q.rows == 0) return;
    // The most keys any row sees: the last row's visible range.
    const int64_t last = pos0 + q.rows - 1;
    const int64_t most = last - kv.first_visible(last) + 1;
    if (kv.ring && most > kv.capacity) throw std::logic_error("attention: window exceeds the ring");
    if (tiled_attention_rows(q.rows)) return tiled_attention(q, kv, pos0, n_heads, scale, out);
    // Keys per split: at most kAttentionSplit, fewer where rows x heads x splits would leave
    // most of a large GPU idle (decode on a short context: one workgroup per head); a multiple
    // of the device's minimum (DeviceInfo::attention). The combine is exact for any split.
    const int64_t rows_heads = q.rows * n_heads;
    const gpu::AttentionSplit& shape = dev_->info().attention;
    const int64_t min_keys = shape.min_keys;
    const int64_t splits_wanted = std::max<int64_t>(1, shape.workgroups / rows_heads);
    const int64_t split_len = std::clamp<int64_t>(
        ((most + splits_wanted - 1) / splits_wanted + min_keys - 1) / min_keys * min_keys, min_keys,
        kAttentionSplit);
    const int64_t splits = (most + split_len - 1) / split_len;
    const size_t partial_bytes =
        static_cast<size_t>(q.rows * n_heads * splits * (d + 2)) * sizeof(float);
    if (!partials_ || partials_->size_bytes() < partial_bytes)
      partials_ = dev_->create_buffer(std::max(partial_bytes, size_t{1} << 20));
    const View vq = view(q), vo = view(out);
    const DeviceBuffer& kc = dev_of(*kv.k);
    const DeviceBuffer& vc = dev_of(*kv.v);
    // Query heads per workgroup: the most (up to the device's choice) that divide the KV head's
    // group and whose queries fit the kernel's shared memory. The split does not depend on it,
    // so neither do the bits.
    const int group = n_heads / kv.num_kv_heads;
    int heads = std::min({static_cast<int>(shape.heads_per_workgroup), kMaxAttentionGroup, group,
                          kMaxAttentionQuery / d});
    while (heads > 1 && group % heads != 0) --heads;
    heads = std::max(heads, 1);
    AttentionParams p{attention_shape(q, vq.offset, kv, pos0, n_heads),
                      u32(splits),
                      scale,
                      u32(split_len),
                      0,
                      0,
                      0,
                      u32(heads)};
    const Binding pb{partials_.get(), 0, partial_bytes};
    // Merged in this dispatch by the last workgroup of each (row, head group) (one arrival
    // counter each, zero between dispatches: create_buffer zeroes, the merger resets; one per
    // (row, head) is allocated, enough for any group), else by attention_combine.
    const bool merge = shape.merge_in_last_workgroup;
    Binding counters{};
    std::vector<const DeviceBuffer*> reads{vq.b.buffer, &kc, &vc};
    std::vector<const DeviceBuffer*> writes{partials_.get()};
    if (merge) {
      counters = arrival_counters(attention_counters_, static_cast<size_t>(rows_heads));
      p.combine = 1;
      p.out_offset = vo.offset;
      p.out_stride = u32(out.stride);
      writes.insert(writes.end(), {counters.buffer, vo.b.buffer});
    }
    std::array<Binding, gpu::kMaxBindings> binds{
        vq.b, whole(kc), whole(vc), pb, merge ? vo.b : Binding{}, counters};
    size_t bound = 6;
    if (fresh) {
      const View vk = view(fresh->k), vv = view(fresh->also_v ? fresh->k : fresh->v);
      p.fresh = 1;
      const HeadNorms& hn = fresh->heads;
      p.q_has_weight = hn.q_norm ? 1u : 0u;
      p.k_has_weight = hn.k_norm ? 1u : 0u;
      p.weight_offset = hn.weight_offset;
      p.eps = hn.eps;
      p.v_norm = hn.v_norm ? 1u : 0u;
      p.also_v = fresh->also_v ? 1u : 0u;
      p.k_offset = vk.offset;
      p.v_offset = vv.offset;
      const Binding qn = hn.q_norm ? whole(dev_of(*hn.q_norm)) : Binding{};
      const Binding kn = hn.k_norm ? whole(dev_of(*hn.k_norm)) : Binding{};
      for (const Binding& b : {qn, kn, fresh->table, vk.b, vv.b, whole(kc), whole(vc)})
        binds[bound++] = b;
      for (const Binding& b : {qn, kn, fresh->table, vk.b, vv.b})
        if (b.buffer) reads.push_back(b.buffer);
      writes.insert(writes.end(), {&kc, &vc});  // the current position's key and value
    }
    touch(reads, writes);
    dispatch_linear(Kernel::attention_partial, std::span<const Binding>(binds.data(), bound), &p,
                    sizeof p, static_cast<uint64_t>(q.rows) * (n_heads / heads) * splits);
    if (merge) return;
    CombineParams c{u32(q.rows), u32(n_heads), u32(d), u32(splits), vo.offset, u32(out.stride)};
    touch({partials_.get()}, {vo.b.buffer});
    const Binding cbinds[] = {pb, vo.b};
    dispatch_linear(Kernel::attention_combine, cbinds, &c, sizeof c,
                    static_cast<uint64_t>(q.rows) * n_heads);
  }

  // q's first element is element q_offset of its buffer (view(q).offset).
  static AttentionShape attention_shape(Mat q, uint32_t q_offset, const KvLayerView& kv,
                                        int64_t pos0, int n_heads) {
    return {u32(q.rows),
            u32(n_heads),
            u32(n_heads / kv.num_kv_heads),
            u32(kv.head_dim),
            u32(static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim),
            q_offset,
            u32(q.stride),
            u32(pos0),
            u32(kv.capacity),
            kv.ring ? 1u : 0u,
            u32(kv.window),
            kv.dtype == KvDType::f16 ? 1u : 0u};
  }

  // Prefill attention in tiles of BR query rows (attention_tiled.comp). BR is a power of two from
  // threads / 8 (blocks of at most 32 keys) to 32, with the output's BR x head_dim in 16 vec4s per
  // thread (BR head_dim <= 64 threads), and no larger than the rows need.
  void tiled_attention(Mat q, const KvLayerView& kv, int64_t pos0, int n_heads, float scale,
                       Mat out) {
    const uint32_t threads = dev_->info().workgroup_threads;
    const uint32_t d = u32(kv.head_dim);
    const uint32_t fewest = std::max<uint32_t>(8, threads / 8);
    uint32_t tile_rows = 32;
    while (tile_rows > fewest && tile_rows * d > 64 * threads) tile_rows /= 2;
    while (tile_rows > fewest && tile_rows / 2 >= q.rows) tile_rows /= 2;
    const View vq = view(q), vo = view(out);
    const DeviceBuffer& kc = dev_of(*kv.k);
    const DeviceBuffer& vc = dev_of(*kv.v);
    const TiledAttentionParams p{attention_shape(q, vq.offset, kv, pos0, n_heads), scale, vo.offset,
                                 u32(out.stride), tile_rows};
    touch({vq.b.buffer, &kc, &vc}, {vo.b.buffer});
    const Binding binds[] = {vq.b, whole(kc), whole(vc), vo.b};
    const uint64_t tiles = (static_cast<uint64_t>(q.rows) + tile_rows - 1) / tile_rows;
    dispatch_linear(Kernel::attention_tiled, binds, &p, sizeof p, tiles * n_heads);
  }

  // ---- routing ----

  void route(Mat logits, int top_k, const Buffer& per_expert_scale, int32_t* idx,
             float* weights) override {
    const int64_t n = logits.cols;
    if (top_k <= 0 || top_k > n || top_k > kMaxTopK) throw std::logic_error("route: bad top_k");
    if (n > kMaxExperts)
      throw std::logic_error("route: more than " + std::to_string(kMaxExperts) + " experts");
    if (per_expert_scale.size_bytes() < sizeof(float) * n)
      throw std::logic_error("route: per_expert_scale too short");
    if (logits.rows == 0) return;
    const size_t count = static_cast<size_t>(logits.rows * top_k);
    const size_t weights_at = align_up(count * sizeof(int32_t), align_);
    const size_t bytes = weights_at + count * sizeof(float);
    if (!route_out_ || route_out_->size_bytes() < bytes)
      route_out_ = dev_->create_buffer(std::max<size_t>(bytes, 4096));
    const View vl = view(logits);
    const DeviceBuffer& pes = dev_of(per_expert_scale);
    RouteParams p{u32(logits.rows), u32(n), u32(top_k), vl.offset, u32(logits.stride)};
    touch({vl.b.buffer, &pes}, {route_out_.get()});
    const Binding binds[] = {vl.b, whole(pes), Binding{route_out_.get(), 0, weights_at},
                             Binding{route_out_.get(), weights_at, count * sizeof(float)}};
    dispatch_linear(Kernel::route, binds, &p, sizeof p, static_cast<uint64_t>(logits.rows));
    std::vector<std::byte> host(bytes);
    dev_->read(*route_out_, 0, host.data(), bytes);
    after_flush();
    std::memcpy(idx, host.data(), count * sizeof(int32_t));
    std::memcpy(weights, host.data() + weights_at, count * sizeof(float));
  }

  // ---- mixture of experts with the routing on the device ----

  std::unique_ptr<ExpertBank> import_experts(std::span<const HostQuantMatrix> gate,
                                             std::span<const HostQuantMatrix> up,
                                             std::span<const HostQuantMatrix> down) override {
    auto bank = std::make_unique<GpuExpertBank>();
    check_expert_shapes(gate, up, down, *bank);
    // The resident bank is the slots' layout with every expert in its own slot.
    bank->gate_up = empty_stacked({&gate[0], &up[0]}, gate.size());
    bank->down = empty_stacked({&down[0]}, gate.size());
    touch({}, {bank->gate_up.buf.get(), bank->down.buf.get()});
    for (size_t e = 0; e < gate.size(); ++e) {
      write_slot(bank->gate_up, e, {&gate[e], &up[e]});
      write_slot(bank->down, e, {&down[e]});
    }
    return bank;
  }

  // route_to's checks; the number of routed entries.
  static size_t check_route_args(Mat logits, int top_k, const Buffer& per_expert_scale,
                                 const Buffer& routes) {
    const int64_t n = logits.cols;
    if (top_k <= 0 || top_k > n || top_k > kMaxTopK) throw std::logic_error("route: bad top_k");
    if (n > kMaxExperts)
      throw std::logic_error("route: more than " + std::to_string(kMaxExperts) + " experts");
    if (per_expert_scale.size_bytes() < sizeof(float) * n)
      throw std::logic_error("route: per_expert_scale too short");
    const size_t count = static_cast<size_t>(logits.rows) * static_cast<size_t>(top_k);
    if (routes.size_bytes() < route_buffer_bytes(count))
      throw std::logic_error("route_to: routes buffer too small");
    return count;
  }

  void route_to(Mat logits, int top_k, const Buffer& per_expert_scale, Buffer& routes) override {
    const size_t count = check_route_args(logits, top_k, per_expert_scale, routes);
    const int64_t n = logits.cols;
    if (logits.rows == 0) return;
    const View vl = view(logits);
    const DeviceBuffer& pes = dev_of(per_expert_scale);
    const DeviceBuffer& rb = dev_of(routes);
    RouteParams p{u32(logits.rows), u32(n), u32(top_k), vl.offset, u32(logits.stride)};
    touch({vl.b.buffer, &pes}, {&rb});
    const Binding binds[] = {vl.b, whole(pes), route_ids(rb, count), route_weights(rb, count)};
    dispatch_linear(Kernel::route, binds, &p, sizeof p, static_cast<uint64_t>(logits.rows));
  }

  void routed_experts(const ExpertBank& base, Mat x, const Buffer& routes, int top_k,
                      Mat out) override {
    const GpuExpertBank& bank = checked_bank(base, x, routes, top_k, out);
    if (x.rows == 0) return;
    if (experts_decode(bank, x))
      combine_on_device(expert_products_on_device(bank, x, routes, top_k), dev_of(routes), top_k,
                        out);
    else
      experts_grouped_on_host(bank, x, routes, top_k, out);
  }

  void routed_experts_tail(const ExpertBank& base, Mat x, const Buffer& routes, int top_k, Mat out,
                           const FfnTail& tail) override {
    const GpuExpertBank& bank = checked_bank(base, x, routes, top_k, out);
    if (x.rows == 0 || !experts_decode(bank, x) || !fused_tail(tail))
      return Backend::routed_experts_tail(base, x, routes, top_k, out, tail);
    // The products' sum in the tail's dispatch: moe_combine's arithmetic, one step less.
    ffn_tail(expert_products_on_device(bank, x, routes, top_k), &dev_of(routes), top_k, tail);
  }

  const GpuExpertBank& checked_bank(const ExpertBank& base, Mat x, const Buffer& routes, int top_k,
                                    Mat out) const {
    const auto* bank = dynamic_cast<const GpuExpertBank*>(&base);
    if (bank == nullptr) throw std::logic_error("routed_experts: a bank of another backend");
    if (x.cols != bank->hidden || out.cols != bank->hidden || out.rows != x.rows)
      throw std::logic_error("routed_experts: shape mismatch");
    if (top_k <= 0 || top_k > kMaxTopK) throw std::logic_error("routed_experts: bad top_k");
    const size_t count = static_cast<size_t>(x.rows) * static_cast<size_t>(top_k);
    if (routes.size_bytes() < route_buffer_bytes(count))
      throw std::logic_error("routed_experts: routes buffer too small");
    return *bank;
  }

  // Decode: every slot's products read their expert's id on the device. Prefill: the ids come
  // to the host and each chosen expert runs once over all the rows that picked it (a product
  // per slot would read the weights once per token).
  bool experts_decode(const GpuExpertBank& bank, Mat x) const {
    return x.rows <= kMatvecMaxTokens && fits_one_binding(bank.gate_up) &&
           fits_one_binding(bank.down);
  }

  // ---- streamed experts: slots in device memory (backend.h; docs/gpu.md, "Expert streaming
  // on the GPU") ----

  bool supports_expert_slots() const override { return true; }

  std::unique_ptr<ExpertBank> create_expert_slots(const HostQuantMatrix& gate,
                                                  const HostQuantMatrix& up,
                                                  const HostQuantMatrix& down, int slots) override {
    if (slots <= 0) throw std::logic_error("create_expert_slots: slots must be > 0");
    auto bank = std::make_unique<GpuExpertSlots>();
    check_expert_shapes(std::span(&gate, 1), std::span(&up, 1), std::span(&down, 1), *bank);
    bank->num_experts = slots;
    bank->gate_up = empty_stacked({&gate, &up}, static_cast<size_t>(slots));
    bank->down = empty_stacked({&down}, static_cast<size_t>(slots));
    bank->holds.assign(static_cast<size_t>(slots), -1);
    return bank;
  }

  bool slot_holds(const ExpertBank& base, int slot, int32_t expert) const override {
    const auto& bank = slots_of(base);
    return slot >= 0 && slot < bank.num_experts && bank.holds[static_cast<size_t>(slot)] == expert;
  }

  void fill_expert_slot(ExpertBank& base, int slot, int32_t expert, const HostQuantMatrix& gate,
                        const HostQuantMatrix& up, const HostQuantMatrix& down) override {
    auto& bank = const_cast<GpuExpertSlots&>(slots_of(base));
    if (slot < 0 || slot >= bank.num_experts)
      throw std::logic_error("fill_expert_slot: no slot " + std::to_string(slot));
    if (gate.rows != bank.intermediate || up.rows != bank.intermediate ||
        gate.cols != bank.hidden || up.cols != bank.hidden || down.rows != bank.hidden ||
        down.cols != bank.intermediate)
      throw std::logic_error("fill_expert_slot: expert " + std::to_string(expert) +
                             " has other shapes");
    const size_t s = static_cast<size_t>(slot);
    bank.holds[s] = -1;  // until every write is recorded
    touch({}, {bank.gate_up.buf.get(), bank.down.buf.get()});
    write_slot(bank.gate_up, s, {&gate, &up});
    write_slot(bank.down, s, {&down});
    bank.holds[s] = expert;
  }

  // The prefill layout of a layer's per-entry expert products (slot_expert_products,
  // host_expert_products): the routed entries (t * top_k + k) grouped by expert, experts
  // ascending and each group's entries in order, the order group_expert_rows gives the rows
  // (combine_grouped gathers them back into entry order).
  static ExpertEntryGroups entries_by_expert(std::span<const int32_t> ids) {
    return group_entries_by_expert(ids, ids.empty() ? 0 : std::ranges::max(ids) + 1);
  }

  void slot_expert_products(const ExpertBank& base, Mat x, std::span<const int32_t> ids,
                            std::span<const int32_t> entry_slot, int top_k) override {
    const GpuExpertSlots& bank = slots_of(base);
    if (x.cols != bank.hidden) throw std::logic_error("slot_expert_products: shape mismatch");
    if (top_k <= 0 || top_k > kMaxTopK) throw std::logic_error("slot_expert_products: bad top_k");
    const size_t count = static_cast<size_t>(x.rows) * static_cast<size_t>(top_k);
    if (ids.size() != count || entry_slot.size() != count)
      throw std::logic_error("slot_expert_products: routes of another size");
    bool every_entry = true;
    for (int32_t s : entry_slot) {
      if (s < -1 || s >= bank.num_experts)
        throw std::logic_error("slot_expert_products: no slot " + std::to_string(s));
      every_entry = every_entry && s >= 0;
    }
    if (x.rows == 0) return;
    const int64_t inter = bank.intermediate;
    const int64_t entries = static_cast<int64_t>(count);
    // The same choice of path, scratch and kernels as routed_experts on a full bank, so the
    // products are the same bits.
    slot_decode_path_ =
        x.rows <= kMatvecMaxTokens && fits_one_binding(bank.gate_up) && fits_one_binding(bank.down);
    if (slot_decode_path_) {
      Mat gu = scratch(moe_gate_up_, entries, 2 * inter);
      Mat y = scratch(moe_out_, entries, bank.hidden);
      if (every_entry) {  // one product pair over every entry, as expert_products_on_device
        const Binding slot_ids = upload_host(entry_slot.data(), count * sizeof(int32_t));
        moe_matvec(bank.gate_up, bank, x, u32(top_k), slot_ids, u32(entries), gu);
        moe_matvec(bank.down, bank, gu.col_range(0, inter), 1, slot_ids, u32(entries), y,
                   u32(inter));
        return;
      }
      for (int64_t j = 0; j < entries; ++j) {  // a wave: one z-slice of those products each
        const int32_t& s = entry_slot[static_cast<size_t>(j)];
        if (s < 0) continue;
        const Binding slot_id = upload_host(&s, sizeof s);
        moe_matvec(bank.gate_up, bank, x.row_range(j / top_k, 1), 1, slot_id, 1,
                   gu.row_range(j, 1));
        moe_matvec(bank.down, bank, gu.row_range(j, 1).col_range(0, inter), 1, slot_id, 1,
                   y.row_range(j, 1), u32(inter));
      }
      return;
    }
    // Prefill: each expert once over the rows that picked it, its rows where
    // experts_grouped_on_host puts them (experts in ascending id).
    const auto by_expert = entries_by_expert(ids);
    const ExpertWork w = expert_work(bank, entries);
    if (grouped_products(bank)) {
      // One gather of every entry's row (entries of experts in no slot too: a row nobody reads),
      // and tiles only for the experts in a slot, naming their slots.
      std::vector<int32_t> rows;
      std::vector<ExpertRun> runs;
      for (const auto& [e, group] : by_expert) {
        const int32_t s = entry_slot[static_cast<size_t>(group[0])];
        for (int64_t j : group)
          if (entry_slot[static_cast<size_t>(j)] != s)
            throw std::logic_error("slot_expert_products: one expert in two slots");
        if (s >= 0)
          runs.push_back({u32(s), u32(static_cast<int64_t>(rows.size())),
                          u32(static_cast<int64_t>(group.size()))});
        for (int64_t j : group) rows.push_back(static_cast<int32_t>(j / top_k));
      }
      // The tile from every expert of the layer (those in no slot too), as the resident bank
      // chooses it: the same tiles, the same bits.
      grouped_expert_products(bank, x, rows, runs, entries / static_cast<int64_t>(by_expert.size()),
                              w);
      return;
    }
    int64_t r0 = 0;
    for (const auto& [e, group] : by_expert) {
      const int64_t n = static_cast<int64_t>(group.size());
      const int32_t s = entry_slot[static_cast<size_t>(group[0])];
      for (int64_t j : group)
        if (entry_slot[static_cast<size_t>(j)] != s)
          throw std::logic_error("slot_expert_products: one expert in two slots");
      if (s >= 0) {
        std::vector<int32_t> rows;
        for (int64_t j : group) rows.push_back(static_cast<int32_t>(j / top_k));
        gather_rows(x, rows, w.in.row_range(r0, n));
        qmatmul(*bank.gate_up.views[static_cast<size_t>(s)], w.in.row_range(r0, n),
                w.gu.row_range(r0, n));
        gelu_tanh_mul(w.gu.row_range(r0, n).col_range(0, inter),
                      w.gu.row_range(r0, n).col_range(inter, inter), w.h.row_range(r0, n));
        qmatmul(*bank.down.views[static_cast<size_t>(s)], w.h.row_range(r0, n),
                w.y.row_range(r0, n));
      }
      r0 += n;
    }
  }

  void host_expert_products(const ExpertBank& base, Mat x, std::span<const int32_t> ids,
                            std::span<const int32_t> entries, std::span<const float> products,
                            int top_k) override {
    const GpuExpertSlots& bank = slots_of(base);
    if (x.cols != bank.hidden) throw std::logic_error("host_expert_products: shape mismatch");
    if (top_k <= 0 || top_k > kMaxTopK) throw std::logic_error("host_expert_products: bad top_k");
    const size_t count = static_cast<size_t>(x.rows) * static_cast<size_t>(top_k);
    const size_t row_floats = static_cast<size_t>(bank.hidden);
    if (ids.size() != count || products.size() != entries.size() * row_floats)
      throw std::logic_error("host_expert_products: routes or products of another size");
    for (int32_t j : entries)
      if (j < 0 || static_cast<size_t>(j) >= count)
        throw std::logic_error("host_expert_products: no entry " + std::to_string(j));
    if (entries.empty()) return;
    // Where slot_expert_products keeps each entry's product: row j on the decode path, else the
    // rows of its expert's group (experts ascending, each group's entries in order).
    slot_decode_path_ =
        x.rows <= kMatvecMaxTokens && fits_one_binding(bank.gate_up) && fits_one_binding(bank.down);
    std::vector<int64_t> row_of(count);
    if (slot_decode_path_) {
      for (size_t j = 0; j < count; ++j) row_of[j] = static_cast<int64_t>(j);
    } else {
      int64_t r = 0;
      for (const auto& [e, group] : entries_by_expert(ids))
        for (int64_t j : group) row_of[static_cast<size_t>(j)] = r++;
    }
    Mat y = scratch(moe_out_, static_cast<int64_t>(count), bank.hidden);
    const DeviceBuffer& yb = dev_of(*y.buf);
    touch({}, {&yb});
    for (size_t i = 0; i < entries.size(); ++i)
      dev_->write(
          const_cast<DeviceBuffer&>(yb),
          static_cast<size_t>(row_of[static_cast<size_t>(entries[i])]) * row_floats * sizeof(float),
          products.data() + i * row_floats, row_floats * sizeof(float));
  }

  void combine_slot_products(const Buffer& routes, std::span<const int32_t> ids,
                             std::span<const float> weights, int top_k, Mat out) override {
    const size_t count = static_cast<size_t>(out.rows) * static_cast<size_t>(top_k);
    if (ids.size() != count || weights.size() != count)
      throw std::logic_error("combine_slot_products: routes of another size");
    if (routes.size_bytes() < route_buffer_bytes(count))
      throw std::logic_error("combine_slot_products: routes buffer too small");
    if (out.rows == 0) return;
    const int64_t entries = static_cast<int64_t>(count);
    Mat y = scratch(moe_out_, entries, out.cols);
    if (out.rows <= kMatvecMaxTokens && slot_decode_path_) {
      combine_on_device(y, dev_of(routes), top_k, out);
      return;
    }
    combine_grouped(y, ids, dev_of(routes), top_k, out);
  }

  // ---- sampling ----

  bool samples_in_place() const override { return true; }

  void penalize_logits(Mat row, std::span<const int32_t> ids, float penalty) override {
    if (row.rows != 1) throw std::logic_error("penalize_logits: one row");
    for (int32_t id : ids)
      if (id < 0 || id >= row.cols) throw std::logic_error("penalize_logits: id outside the row");
    if (ids.empty()) return;
    const Binding ib = upload_host(ids.data(), ids.size_bytes());
    const View v = view(row);
    PenalizeParams p{u32(static_cast<int64_t>(ids.size())), v.offset, penalty};
    touch({ib.buffer, v.b.buffer}, {v.b.buffer});
    const Binding binds[] = {v.b, ib};
    dispatch_linear(Kernel::penalize, binds, &p, sizeof p, (ids.size() + 63) / 64);
  }

  TopLogits top_logits(Mat row, int k) override {
    if (row.rows != 1 || k <= 0) throw std::logic_error("top_logits: one row, k > 0");
    if (k > kMaxSampleK) return Backend::top_logits(row, k);
    const uint32_t uk = static_cast<uint32_t>(k);
    const uint32_t groups = u32((row.cols + kSampleChunk - 1) / kSampleChunk);
    const size_t stride = (2 * static_cast<size_t>(uk) + 3) * sizeof(uint32_t);
    const size_t partial_bytes = groups * stride;
    if (!sample_partials_ || sample_partials_->size_bytes() < partial_bytes)
      sample_partials_ = dev_->create_buffer(std::max<size_t>(partial_bytes, 1 << 16));
    if (!sample_result_) sample_result_ = dev_->create_buffer(4096);
    const View v = view(row);
    TopkParams p{u32(row.cols), v.offset, uk, kSampleChunk};
    const Binding partials{sample_partials_.get(), 0, partial_bytes};
    touch({v.b.buffer}, {sample_partials_.get()});
    const Binding binds[] = {v.b, partials};
    dispatch_linear(Kernel::topk_partial, binds, &p, sizeof p, groups);
    TopkMergeParams m{groups, uk};
    touch({sample_partials_.get()}, {sample_result_.get()});
    const Binding mbinds[] = {partials, Binding{sample_result_.get(), 0, stride}};
    dispatch_linear(Kernel::topk_merge, mbinds, &m, sizeof m, 1);
    std::vector<uint32_t> words(2 * static_cast<size_t>(uk) + 3);
    dev_->read(*sample_result_, 0, words.data(), stride);
    after_flush();
    TopLogits out;
    out.finite = words[2 * uk + 2] == 0;
    float f;
    std::memcpy(&f, &words[2 * uk], sizeof f);
    out.max = f;
    std::memcpy(&f, &words[2 * uk + 1], sizeof f);
    out.exp_sum = f;
    for (uint32_t j = 0; j < uk; ++j) {
      const auto id = static_cast<int32_t>(words[j]);
      if (id < 0) break;
      std::memcpy(&f, &words[uk + j], sizeof f);
      out.ids.push_back(id);
      out.logits.push_back(f);
    }
    return out;
  }

 private:
  // The layout of `count` experts of the given parts side by side in one buffer (each part's
  // packed rows, then all scales, then all biases), nothing written (the device buffer starts
  // zeroed): a resident bank (every expert in its slot) or the slots of a streamed layer.
  StackedExperts empty_stacked(std::initializer_list<const HostQuantMatrix*> parts, size_t count) {
    StackedExperts s;
    const HostQuantMatrix& first = **parts.begin();
    if (first.bits != 4 && first.bits != 8)
      throw std::invalid_argument("gpu: unsupported bit width");
    if (first.cols % first.group_size != 0 || first.group_size % 32 != 0)
      throw std::invalid_argument("gpu: unsupported group size");
    for (const HostQuantMatrix* m : parts) s.rows += m->rows;
    s.cols = first.cols;
    s.bits = static_cast<uint32_t>(first.bits);
    s.group_size = static_cast<uint32_t>(first.group_size);
    s.scale_bytes = first.scale_dtype == DType::f32 ? 4 : 2;
    s.scale_type = first.scale_dtype == DType::bf16 ? 0 : first.scale_dtype == DType::f16 ? 1 : 2;
    const size_t row_bytes = static_cast<size_t>(s.cols) * s.bits / 8;
    const size_t groups = static_cast<size_t>(s.cols / s.group_size);
    s.packed_stride = align_up(static_cast<size_t>(s.rows) * row_bytes, 256);
    s.scale_stride = align_up(static_cast<size_t>(s.rows) * groups * s.scale_bytes, 256);
    s.scales_offset = count * s.packed_stride;
    s.biases_offset = s.scales_offset + count * s.scale_stride;
    s.buf = dev_->create_buffer(s.biases_offset + count * s.scale_stride);
    for (size_t e = 0; e < count; ++e) {
      auto w = std::make_unique<GpuQWeight>();
      w->rows = s.rows;
      w->cols = s.cols;
      w->bits = s.bits;
      w->group_size = s.group_size;
      w->scale_type = s.scale_type;
      w->scale_bytes = s.scale_bytes;
      w->row_bytes = row_bytes;
      w->buf = s.buf;
      w->packed_offset = e * s.packed_stride;
      w->scales_offset = s.scales_offset + e * s.scale_stride;
      w->biases_offset = s.biases_offset + e * s.scale_stride;
      s.views.push_back(std::move(w));
    }
    return s;
  }

  // Records the copy of one expert's parts into slot `slot` of s (empty_stacked's layout).
  void write_slot(const StackedExperts& s, size_t slot,
                  std::initializer_list<const HostQuantMatrix*> parts) {
    const size_t row_bytes = static_cast<size_t>(s.cols) * s.bits / 8;
    const size_t groups = static_cast<size_t>(s.cols / s.group_size);
    size_t packed_at = slot * s.packed_stride, scales_at = slot * s.scale_stride;
    for (const HostQuantMatrix* m : parts) {
      if (m->cols != s.cols || m->bits != static_cast<int>(s.bits) ||
          m->group_size != static_cast<int>(s.group_size) ||
          (m->scale_dtype == DType::f32 ? 4u : 2u) != s.scale_bytes ||
          (m->scale_dtype == DType::bf16  ? 0u
           : m->scale_dtype == DType::f16 ? 1u
                                          : 2u) != s.scale_type)
        throw std::logic_error("gpu: experts quantized differently");
      const size_t packed = static_cast<size_t>(m->rows) * row_bytes;
      const size_t scales = static_cast<size_t>(m->rows) * groups * s.scale_bytes;
      dev_->write(*s.buf, packed_at, m->packed, packed);
      dev_->write(*s.buf, s.scales_offset + scales_at, m->scales, scales);
      dev_->write(*s.buf, s.biases_offset + scales_at, m->biases, scales);
      packed_at += packed;
      scales_at += scales;
    }
  }

  static const GpuExpertSlots& slots_of(const ExpertBank& base) {
    const auto* bank = dynamic_cast<const GpuExpertSlots*>(&base);
    if (bank == nullptr) throw std::logic_error("expert slots of another backend");
    return *bank;
  }

  bool fits_one_binding(const StackedExperts& s) const {
    return s.scales_offset <= max_binding_ && s.buf->size_bytes() - s.scales_offset <= max_binding_;
  }

  // y[slot] = W_{ids[slot]} x[slot / x_div] for the `slots` routed slots; with geglu_half, x's
  // column c is gelu_tanh(x[c]) * x[c + geglu_half] (the view x spans the first half).
  void moe_matvec(const StackedExperts& s, const GpuExpertBank& bank, Mat x, uint32_t x_div,
                  const Binding& ids, uint32_t slots, Mat y, uint32_t geglu_half = 0) {
    const View vx = view(x), vy = view(y);
    MoeMatvecParams p{
        u32(s.rows),
        u32(s.cols),
        s.bits,
        s.group_size,
        s.scale_type,
        u32(static_cast<int64_t>(s.packed_stride / 4)),
        u32(static_cast<int64_t>(s.scale_stride / s.scale_bytes)),
        u32(static_cast<int64_t>((s.biases_offset - s.scales_offset) / s.scale_bytes)),
        vx.offset,
        u32(x.stride),
        x_div,
        vy.offset,
        u32(y.stride),
        u32(bank.num_experts),
        geglu_half};
    touch({vx.b.buffer, ids.buffer, s.buf.get()}, {vy.b.buffer});
    const Binding binds[] = {
        Binding{s.buf.get(), 0, s.scales_offset},
        Binding{s.buf.get(), s.scales_offset, s.buf->size_bytes() - s.scales_offset}, vx.b, vy.b,
        ids};
    // The down product (the one that computes the GeGLU) is a kernel of its own with its own
    // shape (moe_matvec_down.comp, device.h's matvec_down).
    const Kernel kernel = geglu_half != 0 ? Kernel::moe_matvec_down : Kernel::moe_matvec;
    const gpu::DeviceInfo& info = dev_->info();
    const int64_t per_group = kernel == Kernel::moe_matvec_down
                                  ? info.matvec_down.rows_per_group(info.workgroup_threads)
                                  : kMatvecRowsPerGroup;
    const auto blocks = static_cast<uint64_t>((s.rows + per_group - 1) / per_group);
    // The gate/up product: fewer workgroups than blocks, each staging x once for several,
    // where the device asks for it (matvec_loop_groups, shared among the slots).
    const uint32_t per_slot =
        info.matvec_loop_groups == 0
            ? 0
            : std::max<uint32_t>(1, info.matvec_loop_groups / std::max(slots, 1u));
    const uint32_t loop = looping_groups(per_slot, blocks, s.cols);
    if (kernel == Kernel::moe_matvec && loop != 0) {
      p.loop_groups = loop;
      dispatch(kernel, binds, &p, sizeof p, loop, 1, slots);
      return;
    }
    const auto [gx, gy] = grid(blocks);
    dispatch(kernel, binds, &p, sizeof p, gx, gy, slots);
  }

  // y[t * top_k + j] = down(GeGLU(gate x[t], up x[t])) of row t's j-th routed expert.
  Mat expert_products_on_device(const GpuExpertBank& bank, Mat x, const Buffer& routes, int top_k) {
    const int64_t slots = x.rows * top_k;
    const int64_t inter = bank.intermediate;
    const size_t count = static_cast<size_t>(slots);
    const Binding ids = route_ids(dev_of(routes), count);
    Mat gu = scratch(moe_gate_up_, slots, 2 * inter);
    Mat y = scratch(moe_out_, slots, bank.hidden);
    moe_matvec(bank.gate_up, bank, x, u32(top_k), ids, u32(slots), gu);
    // The down product reads GeGLU(gate, up) straight from gu (its staging computes it).
    moe_matvec(bank.down, bank, gu.col_range(0, inter), 1, ids, u32(slots), y, u32(inter));
    return y;
  }

  // out[t] = the sum of the products y[t * top_k + j] weighted by the routes' weights, added in
  // ascending expert id as the routes' ids order them (moe_combine.comp): the one combine of the
  // resident bank's decode path and the expert slots' (whose y rows are the same entries).
  void combine_on_device(Mat y, const DeviceBuffer& routes, int top_k, Mat out) {
    const size_t count = static_cast<size_t>(out.rows) * static_cast<size_t>(top_k);
    const Binding ids = route_ids(routes, count), weights = route_weights(routes, count);
    const View vy = view(y), vo = view(out);
    MoeCombineParams p{u32(out.rows), u32(out.cols), u32(top_k),     vy.offset,
                       u32(y.stride), vo.offset,     u32(out.stride)};
    touch({vy.b.buffer, &routes}, {vo.b.buffer});
    const Binding binds[] = {vy.b, ids, weights, vo.b};
    dispatch_linear(Kernel::moe_combine, binds, &p, sizeof p,
                    (static_cast<uint64_t>(out.rows) * out.cols + 63) / 64);
  }

  // Whether the prefill products of this bank take moe_matmul (every expert's tiles in one
  // dispatch): each of its sections must fit one binding, as for moe_matvec.
  bool grouped_products(const GpuExpertBank& bank) const {
    return grouped_experts_ && fits_one_binding(bank.gate_up) && fits_one_binding(bank.down);
  }

  // The grouped rows first..first + rows - 1 that expert (or slot) e computes.
  struct ExpertRun {
    uint32_t e, first, rows;
  };

  // The routed experts' prefill work, one row per routed entry: the gathered input, the gate/up
  // product, its GeGLU, and each entry's product.
  struct ExpertWork {
    Mat in, gu, h, y;
  };
  ExpertWork expert_work(const GpuExpertBank& bank, int64_t rows) {
    return {scratch(moe_in_, rows, bank.hidden), scratch(moe_gate_up_, rows, 2 * bank.intermediate),
            scratch(moe_hidden_, rows, bank.intermediate), scratch(moe_out_, rows, bank.hidden)};
  }

  // The routed experts' prefill products, a few dispatches whatever the number of experts:
  // in[i] = x[rows[i]] (the entries grouped by expert), gu = in W_gate_up of each row's expert,
  // h = GeGLU(gu), y = h W_down, each product one moe_matmul (or moe_matmul_tiled) dispatch over
  // a table of the runs' tiles (rows no run covers are left as they are). The tile comes from
  // rows_per_expert (choose_grouped_matmul_tile).
  void grouped_expert_products(const GpuExpertBank& bank, Mat x, std::span<const int32_t> rows,
                               std::span<const ExpertRun> runs, int64_t rows_per_expert,
                               const ExpertWork& w) {
    const int64_t inter = bank.intermediate;
    if (runs.empty()) return;
    const gpu::MatmulTile tile = gpu::choose_grouped_matmul_tile(dev_->info(), rows_per_expert);
    // moe_matmul.comp's table: per tile of up to tile.tokens rows, (e, first row, rows).
    std::vector<uint32_t> tiles;
    for (const ExpertRun& run : runs)
      for (uint32_t r = 0; r < run.rows; r += tile.tokens) {
        tiles.push_back(run.e);
        tiles.push_back(run.first + r);
        tiles.push_back(std::min(tile.tokens, run.rows - r));
      }
    // The table before the gather: both uploads go into the ring ahead of any read of it.
    const Binding table = upload_host(tiles.data(), tiles.size() * sizeof(uint32_t));
    gather_rows(x, rows, w.in);
    moe_matmul(bank.gate_up, w.in, w.gu, table, tiles.size() / 3, tile);
    gelu_tanh_mul(w.gu.col_range(0, inter), w.gu.col_range(inter, inter), w.h);
    moe_matmul(bank.down, w.h, w.y, table, tiles.size() / 3, tile);
  }

  // y[i] = W_e x[i] for the rows of every tile (e, first, count) of the table (moe_matmul.comp,
  // or moe_matmul_tiled.comp / moe_matmul_tiled_r8.comp for a register tile).
  void moe_matmul(const StackedExperts& s, Mat x, Mat y, const Binding& table, size_t tiles,
                  const gpu::MatmulTile& tile) {
    if (x.cols != s.cols || y.cols != s.rows || x.rows != y.rows)
      throw std::logic_error("moe_matmul: shape mismatch");
    const View vx = view(x), vy = view(y);
    MoeMatmulParams p{u32(s.rows),
                      u32(s.cols),
                      s.bits,
                      s.group_size,
                      s.scale_type,
                      u32(static_cast<int64_t>(s.packed_stride / 4)),
                      u32(static_cast<int64_t>(s.scale_stride / s.scale_bytes)),
                      vx.offset,
                      u32(x.stride),
                      vy.offset,
                      u32(y.stride),
                      0,
                      tile.tiled ? tile.rows : 0};
    touch({vx.b.buffer, table.buffer, s.buf.get()}, {vy.b.buffer});
    const Binding binds[] = {
        Binding{s.buf.get(), 0, s.scales_offset},
        Binding{s.buf.get(), s.scales_offset, s.biases_offset - s.scales_offset},
        Binding{s.buf.get(), s.biases_offset, s.buf->size_bytes() - s.biases_offset},
        vx.b,
        vy.b,
        table};
    const auto row_tiles = u32((s.rows + tile.rows - 1) / tile.rows);
    const auto count = u32(static_cast<int64_t>(tiles));
    const Kernel kernel = !tile.tiled ? Kernel::moe_matmul
                          : tile.r8   ? Kernel::moe_matmul_tiled_r8
                                      : Kernel::moe_matmul_tiled;
    for (uint32_t t0 = 0; t0 < count; t0 += 65535) {
      p.tile0 = t0;
      dispatch(kernel, binds, &p, sizeof p, row_tiles, std::min(count - t0, 65535u), 1);
    }
  }

  // out[t] = the weighted sum of token t's products, which y holds in the prefill layout
  // (entries_by_expert's order): one gather of y's rows into entry order, then moe_combine (the
  // decode path's combine: ascending expert id from zero, the scatter's order of accumulation),
  // two dispatches where a scatter per expert took one each.
  void combine_grouped(Mat y, std::span<const int32_t> ids, const DeviceBuffer& routes, int top_k,
                       Mat out) {
    std::vector<int32_t> row_of(ids.size());
    int32_t r = 0;
    for (const auto& [e, group] : entries_by_expert(ids))
      for (int64_t j : group) row_of[static_cast<size_t>(j)] = r++;
    // moe_in_: the products' input, done with by now (each expert call gathers it again).
    Mat entry_order = scratch(moe_in_, static_cast<int64_t>(ids.size()), y.cols);
    gather_rows(y, row_of, entry_order);
    combine_on_device(entry_order, routes, top_k, out);
  }

  void experts_grouped_on_host(const GpuExpertBank& bank, Mat x, const Buffer& routes, int top_k,
                               Mat out) {
    const size_t count = static_cast<size_t>(x.rows) * static_cast<size_t>(top_k);
    // The layer's one round trip (group_routes_by_expert's reads, the ids kept for the combine).
    std::vector<int32_t> ids(count);
    std::vector<float> weights(count);
    download(routes, 0, ids.data(), count * sizeof(int32_t));
    download(routes, route_weights_offset(count), weights.data(), count * sizeof(float));
    const ExpertRowGroups groups = group_expert_rows(ids, weights, x.rows, top_k, bank.num_experts);
    const int64_t rows = static_cast<int64_t>(count);
    const int64_t inter = bank.intermediate;
    const ExpertWork w = expert_work(bank, rows);
    // fn(expert, its entries, its first row in the stacked work buffers, its row count), experts
    // ascending: the stacked order of every pass below.
    const auto each_expert = [&groups](auto&& fn) {
      int64_t r0 = 0;
      for (const auto& [e, group] : groups) {
        const int64_t n = static_cast<int64_t>(group.first.size());
        fn(e, group.first, r0, n);
        r0 += n;
      }
    };
    if (grouped_products(bank)) {
      std::vector<int32_t> order;
      std::vector<ExpertRun> runs;
      each_expert([&](int32_t e, const std::vector<int32_t>& entries, int64_t r0, int64_t n) {
        runs.push_back({u32(e), u32(r0), u32(n)});
        order.insert(order.end(), entries.begin(), entries.end());
      });
      grouped_expert_products(bank, x, order, runs, rows / static_cast<int64_t>(groups.size()), w);
    } else {
      // The bank is too large for one binding per section (or REDWING_GPU_MOE_PREFILL=per-expert):
      // each expert's products on its own, each pass over every expert before the next.
      each_expert([&](int32_t, const std::vector<int32_t>& entries, int64_t r0, int64_t n) {
        gather_rows(x, entries, w.in.row_range(r0, n));
      });
      each_expert([&](int32_t e, const std::vector<int32_t>&, int64_t r0, int64_t n) {
        qmatmul(*bank.gate_up.views[static_cast<size_t>(e)], w.in.row_range(r0, n),
                w.gu.row_range(r0, n));
      });
      gelu_tanh_mul(w.gu.col_range(0, inter), w.gu.col_range(inter, inter), w.h);
      each_expert([&](int32_t e, const std::vector<int32_t>&, int64_t r0, int64_t n) {
        qmatmul(*bank.down.views[static_cast<size_t>(e)], w.h.row_range(r0, n),
                w.y.row_range(r0, n));
      });
    }
    combine_grouped(w.y, ids, dev_of(routes), top_k, out);
  }

  // A [rows, cols] view of a backend scratch buffer, grown when too small.
  Mat scratch(std::unique_ptr<Buffer>& b, int64_t rows, int64_t cols) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(rows * cols, 1)) * sizeof(float);
    if (!b || b->size_bytes() < bytes) b = alloc(bytes);
    return Mat{b.get(), 0, rows, cols, cols};
  }

  // A Mat bound for a kernel: the binding and the view's first element inside it.
  struct View {
    Binding b;
    uint32_t offset;
  };

  View view(const Mat& m) const {
    if (m.buf == nullptr) throw std::logic_error("Mat without a buffer");
    const DeviceBuffer& d = dev_of(*m.buf);
    const size_t size = d.size_bytes();
    const size_t first = static_cast<size_t>(m.offset) * sizeof(float);
    size_t end = first;
    if (m.rows > 0) {
      const int64_t last = m.offset + (m.rows - 1) * m.stride + m.cols;
      if (m.offset < 0 || m.cols > m.stride || static_cast<size_t>(last) * sizeof(float) > size)
        throw std::logic_error("Mat view outside its buffer");
      end = static_cast<size_t>(last) * sizeof(float);
    }
    const size_t start = first / align_ * align_;
    const size_t bytes = std::min<size_t>(size - start, max_binding_);
    if (end - start > bytes)
      throw std::logic_error("gpu: a view larger than one storage binding (" +
                             std::to_string(max_binding_) + " bytes)");
    return {Binding{&d, start, bytes}, u32(static_cast<int64_t>((first - start) / sizeof(float)))};
  }

  // What a checked tail (ffn_tail's arguments) binds, and the buffers it reads and writes for
  // the hazard check: ffn_tail.comp's and qmatvec_tail.comp's inputs. Without the next layer's
  // norm, h and w4 stay empty.
  struct TailInputs {
    View m, e, x, h;
    Binding w1, w2, w3, w4, ids, weights;
    std::vector<const DeviceBuffer*> reads, writes;
  };
  TailInputs tail_inputs(Mat experts, const DeviceBuffer* routes, int top_k, const FfnTail& t) {
    TailInputs in{};  // (value-initialized: h's offset is 0 without the next norm)
    in.m = view(t.m);
    in.e = view(experts);
    in.x = view(t.x);
    const DeviceBuffer &w1 = dev_of(*t.dense_norm), &w2 = dev_of(*t.experts_norm),
                       &w3 = dev_of(*t.ffn_norm);
    in.w1 = whole(w1);
    in.w2 = whole(w2);
    in.w3 = whole(w3);
    in.reads = {in.m.b.buffer, in.e.b.buffer, in.x.b.buffer, &w1, &w2, &w3};
    in.writes = {in.x.b.buffer};
    if (routes) {
      const size_t count = static_cast<size_t>(t.m.rows) * static_cast<size_t>(top_k);
      in.reads.push_back(routes);
      in.ids = route_ids(*routes, count);
      in.weights = route_weights(*routes, count);
    }
    if (t.next_norm) {
      const DeviceBuffer& w4 = dev_of(*t.next_norm);
      in.h = view(t.next);
      in.w4 = whole(w4);
      in.reads.push_back(&w4);
      in.writes.push_back(in.h.b.buffer);
    }
    return in;
  }

  // The ids and the weights of `count` routed entries in a routes buffer (route_to's layout).
  static Binding route_ids(const DeviceBuffer& routes, size_t count) {
    return Binding{&routes, 0, count * sizeof(int32_t)};
  }
  static Binding route_weights(const DeviceBuffer& routes, size_t count) {
    return Binding{&routes, route_weights_offset(count), count * sizeof(float)};
  }

  Binding whole(const DeviceBuffer& d) const {
    if (d.size_bytes() > max_binding_)
      throw std::logic_error("gpu: a buffer larger than one storage binding");
    return Binding{&d, 0, d.size_bytes()};
  }

  // Calls fn(r0, n, packed, scales, biases, scale0) for chunks of rows whose packed words fit
  // one binding.
  template <typename F>
  void for_each_chunk(const GpuQWeight& w, F&& fn) {
    const int64_t groups = w.cols / w.group_size;
    int64_t chunk = w.rows;
    if (static_cast<uint64_t>(w.row_bytes) * static_cast<uint64_t>(w.rows) > max_binding_) {
      chunk = static_cast<int64_t>(max_binding_ / w.row_bytes) / 256 * 256;
      if (chunk == 0) throw std::logic_error("gpu: a weight row larger than one binding");
    }
    for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
      const int64_t n = std::min(chunk, w.rows - r0);
      const size_t p0 = w.packed_offset + static_cast<size_t>(r0) * w.row_bytes;
      const size_t s_first = static_cast<size_t>(r0 * groups) * w.scale_bytes;
      const size_t s_bytes = static_cast<size_t>(n * groups) * w.scale_bytes;
      const size_t s_start = s_first / align_ * align_;  // sections are 256-aligned
      const uint32_t scale0 = u32(static_cast<int64_t>((s_first - s_start) / w.scale_bytes));
      const size_t s_range = align_up(s_first - s_start + s_bytes, 4);
      fn(r0, n, Binding{w.buf.get(), p0, static_cast<size_t>(n) * w.row_bytes},
         Binding{w.buf.get(), w.scales_offset + s_start, s_range},
         Binding{w.buf.get(), w.biases_offset + s_start, s_range}, scale0);
    }
  }

  // Host data for the next op, in the upload ring (reused after each submission).
  Binding upload_host(const void* data, size_t bytes) {
    if (dev_->submissions() != ring_epoch_) {
      ring_epoch_ = dev_->submissions();
      ring_used_ = 0;
    }
    const size_t need = align_up(std::max<size_t>(bytes, 4), align_);
    if (!ring_ || ring_used_ + need > ring_->size_bytes()) {
      // A new ring; the old one is released once the recorded work that reads it has run.
      ring_ = dev_->create_buffer(std::max<size_t>(need, 4u << 20));
      ring_used_ = 0;
    }
    const Binding b{ring_.get(), ring_used_, bytes};
    touch({}, {ring_.get()});
    dev_->write(*ring_, ring_used_, data, bytes);
    ring_used_ += need;
    return b;
  }

  // Hazard tracking: records a barrier when this op reads something written since the last
  // barrier, or writes something read or written since then.
  void touch(std::initializer_list<const DeviceBuffer*> reads,
             std::initializer_list<const DeviceBuffer*> writes) {
    touch(std::vector<const DeviceBuffer*>(reads), std::vector<const DeviceBuffer*>(writes));
  }
  void touch(const std::vector<const DeviceBuffer*>& reads,
             const std::vector<const DeviceBuffer*>& writes) {
    settle_tail();  // every op but the products that take it touches its buffers first
    if (dev_->submissions() != hazard_epoch_) {
      hazard_epoch_ = dev_->submissions();
      written_.clear();
      read_.clear();
    }
    bool hazard = false;
    for (auto* r : reads) hazard = hazard || written_.count(r);
    for (auto* w : writes) hazard = hazard || written_.count(w) || read_.count(w);
    if (hazard) {
      dev_->barrier();
      ++barriers_;
      written_.clear();
      read_.clear();
    }
    for (auto* r : reads) read_.insert(r);
    for (auto* w : writes) written_.insert(w);
  }
  void after_flush() {
    written_.clear();
    read_.clear();
  }

  static std::pair<uint32_t, uint32_t> grid(uint64_t groups) {
    const uint64_t gx = std::min<uint64_t>(groups, 65535);
    return {static_cast<uint32_t>(gx), static_cast<uint32_t>((groups + gx - 1) / gx)};
  }
  void dispatch(Kernel k, std::span<const Binding> binds, const void* push, size_t bytes,
                uint32_t gx, uint32_t gy, uint32_t gz) {
    settle_tail();  // (recorded already by the op's touch, unless the op touches nothing)
    ++dispatches_;
    dev_->dispatch(k, binds, push, bytes, gx, gy, gz);
  }
  void dispatch_linear(Kernel k, std::span<const Binding> binds, const void* push, size_t bytes,
                       uint64_t groups) {
    if (groups == 0) return;
    const auto [gx, gy] = grid(groups);
    dispatch(k, binds, push, bytes, gx, gy, 1);
  }

  // rms_norm, or y = (y + rms_norm(x)) * acc_scale with accumulate (add_rms_norm).
  // With weight2 and y2, also y2 = rms_norm(x, weight2) (rms_norm_pair); with col_scale,
  // y = (rms_norm(x) * weight) * col_scale instead (rms_norm_mul_cols).
  // With then_pair, also (rms_norm.comp's then_pair) the two norms of y's new row.
  struct NormPair {
    const Buffer *weight1, *weight2;
    Mat y1, y2;
  };
  void norm(Mat x, const Buffer* weight, float offset, float eps, Mat y, bool accumulate,
            float acc_scale, const Buffer* weight2 = nullptr, const Mat* y2 = nullptr,
            std::optional<float> col_scale = std::nullopt, const NormPair* then_pair = nullptr) {
    check_same_shape(x, y, "rms_norm");
    if (weight && weight->size_bytes() < sizeof(float) * x.cols)
      throw std::logic_error("rms_norm: weight too short");
    if (x.rows == 0) return;
    const View vx = view(x), vy = view(y);
    const View vy2 = y2 ? view(*y2) : View{};
    NormParams p{u32(x.rows),
                 u32(x.cols),
                 vx.offset,
                 u32(x.stride),
                 vy.offset,
                 u32(y.stride),
                 col_scale ? 2u
                 : weight  ? 1u
                           : 0u,
                 offset,
                 eps,
                 accumulate ? 1u : 0u,
                 acc_scale,
                 y2 ? 1u : 0u,
                 y2 ? vy2.offset : 0u,
                 y2 ? u32(y2->stride) : 0u,
                 col_scale.value_or(1.0f)};
    const Binding wb = weight ? whole(dev_of(*weight)) : Binding{};
    const Binding wb2 = weight2 ? whole(dev_of(*weight2)) : Binding{};
    std::vector<const DeviceBuffer*> reads{vx.b.buffer};
    if (weight) reads.push_back(&dev_of(*weight));
    if (weight2) reads.push_back(&dev_of(*weight2));
    if (accumulate) reads.push_back(vy.b.buffer);
    std::vector<const DeviceBuffer*> writes{vy.b.buffer};
    if (y2) writes.push_back(vy2.b.buffer);
    View vy3{}, vy4{};
    Binding wb3{}, wb4{};
    if (then_pair) {
      vy3 = view(then_pair->y1);
      vy4 = view(then_pair->y2);
      wb3 = whole(dev_of(*then_pair->weight1));
      wb4 = whole(dev_of(*then_pair->weight2));
      p.then_pair = 1;
      p.y3_offset = vy3.offset;
      p.y3_stride = u32(then_pair->y1.stride);
      p.y4_offset = vy4.offset;
      p.y4_stride = u32(then_pair->y2.stride);
      reads.push_back(wb3.buffer);
      reads.push_back(wb4.buffer);
      writes.push_back(vy3.b.buffer);
      writes.push_back(vy4.b.buffer);
    }
    touch(reads, writes);
    const Binding binds[] = {vx.b, wb, vy.b, wb2, vy2.b, wb3, vy3.b, wb4, vy4.b};
    dispatch_linear(Kernel::rms_norm, binds, &p, sizeof p, static_cast<uint64_t>(x.rows));
  }

  // The RoPE table exactly as the CPU backend computes it (backend.h), so both rotate by the
  // same bits: per row, cos of every pair then sin of every pair; in the upload ring.
  // The last table is reused while it is still in the ring: q and k of a layer rotate by the
  // same table, and a second upload would be a write into the ring after the barrier that q's
  // rotation needs, i.e. one more dependent step for k's.
  Binding rope_table(int64_t rows, int head_dim, const RopeParams& rp, int64_t pos0) {
    const RopeTables::Key table = RopeTables::key(rows, head_dim, rp, pos0);
    if (last_rope_ && last_rope_->first == RopeKey{table, dev_->submissions(), ring_.get()})
      return last_rope_->second;
    const std::span<const float> values = rope_tables_.get(rows, head_dim, rp, pos0);
    const Binding b = upload_host(values.data(), values.size_bytes());
    last_rope_.emplace(RopeKey{table, dev_->submissions(), ring_.get()}, b);
    return b;
  }
  struct RopeKey {
    RopeTables::Key table;
    uint64_t epoch;  // the submission the upload ring is in
    const DeviceBuffer* ring;
    bool operator==(const RopeKey&) const = default;
  };
  std::optional<std::pair<RopeKey, Binding>> last_rope_;
  RopeTables rope_tables_;  // computed once per chunk and layer kind

  void elementwise(ElementOp op, Mat a, Mat b, Mat out, const Buffer* v, float s) {
    if (out.rows == 0 || out.cols == 0) return;
    const View va = view(a), vb = view(b), vo = view(out);
    ElementParams p{op,        u32(out.rows), u32(out.cols), va.offset,       u32(a.stride),
                    vb.offset, u32(b.stride), vo.offset,     u32(out.stride), s};
    std::vector<const DeviceBuffer*> reads{va.b.buffer, vb.b.buffer};
    if (v) reads.push_back(&dev_of(*v));
    touch(reads, {vo.b.buffer});
    const Binding binds[] = {va.b, vb.b, vo.b, v ? whole(dev_of(*v)) : Binding{}};
    dispatch_linear(Kernel::elementwise, binds, &p, sizeof p,
                    (static_cast<uint64_t>(out.rows) * out.cols + 255) / 256);
  }

  void print_profile() const {
    const auto times = dev_->kernel_times();
    double total = 0;
    for (const auto& t : times) total += t.ms;
    std::fprintf(stderr, "gpu profile (%s, %llu submissions): %.3f ms in kernels\n",
                 dev_->info().name.c_str(), static_cast<unsigned long long>(dev_->submissions()),
                 total);
    const gpu::Device::HostTimes host = dev_->host_times();
    std::fprintf(stderr, "  host: %.3f ms recording, %.3f ms submitting, %.3f ms in %llu waits\n",
                 host.record_ms, host.submit_ms, host.wait_ms,
                 static_cast<unsigned long long>(host.waits));
    // The experts' down product's shape (rows per team, lanes, words in flight; reduction).
    const gpu::DeviceInfo& info = dev_->info();
    const gpu::MatvecShape& m = info.matvec_down;
    std::fprintf(stderr, "  matvec_down shape %u,%u,%u (%s), %u threads, subgroup size %u\n",
                 m.rows_per_team, m.lanes, m.unroll,
                 m.subgroup_reduce ? "subgroupAdd" : "shared memory", info.workgroup_threads,
                 info.subgroup_size);
    for (size_t k = 0; k < times.size(); ++k)
      if (times[k].dispatches > 0)
        std::fprintf(stderr, "  %-18s %8llu dispatches %10.3f ms %5.1f%%\n",
                     gpu::kernel_name(static_cast<Kernel>(k)),
                     static_cast<unsigned long long>(times[k].dispatches), times[k].ms,
                     total > 0 ? 100.0 * times[k].ms / total : 0.0);
  }

  bool profile_ = false;
  enum class FoldNorms { none, small, all };
  static constexpr int64_t kFoldSmallRows = 1024;  // REDWING_GPU_FOLD_NORMS=small's limit
  FoldNorms fold_norms_ = FoldNorms::small;
  bool fold_geglu_ = true, fuse_tail_ = true, fuse_kv_ = true, fuse_router_ = true,
       fuse_norm_pair_ = true, fuse_heads_ = true, inputs_in_attention_ = true,
       prefetch_kv_ = false, tail_in_next_products_ = false;
  bool grouped_experts_ = true;  // REDWING_GPU_MOE_PREFILL (moe_matmul where the bank fits)
  uint64_t dispatches_ = 0;
  uint64_t barriers_ = 0;
  std::unique_ptr<gpu::Device> dev_;
  uint64_t align_ = 16;
  uint64_t max_binding_ = 0;
  std::unique_ptr<DeviceBuffer> ring_;
  size_t ring_used_ = 0;
  uint64_t ring_epoch_ = UINT64_MAX;
  std::unique_ptr<DeviceBuffer> partials_;
  std::unique_ptr<DeviceBuffer> attention_counters_;  // attention's arrival counters (merge)
  std::unique_ptr<DeviceBuffer> route_out_;
  // router.comp's and qmatvec_norms.comp's arrival counters, one per token (0 between
  // dispatches).
  std::unique_ptr<DeviceBuffer> router_counters_, norms_counters_;
  // qmatvec_heads.comp's, one per (token, head) of q, then of k, then of v.
  std::unique_ptr<DeviceBuffer> heads_counters_;
  // qmatvec_tail.comp's arrival counter, then the new residual its writer parks.
  std::unique_ptr<DeviceBuffer> tail_counters_;
  // A decode row's feed-forward end not yet recorded: the next layer's q/k/v products compute it
  // (products_with_tail), or the next op that is anything else records it first (settle_tail).
  struct PendingTail {
    Mat experts;
    const DeviceBuffer* routes;
    int top_k;
    FfnTail tail;
  };
  std::optional<PendingTail> pending_tail_;
  std::unique_ptr<Buffer> moe_in_, moe_gate_up_, moe_hidden_, moe_out_;
  bool slot_decode_path_ = false;  // how the last slot_expert_products ran (for the combine)
  std::unique_ptr<DeviceBuffer> sample_partials_, sample_result_;
  std::unordered_set<const DeviceBuffer*> written_, read_;
  uint64_t hazard_epoch_ = UINT64_MAX;
};

}  // namespace

std::unique_ptr<Backend> make_gpu_backend(std::unique_ptr<gpu::Device> device) {
  return std::make_unique<GpuBackend>(std::move(device));
}

gpu::Device* gpu_device_of(Backend& backend) {
  auto* g = dynamic_cast<GpuBackend*>(&backend);
  return g ? &g->device() : nullptr;
}

}  // namespace redwing
