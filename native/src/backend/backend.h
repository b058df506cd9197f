// The compute backend interface: everything the model code asks of a device.
//
// Activations live in backend-owned buffers (Buffer) and are addressed through Mat views;
// weights are imported once from host memory (QWeight). The model code never dereferences a
// buffer: a CPU backend keeps them in RAM, a GPU backend in device memory, and only upload(),
// download() and route() move data between the host and the backend. Activations and
// accumulations are float32 throughout.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/host_tensor.h"

namespace redwing {

// Backend memory. Opaque to the model code.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual size_t size_bytes() const = 0;
};

// What a quantized matrix is for in the model: the activation plan (below) picks the input
// precision of each product by it.
enum class ProductKind : uint8_t { other, attention, mlp, router, experts, head };
inline constexpr int kProductKinds = 6;

// A quantized weight matrix [rows, cols] imported into a backend.
class QWeight {
 public:
  virtual ~QWeight() = default;
  int64_t rows = 0;
  int64_t cols = 0;
  ProductKind kind = ProductKind::other;  // set by the model after import
};

// A float32 matrix view: `rows` rows of `cols` values, row r starting at element
// offset + r * stride of `buf`.
struct Mat {
  Buffer* buf = nullptr;
  int64_t offset = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;

  Mat row(int64_t r) const { return {buf, offset + r * stride, 1, cols, stride}; }
  Mat row_range(int64_t r0, int64_t n) const {
    return {buf, offset + r0 * stride, n, cols, stride};
  }
  Mat col_range(int64_t c0, int64_t n) const { return {buf, offset + c0, rows, n, stride}; }
  // A contiguous [rows, k*m] view seen as [rows*k, m] (per-head operations).
  Mat split_rows(int64_t m) const { return {buf, offset, rows * (cols / m), m, m}; }
  bool contiguous() const { return stride == cols; }
};

// RoPE of one layer (docs/format.md): half-split pairs (j, j + head_dim/2); for
// j < rotary_pairs inv_freq[j] = 1 / theta^(2j / freq_dim) / scale (float32, as transformers),
// angle = position * inv_freq[j]; pairs at or past rotary_pairs do not rotate.
struct RopeParams {
  double theta = 10000.0;
  int rotary_pairs = 0;
  int freq_dim = 0;
  double scale = 1.0;
};

// inv_freq of RopeParams for head_dim / 2 pairs, exactly as transformers computes it in float32:
// 1 / (theta ** (arange(0, 2 * pairs, 2) / freq_dim)) / scale, and 0 (no rotation) at or past
// rotary_pairs. Every backend builds its tables from this, so all rotate by the same bits.
inline std::vector<float> rope_inv_freq(const RopeParams& p, int head_dim) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half), 0.0f);
  const float theta = static_cast<float>(p.theta);
  for (int j = 0; j < std::min(p.rotary_pairs, half); ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(p.freq_dim);
    inv_freq[static_cast<size_t>(j)] =
        (1.0f / std::pow(theta, exponent)) / static_cast<float>(p.scale);
  }
  return inv_freq;
}

// cos and sin of position * inv_freq[j] in float32 (transformers: inv_freq @ position_ids), into
// c[j] and s[j] for every pair j.
inline void rope_cos_sin(std::span<const float> inv_freq, int64_t position, float* c, float* s) {
  const float pos = static_cast<float>(position);
  for (size_t j = 0; j < inv_freq.size(); ++j) {
    const float angle = pos * inv_freq[j];
    c[j] = std::cos(angle);
    s[j] = std::sin(angle);
  }
}

enum class KvDType : uint8_t { f16, f32 };

// Whether key position k is visible to query position q: causal, and within the sliding window
// of W keys (the current one included) when window > 0. Every attention implementation must
// follow exactly this rule.
inline bool kv_visible(int64_t q, int64_t k, int64_t window) {
  return k <= q && (window <= 0 || q - k < window);
}

// The keys and values of one layer as an attention op sees them. K and V each hold capacity x
// num_kv_heads x head_dim values in `dtype`, laid out as the backend's kv_store and attention
// agree (the CPU: head-major, [num_kv_heads, capacity, head_dim]; the GPU: [capacity,
// num_kv_heads, head_dim]). Position p sits in row p (linear) or p % capacity (ring: sliding
// layers keep only the last `capacity` positions).
struct KvLayerView {
  Buffer* k = nullptr;
  Buffer* v = nullptr;
  int64_t capacity = 0;
  bool ring = false;
  int64_t window = 0;  // 0 = full attention
  int num_kv_heads = 0;
  int head_dim = 0;
  KvDType dtype = KvDType::f32;

