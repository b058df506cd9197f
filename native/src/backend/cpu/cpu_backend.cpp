#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/rope_tables.h"
#include "platform/file.h"

namespace redwing {
namespace {

class CpuBuffer final : public Buffer {
 public:
  explicit CpuBuffer(size_t bytes) : bytes_(bytes), data_(platform::allocate_aligned(bytes, 64)) {
    std::memset(data_.get(), 0, bytes);
  }
  size_t size_bytes() const override { return bytes_; }
  std::byte* data() const { return data_.get(); }

 private:
  size_t bytes_;
  platform::AlignedBytes data_;
};

class CpuQWeight final : public QWeight {
 public:
  cpu::QuantMatrix m;
  platform::AlignedBytes grouped;  // m.packed's own row-grouped copy (import_resident_qweight)
};

cpu::ScaleType scale_type(DType t) {
  switch (t) {
    case DType::bf16:
      return cpu::ScaleType::bf16;
    case DType::f16:
      return cpu::ScaleType::f16;
    case DType::f32:
      return cpu::ScaleType::f32;
  }
  throw std::logic_error("bad scale dtype");
}

std::byte* bytes_of(const Buffer& b) { return static_cast<const CpuBuffer&>(b).data(); }

// Checks that a view lies inside its buffer (a bug in the caller otherwise).
float* f32(const Mat& m) {
  if (m.buf == nullptr) throw std::logic_error("Mat without a buffer");
  if (m.rows > 0) {
    const int64_t last = m.offset + (m.rows - 1) * m.stride + m.cols;
    if (m.offset < 0 || m.cols > m.stride ||
        static_cast<size_t>(last) * sizeof(float) > m.buf->size_bytes())
      throw std::logic_error("Mat view outside its buffer");
  }
  return reinterpret_cast<float*>(bytes_of(*m.buf)) + m.offset;
}

void check_same_shape(const Mat& a, const Mat& b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols)
    throw std::logic_error(std::string(op) + ": shape mismatch");
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {}

  std::string name() const override { return "cpu"; }
  std::string describe() const override {
    return std::string("cpu ") + cpu::isa_name(cpu::active_isa()) + " (" + cpu::cpu_features() +
           "), " + std::to_string(pool_.size()) + " threads" +
           (plan_.any_int8() ? ", int8 activations (" + activation_plan_name(plan_) + ")" : "");
  }

  std::unique_ptr<Buffer> alloc(size_t bytes) override {
    return std::make_unique<CpuBuffer>(bytes);
  }

  void upload(Buffer& dst, size_t off, const void* src, size_t bytes) override {
    if (off + bytes > dst.size_bytes()) throw std::logic_error("upload outside the buffer");
    std::memcpy(bytes_of(dst) + off, src, bytes);
  }

  void download(const Buffer& src, size_t off, void* dst, size_t bytes) override {
    if (off + bytes > src.size_bytes()) throw std::logic_error("download outside the buffer");
    std::memcpy(dst, bytes_of(src) + off, bytes);
  }

  std::unique_ptr<QWeight> import_qweight(const HostQuantMatrix& h) override {
    auto w = std::make_unique<CpuQWeight>();
    w->rows = h.rows;
    w->cols = h.cols;
    w->m.packed = h.packed;
    w->m.scales = h.scales;
    w->m.biases = h.biases;
    w->m.scale_type = scale_type(h.scale_dtype);
    w->m.bits = h.bits;
    w->m.group_size = h.group_size;
    w->m.rows = h.rows;
    w->m.cols = h.cols;
    w->m.row_group = h.row_group;
    if (h.row_group != 1 && (h.row_group != cpu::kRowGroup || h.rows % cpu::kRowGroup != 0))
      throw std::invalid_argument("cpu: row_group " + std::to_string(h.row_group) + " for " +
                                  std::to_string(h.rows) + " rows");
    return w;
  }