  int64_t slot(int64_t pos) const { return ring ? pos % capacity : pos; }
  // The oldest key position query position q can see.
  int64_t first_visible(int64_t q) const { return window > 0 && q >= window ? q - window + 1 : 0; }
};

// How quantized products treat their float32 input, per kind of product: exact multiplies it as
// it is; int8 quantizes it to 8 bits per block of 32 values first and uses integer dot products
// (faster on CPUs with VNNI or AVX2, and approximate: backend/cpu/kernels.h says how).
struct ActivationPlan {
  uint8_t int8_kinds = 0;  // bit k: products of ProductKind k take 8-bit inputs

  static constexpr ActivationPlan exact() { return {}; }
  static constexpr ActivationPlan all_int8() {
    return {static_cast<uint8_t>((1u << kProductKinds) - 1)};
  }
  static constexpr ActivationPlan int8_on(std::initializer_list<ProductKind> kinds) {
    ActivationPlan p;
    for (ProductKind k : kinds) p.int8_kinds |= static_cast<uint8_t>(1u << static_cast<int>(k));
    return p;
  }
  constexpr bool int8(ProductKind k) const { return (int8_kinds >> static_cast<int>(k)) & 1u; }
  constexpr bool any_int8() const { return int8_kinds != 0; }
  constexpr bool operator==(const ActivationPlan&) const = default;
};
// "exact" (every product float32), "int8" (every product 8-bit), or a comma-separated list of
// the kinds that take 8-bit inputs, the rest exact: attention, mlp, router, experts, head (so
// "head" is the output head alone). Throws std::invalid_argument otherwise.
ActivationPlan parse_activation_plan(const std::string& s);
// The canonical spelling: "exact", "int8", or the kinds in the order above ("attention,head").
std::string activation_plan_name(ActivationPlan p);

// Every expert of one MoE layer, imported together (Backend::import_experts). The default
// bank holds each expert's matrices as ordinary weights; a GPU backend stacks them so that a
// kernel can pick an expert by an id it reads from device memory.
class ExpertBank {
 public:
  virtual ~ExpertBank() = default;
  int num_experts = 0;
  int64_t hidden = 0, intermediate = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // A short description for diagnostics (e.g. "cpu avx2 fma f16c, 8 threads").
  virtual std::string describe() const = 0;
  // Device memory this backend holds now (weights, KV cache, activations), counted apart from
  // the process's host memory; 0 for backends whose buffers are host memory (the CPU).
  virtual uint64_t device_memory_bytes() const { return 0; }
  // Work a queueing backend (a GPU) has recorded since it was made, for benchmarks: command
  // submissions (each one a host wait) and kernel dispatches. Zero for the CPU.
  struct WorkCounters {
    uint64_t submissions = 0;
    uint64_t dispatches = 0;
    // Barriers recorded between dispatches: each starts a new level of dependent work, which
    // waits for everything before it (a GPU drains between levels).
    uint64_t barriers = 0;
    // Host time in the GPU's device layer (Device::HostTimes): recording commands, submitting
    // them, and waiting for the GPU (each read-back waits).
    double record_ms = 0, submit_ms = 0, wait_ms = 0;
  };
  virtual WorkCounters work_counters() const { return {}; }
  // Device time per kernel since the backend was made, where it measures it (a GPU backend with
  // REDWING_GPU_PROFILE=1); empty otherwise.
  struct KernelTiming {
    std::string kernel;
    uint64_t dispatches = 0;
    double ms = 0;
  };
  virtual std::vector<KernelTiming> kernel_timings() const { return {}; }

  // Host memory a GPU backend reads in place when expert slots are filled from it (the expert
  // store's host slots, ExpertStore::host_blocks): no staging copy on the host, the GPU's copy
  // engine reads it. The bytes must not change from a fill_expert_slot() call until the next
  // download returns. Null where the backend cannot (the CPU: nothing to copy; a GPU without the
  // capability): fills then stage as before. The memory stays mapped until the handle goes,
  // which must be before the memory is freed and before the backend goes.
  class HostMapping {
   public:
    virtual ~HostMapping() = default;
  };
  virtual std::unique_ptr<HostMapping> map_host_memory(std::span<const std::byte> block) {
    return nullptr;
  }

  // Starts the work recorded so far without waiting for it, so the host can compute beside it
  // (hybrid experts); the next download waits for it. Nothing to do where ops run as they come
  // (the CPU).
  virtual void submit() {}

  // ---- memory ----
  // Zero-initialized backend memory.
  virtual std::unique_ptr<Buffer> alloc(size_t bytes) = 0;
  virtual void upload(Buffer& dst, size_t dst_offset_bytes, const void* src, size_t bytes) = 0;
  virtual void download(const Buffer& src, size_t src_offset_bytes, void* dst, size_t bytes) = 0;
  // Imports a quantized matrix from host memory. The backend may keep referring to the host
  // memory (the CPU backend does), so it must outlive the returned weight.
  virtual std::unique_ptr<QWeight> import_qweight(const HostQuantMatrix& m) = 0;
  // A matrix the model keeps for its whole life, from a read-only file mapping (the resident
  // weights): the backend may copy it into the layout its kernels read fastest and hand the
  // mapping's pages back. By default import_qweight.
  virtual std::unique_ptr<QWeight> import_resident_qweight(const HostQuantMatrix& m) {
    return import_qweight(m);
  }
  // The packed-row layout this backend reads fastest from host memory
  // (HostQuantMatrix::row_group): 1, or 4 where the CPU backend's kernels read row groups. A
  // source that owns writable copies of its matrices (resident experts) lays them out so with
  // lay_out_rows, which rewrites rows * words_per_row packed words in place.
  virtual int preferred_row_group() const { return 1; }
  virtual void lay_out_rows(uint32_t* packed, int64_t rows, int64_t words_per_row) const {}

  // ---- element-wise and per-row ops (x and y may be the same view unless stated) ----
  virtual void fill_zero(Mat x) = 0;
  virtual void copy(Mat src, Mat dst) = 0;
  // out = a + b
  virtual void add(Mat a, Mat b, Mat out) = 0;
  // x *= s
  virtual void scale(Mat x, float s) = 0;
  // x[r, c] = (x[r, c] * v[c]) * s, v a float32 buffer of x.cols values.
  virtual void mul_cols(Mat x, const Buffer& v, float s) = 0;
  // Per row: y = x * (mean(x^2) + eps)^-1/2 * (weight_offset + weight); weight is a float32
  // buffer of x.cols values, or null for a weightless norm.
  virtual void rms_norm(Mat x, const Buffer* weight, float weight_offset, float eps, Mat y) = 0;
  // y = (rms_norm(x) without a weight * v) * s, v a float32 buffer of x.cols values (Gemma 4's
  // router input). The default runs rms_norm then mul_cols; a GPU fuses them.
  virtual void rms_norm_mul_cols(Mat x, float eps, const Buffer& v, float s, Mat y) {
    rms_norm(x, nullptr, 0.0f, eps, y);
    mul_cols(y, v, s);
  }
  // Two norms of the same x with different weights: y1 = rms_norm(x, weight1), y2 =
  // rms_norm(x, weight2) (Gemma 4's dense-MLP and experts' pre-norms of the residual); y1 may
  // be x, y2 may not. The default runs rms_norm twice (y2 first); a GPU computes the mean square
  // once, in one dispatch.
  virtual void rms_norm_pair(Mat x, const Buffer* weight1, const Buffer* weight2,
                             float weight_offset, float eps, Mat y1, Mat y2) {
    rms_norm(x, weight2, weight_offset, eps, y2);
    rms_norm(x, weight1, weight_offset, eps, y1);
  }
  // acc = (acc + rms_norm(x)) * acc_scale (x and acc distinct views of the same shape). x is
  // left undefined: the default normalizes it in place, adds, then scales (when acc_scale != 1),
  // exactly as those ops; a GPU fuses them into one dispatch (a post-norm, the residual add
  // after it and Gemma 4's layer scalar).
  virtual void add_rms_norm(Mat x, const Buffer* weight, float weight_offset, float eps, Mat acc,
                            float acc_scale = 1.0f) {
    rms_norm(x, weight, weight_offset, eps, x);
    add(acc, x, acc);
    if (acc_scale != 1.0f) scale(acc, acc_scale);
  }
  // add_rms_norm(x, weight, ..., acc, acc_scale), then rms_norm_pair(acc, weight1, weight2, ...,
  // y1, y2): a post-norm and the residual add after it, then two pre-norms of the new residual
  // (Gemma 4's attention end and its feed-forward's norms). The default runs those two ops; a GPU
  // runs them in one dispatch (one dependent step less a layer).
  virtual void add_rms_norm_pair(Mat x, const Buffer* weight, float weight_offset, float eps,
                                 Mat acc, float acc_scale, const Buffer* weight1,
                                 const Buffer* weight2, Mat y1, Mat y2) {
    add_rms_norm(x, weight, weight_offset, eps, acc, acc_scale);
    rms_norm_pair(acc, weight1, weight2, weight_offset, eps, y1, y2);
  }
  // out = w * x (qmatmul), then add_rms_norm_pair(out, ...): attention's output product and
  // what follows it in a Gemma 4 MoE layer (out is left undefined). The default runs those two;
  // a GPU runs them in one dispatch.
  virtual void qmatmul_add_rms_norm_pair(const QWeight& w, Mat x, Mat out, const Buffer* weight,
                                         float weight_offset, float eps, Mat acc, float acc_scale,
                                         const Buffer* weight1, const Buffer* weight2, Mat y1,
                                         Mat y2) {
    qmatmul(w, x, out);
    add_rms_norm_pair(out, weight, weight_offset, eps, acc, acc_scale, weight1, weight2, y1, y2);
  }
  // The end of a Gemma 4 MoE layer's feed-forward, after its dense MLP (m) and its experts.
  struct FfnTail {
    Mat m;                                 // the dense MLP's output (left undefined)
    const Buffer* dense_norm = nullptr;    // post_feedforward_layernorm_1
    const Buffer* experts_norm = nullptr;  // post_feedforward_layernorm_2
    const Buffer* ffn_norm = nullptr;      // post_feedforward_layernorm
    float weight_offset = 0.0f;
    float eps = 0.0f;
    Mat x;  // the residual, updated
    float layer_scalar = 1.0f;
    // Optional: next = rms_norm(the updated x, next_norm), the next layer's input norm (so that
    // a GPU computes it while it holds x, not in a dependent step of its own).
    const Buffer* next_norm = nullptr;
    Mat next;
  };
  // m = rms_norm(m, dense_norm), then add_rms_norm(experts, experts_norm, m), then
  // add_rms_norm(m, ffn_norm, x, layer_scalar), i.e. x = (x + rms_norm(rms_norm(m, w1) +
  // rms_norm(experts, w2), w3)) * layer_scalar; then next = rms_norm(x, next_norm) when asked.
  // m and experts are left undefined. The default runs those ops; a GPU fuses them into one
  // dispatch.
  virtual void moe_ffn_tail(Mat experts, const FfnTail& t) {
    if (!t.dense_norm || !t.experts_norm || !t.ffn_norm)
      throw std::logic_error("moe_ffn_tail: a norm weight is missing");
    rms_norm(t.m, t.dense_norm, t.weight_offset, t.eps, t.m);
    add_rms_norm(experts, t.experts_norm, t.weight_offset, t.eps, t.m);
    add_rms_norm(t.m, t.ffn_norm, t.weight_offset, t.eps, t.x, t.layer_scalar);
    if (t.next_norm) rms_norm(t.x, t.next_norm, t.weight_offset, t.eps, t.next);
  }
  // rms_norm over each head of x (rows of n_heads * head_dim values; weight has head_dim values),
  // then rope: the q/k norm and rotation of attention. The default runs the two ops; a GPU fuses
  // them into one dispatch.
  virtual void rms_norm_rope(Mat x, int n_heads, int head_dim, const Buffer* weight,
                             float weight_offset, float eps, const RopeParams& p, int64_t pos0) {
    rms_norm(x.split_rows(head_dim), weight, weight_offset, eps, x.split_rows(head_dim));
    rope(x, n_heads, head_dim, p, pos0);
  }
  // out = gelu_tanh(gate) * up
  virtual void gelu_tanh_mul(Mat gate, Mat up, Mat out) = 0;
  // x = cap * tanh(x / cap)
  virtual void softcap(Mat x, float cap) = 0;
  // Rotates each row of x (n_heads vectors of head_dim values) for positions pos0 + row.
  virtual void rope(Mat x, int n_heads, int head_dim, const RopeParams& p, int64_t pos0) = 0;