  // Where the kernels read row groups (cpu::row_groups_pay), a resident matrix's packed words
  // are copied into that layout, in huge-page memory, a slice at a time, each slice's mapped
  // pages handed back once copied: the process holds the matrix once, and at most one slice
  // twice. The decode products then read one stream per 4 rows instead of four (kernels.h).
  std::unique_ptr<QWeight> import_resident_qweight(const HostQuantMatrix& h) override {
    std::unique_ptr<QWeight> imported = import_qweight(h);
    auto& w = static_cast<CpuQWeight&>(*imported);
    if (h.row_group != 1 || h.rows % cpu::kRowGroup != 0 || !cpu::row_groups_pay()) return imported;
    const int64_t wpr = h.cols * h.bits / 32;
    const size_t bytes = static_cast<size_t>(h.rows * wpr) * sizeof(uint32_t);
    w.grouped = platform::allocate_aligned(bytes, 64);
    auto* out = reinterpret_cast<uint32_t*>(w.grouped.get());
    constexpr int64_t kSliceBytes = int64_t{32} << 20;
    const int64_t slice_rows =
        std::max<int64_t>(1, kSliceBytes / (wpr * 4 * cpu::kRowGroup)) * cpu::kRowGroup;
    for (int64_t r = 0; r < h.rows; r += slice_rows) {
      const int64_t n = std::min(slice_rows, h.rows - r);
      cpu::group_rows(h.packed + r * wpr, out + r * wpr, n, wpr);
      platform::release_pages(h.packed + r * wpr, static_cast<size_t>(n * wpr) * sizeof(uint32_t));
    }
    platform::release_pages(h.packed, bytes);  // the pages that straddled two slices
    w.m.packed = out;
    w.m.row_group = cpu::kRowGroup;
    return imported;
  }

  int preferred_row_group() const override { return cpu::row_groups_pay() ? cpu::kRowGroup : 1; }
  void lay_out_rows(uint32_t* packed, int64_t rows, int64_t words_per_row) const override {
    if (preferred_row_group() == cpu::kRowGroup)
      cpu::group_rows(packed, packed, rows, words_per_row);
  }

  // ---- element-wise ----