  // ---- products ----
  // The input precision of the quantized products that follow, per QWeight::kind (see
  // ActivationPlan). A backend without an 8-bit path stays exact and returns false for a plan
  // with any int8 kind.
  virtual bool set_activations(ActivationPlan p) { return !p.any_int8(); }
  virtual ActivationPlan activations() const { return ActivationPlan::exact(); }
  // y[t] = W x[t] for every row t of x (x.cols == W.cols, y.cols == W.rows).
  virtual void qmatmul(const QWeight& w, Mat x, Mat y) = 0;
  // Independent products y = W x run as one operation, with the same results as qmatmul on each
  // (the products must not write what another one reads). A backend can split their rows over
  // its threads as one loop, so a decode step synchronizes once per group of products that read
  // the same input (q/k/v, gate/up) instead of once per product. The default runs them in turn.
  struct QProduct {
    const QWeight* w = nullptr;
    Mat x;
    Mat y;
  };
  virtual void qmatmul_batch(std::span<const QProduct> products) {
    for (const QProduct& p : products) qmatmul(*p.w, p.x, p.y);
  }
  // gelu_tanh(gate) * up, then out = down * that (the end of a gated MLP). gate is left
  // undefined. The default runs gelu_tanh_mul into gate, then qmatmul; a GPU computes the GeGLU
  // inside the decode product where gate and up are column ranges of one buffer.
  virtual void geglu_qmatmul(const QWeight& down, Mat gate, Mat up, Mat out) {
    gelu_tanh_mul(gate, up, gate);
    qmatmul(down, gate, out);
  }
  // The RMSNorm in front of products (qmatmul_normed): rms_norm(x, weight, weight_offset, eps),
  // or with mul_cols set rms_norm_mul_cols(x, eps, *weight, mul_cols).
  struct InputNorm {
    const Buffer* weight = nullptr;
    float weight_offset = 0.0f;
    float eps = 1e-6f;
    std::optional<float> mul_cols;
  };
  // Products of one normed input: normed = norm(x), then every product's y = w * normed (each
  // QProduct's x must be `normed`). The default runs exactly that (the norm op, then
  // qmatmul_batch); a GPU folds the norm into the decode products instead (each product
  // normalizes x as it stages it: one dispatch and one dependent step less), leaving `normed`
  // unwritten.
  virtual void qmatmul_normed(Mat x, const InputNorm& norm, Mat normed,
                              std::span<const QProduct> products) {
    input_norm(x, norm, normed);
    qmatmul_batch(products);
  }
  // normed = norm(x) as its own op (qmatmul_normed's first step).
  void input_norm(Mat x, const InputNorm& norm, Mat normed) {
    if (norm.mul_cols)
      rms_norm_mul_cols(x, norm.eps, *norm.weight, *norm.mul_cols, normed);
    else
      rms_norm(x, norm.weight, norm.weight_offset, norm.eps, normed);
  }
  // out[i] = scale * row ids[i] of `table` (dequantized).
  virtual void embed(const QWeight& table, std::span<const int32_t> ids, float scale, Mat out) = 0;
  // dst[i] = src[rows[i]]
  virtual void gather_rows(Mat src, std::span<const int32_t> rows, Mat dst) = 0;
  // Rows `rows` of src as one matrix: src itself where they are all of its rows in order (a
  // decode step's routed experts all read its one row), else gathered into dst. Sharing src lets
  // a batch of products prepare their common input once (qmatmul_batch matches inputs by
  // address) and keeps that one prepared input in cache while every expert's rows go by.
  Mat rows_of(Mat src, std::span<const int32_t> rows, Mat dst);
  // dst[rows[i]] += weights[i] * src[i], in order of i.
  virtual void scatter_add_rows(Mat src, std::span<const int32_t> rows,
                                std::span<const float> weights, Mat dst) = 0;

  // ---- attention ----
  // Stores the keys and values of positions pos0 .. pos0 + k.rows - 1 (rows of k and v are
  // num_kv_heads * head_dim values), converting to the cache's dtype.
  virtual void kv_store(const KvLayerView& kv, Mat k, Mat v, int64_t pos0) = 0;
  // Attention's keys and values into the cache: the keys normed per head (k_norm, as
  // rms_norm_rope) and rotated, the values normed per head without a weight where v_norm, then
  // stored (kv_store). k and v hold unspecified values afterwards. The default runs those ops in
  // place; a GPU does it in one dispatch that writes only the cache.
  virtual void store_kv_normed(const KvLayerView& kv, Mat k, Mat v, const Buffer* k_norm,
                               float weight_offset, float eps, const RopeParams& rope, bool v_norm,
                               int64_t pos0) {
    rms_norm_rope(k, kv.num_kv_heads, kv.head_dim, k_norm, weight_offset, eps, rope, pos0);
    if (v_norm) rms_norm(v.split_rows(kv.head_dim), nullptr, 0.0f, eps, v.split_rows(kv.head_dim));
    kv_store(kv, k, v, pos0);
  }
  // Attention's inputs for a layer, from one input: the q, k and v products (`qkv`: v.w null
  // where the values are the keys' raw product, which v.y then receives as a copy) run as
  // qmatmul_normed(x, *norm, normed, products) where norm is given (the products' x is
  // `normed`), else as qmatmul_batch; then q normed per head and rotated in place (rms_norm_rope
  // with q_norm) and the keys and values stored (store_kv_normed with k_norm and v_norm). k.y
  // and v.y hold unspecified values afterwards. The default runs exactly those ops; a GPU norms,
  // rotates and stores each head in the last workgroup of its product, one dependent step less.
  struct QkvProducts {
    QProduct q, k, v;
  };
  struct HeadNorms {
    const Buffer* q_norm = nullptr;
    const Buffer* k_norm = nullptr;
    float weight_offset = 0.0f;
    float eps = 1e-6f;
    RopeParams rope;
    bool v_norm = false;
  };
  // The q, k and v products alone (v's only where it has a matrix), from `normed` = norm(x)
  // where norm is given (qmatmul_normed), else from their own x (qmatmul_batch).
  void qkv_products(Mat x, const InputNorm* norm, Mat normed, const QkvProducts& qkv) {
    const QProduct all[] = {qkv.q, qkv.k, qkv.v};
    const std::span<const QProduct> products(all, qkv.v.w ? 3 : 2);
    if (norm)
      qmatmul_normed(x, *norm, normed, products);
    else
      qmatmul_batch(products);
  }
  virtual void project_attention_inputs(Mat x, const InputNorm* norm, Mat normed,
                                        const QkvProducts& qkv, const HeadNorms& heads,
                                        const KvLayerView& kv, int64_t pos0) {
    qkv_products(x, norm, normed, qkv);
    if (!qkv.v.w) copy(qkv.k.y, qkv.v.y);  // the raw projection, before k_norm and RoPE
    const int n_heads = static_cast<int>(qkv.q.y.cols / kv.head_dim);
    rms_norm_rope(qkv.q.y, n_heads, kv.head_dim, heads.q_norm, heads.weight_offset, heads.eps,
                  heads.rope, pos0);
    store_kv_normed(kv, qkv.k.y, qkv.v.y, heads.k_norm, heads.weight_offset, heads.eps, heads.rope,
                    heads.v_norm, pos0);
  }
  // One layer's attention from its input: project_attention_inputs, then attention of q.y over
  // the cache into out (q, k and v as there; k.y, v.y and q.y hold unspecified values
  // afterwards). The default runs exactly those two; a GPU may instead, for one decode row, run
  // the products plain and norm, rotate and store the heads inside attention's dispatch.
  virtual void attention_from_input(Mat x, const InputNorm* norm, Mat normed,
                                    const QkvProducts& qkv, const HeadNorms& heads,
                                    const KvLayerView& kv, int64_t pos0, float scale, Mat out) {
    project_attention_inputs(x, norm, normed, qkv, heads, kv, pos0);
    attention(qkv.q.y, kv, pos0, static_cast<int>(qkv.q.y.cols / kv.head_dim), scale, out);
  }
  // For each row t of q (n_heads * head_dim values, query position pos0 + t) and head h:
  // softmax over visible keys (kv_visible) of scale * q_h . k, in float32, times V; head h
  // reads KV head h / (n_heads / num_kv_heads). Writes out[t] (n_heads * head_dim values).
  // All visible positions must already be stored.
  virtual void attention(Mat q, const KvLayerView& kv, int64_t pos0, int n_heads, float scale,
                         Mat out) = 0;