  // Runs fn(row) for every row, split over the pool when the work is large enough.
  template <typename F>
  void for_rows(int64_t rows, int64_t cols, F&& fn) {
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
    pool_.parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) fn(r);
    });
  }

  void fill_zero(Mat x) override {
    float* p = f32(x);
    for (int64_t r = 0; r < x.rows; ++r) std::fill_n(p + r * x.stride, x.cols, 0.0f);
  }

  void copy(Mat src, Mat dst) override {
    check_same_shape(src, dst, "copy");
    const float* s = f32(src);
    float* d = f32(dst);
    for (int64_t r = 0; r < src.rows; ++r)
      std::memmove(d + r * dst.stride, s + r * src.stride, sizeof(float) * src.cols);
  }

  void add(Mat a, Mat b, Mat out) override {
    check_same_shape(a, b, "add");
    check_same_shape(a, out, "add");
    const float* pa = f32(a);
    const float* pb = f32(b);
    float* po = f32(out);
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t c = 0; c < a.cols; ++c)
        po[r * out.stride + c] = pa[r * a.stride + c] + pb[r * b.stride + c];
  }

  void scale(Mat x, float s) override {
    float* p = f32(x);
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c = 0; c < x.cols; ++c) p[r * x.stride + c] *= s;
  }

  void mul_cols(Mat x, const Buffer& v, float s) override {
    if (v.size_bytes() < sizeof(float) * x.cols)
      throw std::logic_error("mul_cols: vector too short");
    const float* pv = reinterpret_cast<const float*>(bytes_of(v));
    float* p = f32(x);
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c = 0; c < x.cols; ++c) p[r * x.stride + c] = (p[r * x.stride + c] * pv[c]) * s;
  }

  void rms_norm(Mat x, const Buffer* weight, float offset, float eps, Mat y) override {
    check_same_shape(x, y, "rms_norm");
    if (weight && weight->size_bytes() < sizeof(float) * x.cols)
      throw std::logic_error("rms_norm: weight too short");
    const float* w = weight ? reinterpret_cast<const float*>(bytes_of(*weight)) : nullptr;
    const float* px = f32(x);
    float* py = f32(y);
    for_rows(x.rows, x.cols, [&](int64_t r) {
      cpu::rms_norm(px + r * x.stride, w, offset, eps, x.cols, py + r * y.stride);
    });
  }

  void gelu_tanh_mul(Mat gate, Mat up, Mat out) override {
    check_same_shape(gate, up, "gelu_tanh_mul");
    check_same_shape(gate, out, "gelu_tanh_mul");
    const float* pg = f32(gate);
    const float* pu = f32(up);
    float* po = f32(out);
    for_rows(gate.rows, gate.cols, [&](int64_t r) {
      cpu::gelu_tanh_mul(pg + r * gate.stride, pu + r * up.stride, gate.cols, po + r * out.stride);
    });
  }

  void softcap(Mat x, float cap) override {
    float* p = f32(x);
    for_rows(x.rows, x.cols, [&](int64_t r) { cpu::softcap(p + r * x.stride, x.cols, cap); });
  }

  void rope(Mat x, int n_heads, int head_dim, const RopeParams& rp, int64_t pos0) override {
    if (x.cols != static_cast<int64_t>(n_heads) * head_dim)
      throw std::logic_error("rope: bad width");
    const int half = head_dim / 2;
    const std::span<const float> table = rope_tables_.get(x.rows, head_dim, rp, pos0);
    float* p = f32(x);
    for_rows(x.rows, x.cols, [&](int64_t r) {
      const float* c = table.data() + r * 2 * half;
      cpu::rope_neox(p + r * x.stride, n_heads, head_dim, c, c + half);
    });
  }

  // ---- products ----

  static void check_product(const cpu::QuantMatrix& w, Mat x, Mat y) {
    if (x.cols != w.cols || y.cols != w.rows || x.rows != y.rows)
      throw std::logic_error("qmatmul: shape mismatch (" + std::to_string(x.rows) + "x" +
                             std::to_string(x.cols) + " by " + std::to_string(w.rows) + "x" +
                             std::to_string(w.cols) + ")");
  }

  bool set_activations(ActivationPlan p) override {
    plan_ = p;
    return true;
  }
  ActivationPlan activations() const override { return plan_; }

  // Whether a product takes the 8-bit-activation path: when the plan asks for it on the
  // weight's kind, and where the input width is whole blocks of the activation quantization
  // (every Gemma shape is).
  bool use_q8(const QWeight& w) const { return plan_.int8(w.kind) && w.cols % cpu::kQ8Block == 0; }

  // Quantizes the input rows of a product for the 8-bit path, the rows of a prefill chunk in
  // parallel.
  void quantize_input(cpu::Q8Buffer& xa, const float* x, int64_t rows, int64_t stride,
                      const cpu::QuantMatrix& w) {
    xa.resize(rows, w.cols, w.bits);
    pool_.parallel_for(rows, 4, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) xa.quantize_row(t, x + t * stride);
    });
  }

  // Prepares the input rows of an exact 4-bit product for the integer method (cpu::X24Buffer).
  // False where the method is off, not on this CPU, or the input holds inf or NaN: the product
  // then takes the float32 path.
  bool prepare_x24(cpu::X24Buffer& xa, const float* x, int64_t rows, int64_t stride,
                   const cpu::QuantMatrix& w) {
    if (w.bits != 4 || !xa.resize(rows, w.cols, w.group_size)) return false;
    if (rows == 1) {
      if (xa.prepare_row(0, x)) return true;
      xa.clear();
      return false;
    }
    x24_inputs_.assign(1, {&xa, x, stride});
    prepare_x24_inputs();
    return xa.cols() > 0;
  }

  // Prepares every row of the resized buffers in x24_inputs_ in one parallel loop. Where any row
  // holds inf or NaN every buffer is emptied (cols() == 0), and their products take the float32
  // path, which propagates them.
  void prepare_x24_inputs() {
    x24_first_.assign(1, 0);
    for (const X24Input& in : x24_inputs_) x24_first_.push_back(x24_first_.back() + in.buf->rows());
    std::atomic<bool> finite{true};
    // 16 rows a chunk: a decode step's few one-row inputs are prepared inline by the caller.
    pool_.parallel_for(x24_first_.back(), 16, [&](int64_t b, int64_t e) {
      // The input holding row b, then onwards.
      auto i = static_cast<size_t>(std::upper_bound(x24_first_.begin(), x24_first_.end(), b) -
                                   x24_first_.begin() - 1);
      for (int64_t r = b; r < e; ++r) {
        while (r >= x24_first_[i + 1]) ++i;
        const X24Input& in = x24_inputs_[i];
        const int64_t t = r - x24_first_[i];
        if (!in.buf->prepare_row(t, in.x + t * in.stride))
          finite.store(false, std::memory_order_relaxed);
      }
    });
    if (!finite.load())
      for (const X24Input& in : x24_inputs_) in.buf->clear();
  }

  // Whether an exact product of n_rows inputs runs on the matrix unit (AMX): it pads the tokens
  // to tiles of 16, so it pays from a few rows on (bench: redwing-bench-prefill).
  static bool use_split(const cpu::QuantMatrix& w, int64_t n_rows) {
    return n_rows >= kSplitMinRows && cpu::has_matrix_product() && w.cols % cpu::kSplitK == 0;
  }
  static constexpr int64_t kSplitMinRows = 4;
  // Row chunks of about 64 KiB of columns, in whole row groups: a chunk that started inside a
  // group of a row-grouped matrix (cpu::kRowGroup) would take its first rows one at a time.
  static int64_t product_grain(int64_t cols) {
    const int64_t base = std::max<int64_t>(4, 65536 / std::max<int64_t>(cols, 1));
    return (base + cpu::kRowGroup - 1) / cpu::kRowGroup * cpu::kRowGroup;
  }
  // Row chunks of whole 32-row blocks (the matrix-unit kernel converts weights 32 rows at a time).
  static int64_t split_grain(int64_t cols) {
    const int64_t base = std::max<int64_t>(32, 65536 / std::max<int64_t>(cols, 1));
    return (base + 31) / 32 * 32;
  }

  void split_input(cpu::SplitActivation& xs, const float* x, int64_t rows, int64_t stride,
                   int64_t cols) {
    xs.resize(rows, cols);
    pool_.parallel_for(rows, 4, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) xs.split_row(t, x + t * stride);
    });
  }

  void qmatmul(const QWeight& wq, Mat x, Mat y) override {
    const cpu::QuantMatrix& w = static_cast<const CpuQWeight&>(wq).m;
    check_product(w, x, y);
    const float* px = f32(x);
    float* py = f32(y);
    const int64_t grain = product_grain(w.cols);
    if (use_q8(wq)) {
      // Quantized once here, then shared read-only by every thread.
      if (q8_.empty()) q8_.emplace_back();
      cpu::Q8Buffer& xa = q8_.front();
      quantize_input(xa, px, x.rows, x.stride, w);
      pool_.parallel_for(w.rows, grain, [&](int64_t b, int64_t e) {
        if (x.rows == 1)
          cpu::qmatvec_q8(w, xa.row(0), py, b, e);
        else
          cpu::qmatmul_q8(w, xa, py, y.stride, b, e);
      });
      return;
    }
    if (x24_.empty()) x24_.emplace_back();
    cpu::X24Buffer& xa = x24_.front();
    if (use_split(w, x.rows)) {
      if (split_.empty()) split_.emplace_back();
      cpu::SplitActivation& xs = split_.front();
      split_input(xs, px, x.rows, x.stride, w.cols);
      pool_.parallel_for(w.rows, split_grain(w.cols), [&](int64_t b, int64_t e) {
        cpu::qmatmul_split(w, xs, py, y.stride, b, e);
      });
    } else if (prepare_x24(xa, px, x.rows, x.stride, w)) {
      pool_.parallel_for(w.rows, grain, [&](int64_t b, int64_t e) {
        if (x.rows == 1)
          cpu::qmatvec_x24(w, xa, py, b, e);
        else
          cpu::qmatmul_x24(w, xa, py, y.stride, b, e);
      });
    } else {
      pool_.parallel_for(w.rows, grain, [&](int64_t b, int64_t e) {
        if (x.rows == 1)
          cpu::qmatvec(w, px, py, b, e);
        else
          cpu::qmatmul(w, px, x.rows, x.stride, py, y.stride, b, e);
      });
    }
  }

  // One parallel loop over the rows of all the products together: a chunk of the combined row
  // range may span two products. Each output row is computed by the same kernel call per row
  // range as in qmatmul, so the results are the same bits.
  void qmatmul_batch(std::span<const QProduct> products) override {
    batch_.clear();
    int64_t total_rows = 0;
    int64_t max_cols = 1;
    for (const QProduct& p : products) {
      const cpu::QuantMatrix& w = static_cast<const CpuQWeight&>(*p.w).m;
      check_product(w, p.x, p.y);
      batch_.push_back({&w, use_q8(*p.w), f32(p.x), p.x.rows, p.x.stride, f32(p.y), p.y.stride,
                        total_rows, nullptr, nullptr, nullptr});
      total_rows += w.rows;
      max_cols = std::max(max_cols, w.cols);
    }
    // 8-bit activations: quantize each distinct input once (q/k/v and gate/up share theirs).
    size_t n_q8 = 0;
    for (size_t i = 0; i < batch_.size(); ++i) {
      BatchedProduct& j = batch_[i];
      if (!j.int8) continue;
      for (size_t k = 0; k < i && j.q8 == nullptr; ++k) {
        const BatchedProduct& o = batch_[k];
        if (o.q8 != nullptr && o.x == j.x && o.x_rows == j.x_rows && o.x_stride == j.x_stride &&
            o.w->cols == j.w->cols && o.w->bits == j.w->bits)
          j.q8 = o.q8;
      }
      if (j.q8 != nullptr) continue;
      if (q8_.size() <= n_q8) q8_.resize(n_q8 + 1);
      quantize_input(q8_[n_q8], j.x, j.x_rows, j.x_stride, *j.w);
      j.q8 = &q8_[n_q8++];
    }
    // Exact products on the matrix unit: split each distinct input once, likewise.
    size_t n_split = 0;
    bool any_split = false;
    for (size_t i = 0; i < batch_.size(); ++i) {
      BatchedProduct& j = batch_[i];
      if (j.int8 || !use_split(*j.w, j.x_rows)) continue;
      any_split = true;
      for (size_t k = 0; k < i && j.split == nullptr; ++k) {
        const BatchedProduct& o = batch_[k];
        if (o.split != nullptr && o.x == j.x && o.x_rows == j.x_rows && o.x_stride == j.x_stride &&
            o.w->cols == j.w->cols)
          j.split = o.split;
      }
      if (j.split != nullptr) continue;
      if (split_.size() <= n_split) split_.resize(n_split + 1);
      split_input(split_[n_split], j.x, j.x_rows, j.x_stride, j.w->cols);
      j.split = &split_[n_split++];
    }
    // Exact products by integer dot products (cpu::qmatvec_x24, cpu::qmatmul_x24): prepare each
    // distinct input once, likewise, the rows of all of them in one parallel loop (a layer's
    // experts each have their own input).
    size_t n_x24 = 0;
    x24_inputs_.clear();
    for (size_t i = 0; i < batch_.size(); ++i) {
      BatchedProduct& j = batch_[i];
      if (j.int8 || j.split != nullptr || j.w->bits != 4) continue;
      for (size_t k = 0; k < i && j.x24 == nullptr; ++k) {
        const BatchedProduct& o = batch_[k];
        if (o.x24 != nullptr && o.x == j.x && o.x_rows == j.x_rows && o.x_stride == j.x_stride &&
            o.w->cols == j.w->cols && o.w->group_size == j.w->group_size)
          j.x24 = o.x24;
      }
      if (j.x24 != nullptr) continue;
      if (x24_.size() <= n_x24) x24_.resize(n_x24 + 1);
      cpu::X24Buffer& xa = x24_[n_x24];
      if (!xa.resize(j.x_rows, j.w->cols, j.w->group_size)) continue;
      x24_inputs_.push_back({&xa, j.x, j.x_stride});
      j.x24 = &xa;
      ++n_x24;
    }
    prepare_x24_inputs();
    for (BatchedProduct& j : batch_)
      if (j.x24 != nullptr && j.x24->cols() == 0) j.x24 = nullptr;  // inf or NaN: float32
    const int64_t grain = any_split ? split_grain(max_cols) : product_grain(max_cols);
    pool_.parallel_for(total_rows, grain, [&](int64_t b, int64_t e) {
      for (const BatchedProduct& j : batch_) {
        const int64_t lo = std::max(b, j.first_row) - j.first_row;
        const int64_t hi = std::min(e, j.first_row + j.w->rows) - j.first_row;
        if (lo >= hi) continue;
        if (j.q8 != nullptr && j.x_rows == 1)
          cpu::qmatvec_q8(*j.w, j.q8->row(0), j.y, lo, hi);
        else if (j.q8 != nullptr)
          cpu::qmatmul_q8(*j.w, *j.q8, j.y, j.y_stride, lo, hi);
        else if (j.x24 != nullptr && j.x_rows == 1)
          cpu::qmatvec_x24(*j.w, *j.x24, j.y, lo, hi);
        else if (j.x24 != nullptr)
          cpu::qmatmul_x24(*j.w, *j.x24, j.y, j.y_stride, lo, hi);
        else if (j.x_rows == 1)
          cpu::qmatvec(*j.w, j.x, j.y, lo, hi);
        else if (j.split != nullptr)
          cpu::qmatmul_split(*j.w, *j.split, j.y, j.y_stride, lo, hi);
        else
          cpu::qmatmul(*j.w, j.x, j.x_rows, j.x_stride, j.y, j.y_stride, lo, hi);
      }
    });
  }

  void embed(const QWeight& tq, std::span<const int32_t> ids, float s, Mat out) override {
    const cpu::QuantMatrix& t = static_cast<const CpuQWeight&>(tq).m;
    check_embed_args(t.rows, t.cols, ids, out);
    float* p = f32(out);
    for_rows(out.rows, out.cols, [&](int64_t r) {
      float* row = p + r * out.stride;
      cpu::qdequant_row(t, ids[static_cast<size_t>(r)], row);
      for (int64_t c = 0; c < out.cols; ++c) row[c] *= s;
    });
  }

  void gather_rows(Mat src, std::span<const int32_t> rows, Mat dst) override {
    if (dst.rows != static_cast<int64_t>(rows.size()) || dst.cols != src.cols)
      throw std::logic_error("gather_rows: shape mismatch");
    const float* s = f32(src);
    float* d = f32(dst);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= src.rows)
        throw std::logic_error("gather_rows: row out of range");
      std::memcpy(d + static_cast<int64_t>(i) * dst.stride, s + rows[i] * src.stride,
                  sizeof(float) * src.cols);
    }
  }

  void scatter_add_rows(Mat src, std::span<const int32_t> rows, std::span<const float> weights,
                        Mat dst) override {
    if (src.rows != static_cast<int64_t>(rows.size()) || rows.size() != weights.size() ||
        dst.cols != src.cols)
      throw std::logic_error("scatter_add_rows: shape mismatch");
    const float* s = f32(src);
    float* d = f32(dst);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= dst.rows)
        throw std::logic_error("scatter_add_rows: row out of range");
      cpu::axpy_f32(weights[i], s + static_cast<int64_t>(i) * src.stride, d + rows[i] * dst.stride,
                    src.cols);
    }
  }

  // ---- attention ----

  // The CPU's K and V are head-major, [num_kv_heads, capacity, head_dim]: the attention reads one
  // KV head's keys at a time, and that way they are contiguous (sequential reads the hardware
  // prefetches; at head_dim 256 a page holds 8 keys in f16) instead of one head_dim row per
  // num_kv_heads * head_dim (4 KiB of f16 on the 26B: every key its own page).
  void kv_store(const KvLayerView& kv, Mat k, Mat v, int64_t pos0) override {
    check_kv_store_args(kv, k, v, pos0);
    const int64_t d = kv.head_dim;
    const int64_t head_rows = kv.capacity * d;  // one KV head's block, in elements
    const float* pk = f32(k);
    const float* pv = f32(v);
    std::byte* kb = bytes_of(*kv.k);
    std::byte* vb = bytes_of(*kv.v);
    for (int64_t t = 0; t < k.rows; ++t) {
      const int64_t slot = kv.slot(pos0 + t);
      for (int g = 0; g < kv.num_kv_heads; ++g) {
        const int64_t at = g * head_rows + slot * d;
        const float* src_k = pk + t * k.stride + g * d;
        const float* src_v = pv + t * v.stride + g * d;
        if (kv.dtype == KvDType::f32) {
          std::memcpy(reinterpret_cast<float*>(kb) + at, src_k, 4 * d);
          std::memcpy(reinterpret_cast<float*>(vb) + at, src_v, 4 * d);
        } else {
          cpu::f32_to_f16(src_k, reinterpret_cast<uint16_t*>(kb) + at, d);
          cpu::f32_to_f16(src_v, reinterpret_cast<uint16_t*>(vb) + at, d);
        }
      }
    }
  }

  // Each query row's keys are cut into blocks of cpu::kAttentionBlock positions counted from
  // its first visible one; a task is one (row, KV head, block): the query heads that share the
  // KV head read each key and value row once together (attention_partial). A second loop merges
  // each head's blocks (attention_combine). The blocks depend on positions only, so the result
  // is the same bits for any thread count, and for a position whether it is decoded or part of a
  // prefill chunk. Rows are taken in waves so that the partials stay within kPartialFloats.
  void attention(Mat q, const KvLayerView& kv, int64_t pos0, int n_heads, float scale,
                 Mat out) override {
    check_attention_args(q, kv, n_heads, out);
    if (q.rows == 0) return;
    const int d = kv.head_dim;
    const int kv_heads = kv.num_kv_heads;
    const int group = n_heads / kv_heads;
    const float* pq = f32(q);
    float* po = f32(out);
    const int64_t B = cpu::kAttentionBlock;
    const auto visible = [&](int64_t t) {
      const int64_t pos = pos0 + t;
      return std::pair{kv.first_visible(pos), pos + 1};  // [first, end)
    };
    // Rows see nondecreasing key counts: the last one sees the most.
    const auto [last_first, last_end] = visible(q.rows - 1);
    if (kv.ring && last_end - last_first > kv.capacity)
      throw std::logic_error("attention: window exceeds the ring");
    const int64_t max_blocks = (last_end - last_first + B - 1) / B;
    const int64_t per_row = static_cast<int64_t>(n_heads) * max_blocks;  // partials of a row
    const int64_t wave = std::clamp<int64_t>(kPartialFloats / (per_row * (d + 2)), 1, q.rows);
    attn_m_.resize(static_cast<size_t>(wave * per_row));
    attn_w_.resize(static_cast<size_t>(wave * per_row));
    attn_o_.resize(static_cast<size_t>(wave * per_row * d));
    const bool f16 = kv.dtype == KvDType::f16;
    const size_t elem = f16 ? 2 : 4;
    const std::byte* kb = bytes_of(*kv.k);
    const std::byte* vb = bytes_of(*kv.v);
    // Partial of (row t of the wave, KV head g, block b): index ((t * kv_heads + g) *
    // max_blocks + b) * group + i for query head g * group + i.
    const auto at = [&](int64_t t, int g, int64_t b) {
      return ((t * kv_heads + g) * max_blocks + b) * group;
    };
    for (int64_t t0 = 0; t0 < q.rows; t0 += wave) {
      const int64_t rows = std::min(wave, q.rows - t0);
      pool_.parallel_for(rows * kv_heads * max_blocks, 1, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> scratch;
        scratch.resize(static_cast<size_t>(group * B));
        for (int64_t task = begin; task < end; ++task) {
          // Rows vary fastest: a thread's run of tasks reads the same block of keys and values
          // (or, for a sliding window, one shifted by a key per row) for consecutive queries,
          // from L1 or L2 instead of from memory once per query.
          const int64_t t = task % rows;
          const int g = static_cast<int>(task / rows % kv_heads);
          const int64_t b = task / (rows * kv_heads);
          const auto [first, last] = visible(t0 + t);
          const int64_t kb0 = first + b * B;
          if (kb0 >= last) continue;  // this row sees fewer blocks
          cpu::AttentionKv rows_of;
          rows_of.k = kb + static_cast<size_t>(g * kv.capacity) * d * elem;  // head-major
          rows_of.v = vb + static_cast<size_t>(g * kv.capacity) * d * elem;
          rows_of.f16 = f16;
          rows_of.row_stride = d;
          rows_of.capacity = kv.capacity;
          rows_of.ring = kv.ring;
          rows_of.fetch_ahead = q.rows == 1;  // decode: each key's row is read once
          const int64_t i0 = at(t, g, b);
          cpu::attention_partial(pq + (t0 + t) * q.stride + static_cast<int64_t>(g) * group * d, d,
                                 group, d, scale, rows_of, kb0, std::min(kb0 + B, last),
                                 attn_m_.data() + i0, attn_w_.data() + i0, attn_o_.data() + i0 * d,
                                 scratch.data());
        }
      });
      pool_.parallel_for(rows * n_heads, 4, [&](int64_t begin, int64_t end) {
        for (int64_t task = begin; task < end; ++task) {
          const int64_t t = task / n_heads;
          const int h = static_cast<int>(task % n_heads);
          const auto [first, last] = visible(t0 + t);
          const int64_t i0 = at(t, h / group, 0) + h % group;
          cpu::attention_combine(attn_m_.data() + i0, attn_w_.data() + i0, attn_o_.data() + i0 * d,
                                 group, static_cast<int>((last - first + B - 1) / B), d,
                                 po + (t0 + t) * out.stride + static_cast<int64_t>(h) * d);
        }
      });
    }
  }

  // ---- routing ----

  void route(Mat logits, int top_k, const Buffer& per_expert_scale, int32_t* idx,
             float* weights) override {
    const int64_t n = logits.cols;
    if (top_k <= 0 || top_k > n) throw std::logic_error("route: bad top_k");
    if (per_expert_scale.size_bytes() < sizeof(float) * n)
      throw std::logic_error("route: per_expert_scale too short");
    const float* pes = reinterpret_cast<const float*>(bytes_of(per_expert_scale));
    const float* pl = f32(logits);
    std::vector<float> p(static_cast<size_t>(n));
    for (int64_t t = 0; t < logits.rows; ++t) {
      std::copy_n(pl + t * logits.stride, n, p.data());
      cpu::softmax(p.data(), n);
      int32_t* ti = idx + t * top_k;
      float* tw = weights + t * top_k;
      cpu::top_k(p.data(), n, top_k, ti);
      float sum = 0.0f;
      for (int j = 0; j < top_k; ++j) sum += p[static_cast<size_t>(ti[j])];
      for (int j = 0; j < top_k; ++j) tw[j] = (p[static_cast<size_t>(ti[j])] / sum) * pes[ti[j]];
    }
  }

 private:
  // One product of a qmatmul_batch call; its rows are [first_row, first_row + w->rows) of the
  // combined row range.
  struct BatchedProduct {
    const cpu::QuantMatrix* w;
    bool int8;  // whether the plan puts this product on the 8-bit path
    const float* x;
    int64_t x_rows;
    int64_t x_stride;
    float* y;
    int64_t y_stride;
    int64_t first_row;
    const cpu::Q8Buffer* q8;  // the quantized input on the 8-bit path, else null
    // The split input when the exact product runs on the matrix unit, else null.
    const cpu::SplitActivation* split;
    // The prepared input of an exact single-row product by integer dot products, else null.
    const cpu::X24Buffer* x24;
  };
  ThreadPool pool_;
  ActivationPlan plan_ = ActivationPlan::exact();
  RopeTables rope_tables_;  // computed once per chunk and layer kind
  // Quantized inputs of the current product(s); a deque keeps them in place as it grows.
  std::deque<cpu::Q8Buffer> q8_;
  // Inputs split for the matrix unit (exact products of several rows on AMX CPUs).
  std::deque<cpu::SplitActivation> split_;
  std::deque<cpu::X24Buffer> x24_;
  // The inputs prepare_x24_inputs prepares (buffer, rows, row stride) and the first combined
  // row of each.
  struct X24Input {
    cpu::X24Buffer* buf;
    const float* x;
    int64_t stride;
  };
  std::vector<X24Input> x24_inputs_;
  std::vector<int64_t> x24_first_;
  std::vector<BatchedProduct> batch_;  // kept to avoid an allocation per call
  // Attention's per-block partials (max, weight, values), kept between calls; at most
  // kPartialFloats values (16 MiB) beyond a single row's.
  static constexpr int64_t kPartialFloats = int64_t{4} << 20;
  std::vector<float> attn_m_, attn_w_, attn_o_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace redwing