  // ---- mixture-of-experts routing (result returned to the host) ----
  // (route_to and routed_experts below keep the routing in backend memory instead.)
  // For each row t of `logits` (one score per expert): p = softmax(row); the top_k experts by
  // p (ties: lower index); weights = p_top / sum(p_top) * per_expert_scale[expert].
  // Writes idx[t * top_k + j] and weights[t * top_k + j] in descending p order.
  virtual void route(Mat logits, int top_k, const Buffer& per_expert_scale, int32_t* idx,
                     float* weights) = 0;

  // ---- mixture of experts with the routing kept in backend memory ----
  // When every expert of a layer is resident, the model imports them as one bank, writes the
  // router's choice into a backend buffer (route_to) and runs the chosen experts from it
  // (routed_experts): a GPU reads the ids on the device, so a decode step needs no host round
  // trip. The defaults below do the same on the host through the ops above (the CPU backend
  // uses them: the exact reference).
  //
  // Every expert of one MoE layer: gate and up [intermediate, hidden], down [hidden,
  // intermediate] per expert, all with the same quantization. The host memory must outlive the
  // bank (as for import_qweight).
  virtual std::unique_ptr<ExpertBank> import_experts(std::span<const HostQuantMatrix> gate,
                                                     std::span<const HostQuantMatrix> up,
                                                     std::span<const HostQuantMatrix> down);
  // route() into `routes` (at least route_buffer_bytes(logits.rows * top_k) bytes): the ids as
  // int32 from byte 0, the weights as float32 from byte route_weights_offset(count).
  virtual void route_to(Mat logits, int top_k, const Buffer& per_expert_scale, Buffer& routes);
  // A MoE layer's router: its logits router.y = router.w * norm(x) (qmatmul_normed, `normed` its
  // scratch and router.x), then route_to(router.y, ...). The default runs exactly those two; a
  // GPU routes in the product's dispatch (its last workgroup), one dependent step less.
  virtual void route_product_to(Mat x, const InputNorm& norm, Mat normed, const QProduct& router,
                                int top_k, const Buffer& per_expert_scale, Buffer& routes) {
    qmatmul_normed(x, norm, normed, std::span<const QProduct>(&router, 1));
    route_to(router.y, top_k, per_expert_scale, routes);
  }
  // Several experts, each over its rows of x: expert k's rows (rows_of) are rows
  // [r_k, r_k + n_k) of in, g, u and y (r_k the rows of the experts before it) and its output goes
  // to those rows of y. The gate and up products of all experts run as one batched product, then
  // one GeGLU, then all the down products as one batch, so a decode step synchronizes its threads
  // twice per layer instead of twice per expert. Each expert's rows get the same kernels as a
  // product of their own (qmatmul_batch), so the bits do not depend on which experts share a
  // batch. The default routed_experts and the model's own expert paths all run through it.
  struct ExpertRows {
    const QWeight* gate;
    const QWeight* up;
    const QWeight* down;
    std::span<const int32_t> rows;  // of x
  };
  void expert_products(std::span<const ExpertRows> experts, Mat x, Mat in, Mat g, Mat u, Mat y);
  // out[t] = sum over row t's top_k experts in `routes`, in ascending expert id, of
  // weight * down(gelu_tanh(gate x[t]) * up x[t]); out is overwritten. The default downloads
  // the routes and runs each chosen expert once over the rows that picked it.
  virtual void routed_experts(const ExpertBank& bank, Mat x, const Buffer& routes, int top_k,
                              Mat out);
  // routed_experts into out, then moe_ffn_tail(out, tail): a layer's experts and the end of its
  // feed-forward (out is left undefined). A GPU sums the experts' products in the tail's
  // dispatch, one dependent step less than the two ops.
  virtual void routed_experts_tail(const ExpertBank& bank, Mat x, const Buffer& routes, int top_k,
                                   Mat out, const FfnTail& tail) {
    routed_experts(bank, x, routes, top_k, out);
    moe_ffn_tail(out, tail);
  }

  // ---- streamed experts in backend memory: a few expert slots per MoE layer ----
  // When the experts are streamed (runtime/expert_store.h), a backend with memory of its own (a
  // GPU) keeps a bank of slots per MoE layer, mirroring the store's slots: the model fills a slot
  // when the store delivers an expert the slot does not hold, runs the layer's products from the
  // slots, then combines them with the routing in backend memory (route_to). Results are the
  // same bits as routed_experts on a bank holding every expert.
  //
  // Whether the backend has this slot path (not the CPU: it computes the experts where the
  // expert store holds them).
  virtual bool supports_expert_slots() const { return false; }
  // A bank of `slots` empty slots, each for one expert shaped like gate, up and down (which
  // only give the shapes and quantization); nullptr when the backend has no slot path.
  virtual std::unique_ptr<ExpertBank> create_expert_slots(const HostQuantMatrix& gate,
                                                          const HostQuantMatrix& up,
                                                          const HostQuantMatrix& down, int slots) {
    return nullptr;
  }
  // Whether `slot` holds `expert` already (filled and not overwritten since).
  virtual bool slot_holds(const ExpertBank& slots, int slot, int32_t expert) const { return false; }
  // Copies an expert's matrices into `slot` (ordered with the recorded ops: products recorded
  // before this read the slot's previous expert). Throws std::logic_error on other shapes.
  virtual void fill_expert_slot(ExpertBank& slots, int slot, int32_t expert,
                                const HostQuantMatrix& gate, const HostQuantMatrix& up,
                                const HostQuantMatrix& down) {
    throw std::logic_error("fill_expert_slot: no slot path on this backend");
  }
  // The products of some routed entries of x [T, hidden]: `ids` are the T * top_k routed expert
  // ids (route_to's order), entry_slot[j] the slot holding entry j's expert, or -1 for entries
  // left for a later call (experts processed in waves when there are fewer slots than
  // experts). Each entry's product is kept in backend scratch until combine_slot_products.
  virtual void slot_expert_products(const ExpertBank& slots, Mat x, std::span<const int32_t> ids,
                                    std::span<const int32_t> entry_slot, int top_k) {
    throw std::logic_error("slot_expert_products: no slot path on this backend");
  }
  // Hybrid experts (docs/gpu.md): the products of routed entries computed on the host, which
  // combine_slot_products then adds with the slots' own, in its order. `entries` lists entry
  // indices j (into the T * top_k routed ids); `products` holds, in that order, each one's
  // unweighted product down(gelu_tanh(gate x[j / top_k]) * up x[j / top_k]), x.cols floats
  // each. `x` is the layer's experts' input [T, hidden] (shapes only).
  virtual void host_expert_products(const ExpertBank& slots, Mat x, std::span<const int32_t> ids,
                                    std::span<const int32_t> entries,
                                    std::span<const float> products, int top_k) {
    throw std::logic_error("host_expert_products: no slot path on this backend");
  }
  // out[t] = routed_experts' sum from the products of every entry (routes: route_to's buffer;
  // ids and weights: the same routes on the host).
  virtual void combine_slot_products(const Buffer& routes, std::span<const int32_t> ids,
                                     std::span<const float> weights, int top_k, Mat out) {
    throw std::logic_error("combine_slot_products: no slot path on this backend");
  }

  // ---- sampling on the backend (runtime/sampler.h decides how they are used) ----
  // Whether sampling should read the logits where they are (top_logits) rather than download
  // the whole row: true for a GPU, false for the CPU (its logits are host memory already).
  virtual bool samples_in_place() const { return false; }
  // The sampler's repetition penalty on one row: logits[ids[i]] = l < 0 ? l * penalty :
  // l / penalty for each id (distinct, inside the row).
  virtual void penalize_logits(Mat row, std::span<const int32_t> ids, float penalty);
  // The k largest logits of one row, largest first (ties: lower id); the row's max and the sum
  // of exp(l - max) over the row (what top-p needs); finite == false when any logit is inf or
  // NaN (then the rest is meaningless). The default downloads the row.
  struct TopLogits {
    std::vector<int32_t> ids;
    std::vector<float> logits;
    float max = 0;
    double exp_sum = 0;
    bool finite = true;
  };
  virtual TopLogits top_logits(Mat row, int k);

 protected:
  // A backend whose buffers depend on state of its own (a GPU device) calls this before that
  // state goes.
  void release_default_scratch() {
    moe_in_.reset(), moe_gate_.reset(), moe_up_.reset(), moe_out_.reset();
  }

 private:
  // Scratch of the default routed_experts, kept between calls.
  std::unique_ptr<Buffer> moe_in_, moe_gate_, moe_up_, moe_out_;
};

// The argument checks every backend makes (throw std::logic_error, or std::out_of_range for a
// token id outside the vocabulary): import_experts (one gate, up and down per expert, all of one
// shape; sets the bank's count and sizes), embed, kv_store and attention.
void check_expert_shapes(std::span<const HostQuantMatrix> gate, std::span<const HostQuantMatrix> up,
                         std::span<const HostQuantMatrix> down, ExpertBank& bank);
void check_embed_args(int64_t vocab, int64_t width, std::span<const int32_t> ids, Mat out);
void check_kv_store_args(const KvLayerView& kv, Mat k, Mat v, int64_t pos0);
void check_attention_args(Mat q, const KvLayerView& kv, int n_heads, Mat out);

// Where route_to puts the weights of `count` routed rows, and the buffer size it needs.
constexpr size_t route_weights_offset(size_t count) { return (count * 4 + 255) / 256 * 256; }
constexpr size_t route_buffer_bytes(size_t count) {
  return route_weights_offset(count) + count * 4;
}

// A route buffer read back and grouped by expert: for each chosen expert, in ascending id (the
// CPU's and transformers' order of accumulation), the token rows that chose it and their weights.
using ExpertRowGroups = std::map<int32_t, std::pair<std::vector<int32_t>, std::vector<float>>>;
// Downloads `rows * top_k` routes from `routes` (route_to's layout); throws on an expert id
// outside [0, num_experts).
ExpertRowGroups group_routes_by_expert(Backend& backend, const Buffer& routes, int64_t rows,
                                       int top_k, int num_experts);
// The same grouping of routes already on the host (ids and weights of rows * top_k entries).
ExpertRowGroups group_expert_rows(std::span<const int32_t> idx, std::span<const float> weights,
                                  int64_t rows, int top_k, int num_experts);
// The routed entries (t * top_k + k) grouped by expert: experts ascending, each group's entries in
// order (group_expert_rows' order of rows). Counted first, so each list is reserved once: a
// prefill chunk of 512 tokens routes 4,096 entries a layer, and a map lookup and regrowth per
// entry took about as long as a GPU's small kernels. Throws on an id outside [0, num_experts).
using ExpertEntryGroups = std::map<int32_t, std::vector<int64_t>>;
ExpertEntryGroups group_entries_by_expert(std::span<const int32_t> ids, int num_experts);
// out = the sum over experts of each expert's output rows y (stacked in `groups`' order) times
// their weights, scattered back to the token rows that chose them.
void scatter_expert_rows(Backend& backend, const ExpertRowGroups& groups, Mat y, Mat out);

}  // namespace redwing
