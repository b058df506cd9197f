// Scalar reference implementations of the CPU kernels (kernels.h). These define the expected
// results: the SIMD versions are tested against them. They favour clarity over speed but keep
// float32 accumulation, as the SIMD versions do, so that the comparison tolerances only have to
// cover summation order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/kernels_impl.h"

namespace redwing::cpu {
namespace {

// sum(x) over each group of the input vector, used for the bias term of every row.
void group_sums(const float* x, int64_t cols, int group_size, std::vector<float>& out) {
  out.resize(static_cast<size_t>(cols / group_size));
  for (int64_t g = 0; g * group_size < cols; ++g) {
    float s = 0.0f;
    for (int j = 0; j < group_size; ++j) s += x[g * group_size + j];
    out[static_cast<size_t>(g)] = s;
  }
}

// y[r] = sum_g (s_g * sum_{c in g} x_c q_c + b_g * sum_{c in g} x_c): the bias factors out of
// each group, which is how MLX's qmv accumulates too.
void qmatvec_scalar(const QuantMatrix& w, const float* x, float* y, int64_t row_begin,
                    int64_t row_end) {
  thread_local std::vector<float> sums;
  group_sums(x, w.cols, w.group_size, sums);
  const int64_t wpr = words_per_row(w);
  const int64_t gpr = groups_per_row(w);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint32_t* row = w.packed + r * wpr;
    float acc = 0.0f;
    for (int64_t g = 0; g < gpr; ++g) {
      float sxq = 0.0f;
      const int64_t c0 = g * w.group_size;
      for (int64_t c = c0; c < c0 + w.group_size; ++c) {
        sxq += x[c] * static_cast<float>(quant_at(row, w.bits, c));
      }
      const float s = load_scale(w.scales, w.scale_type, r * gpr + g);
      const float b = load_scale(w.biases, w.scale_type, r * gpr + g);
      acc += s * sxq + b * sums[static_cast<size_t>(g)];
    }
    y[r] = acc;
  }
}

void qdequant_row_scalar(const QuantMatrix& w, int64_t row, float* out) {
  const uint32_t* packed = w.packed + row * words_per_row(w);
  const int64_t gpr = groups_per_row(w);
  for (int64_t g = 0; g < gpr; ++g) {
    const float s = load_scale(w.scales, w.scale_type, row * gpr + g);
    const float b = load_scale(w.biases, w.scale_type, row * gpr + g);
    for (int64_t c = g * w.group_size; c < (g + 1) * w.group_size; ++c) {
      out[c] = s * static_cast<float>(quant_at(packed, w.bits, c)) + b;
    }
  }
}

// The 8-bit-activation product (kernels.h): per block of kQ8Block values an exact integer
// sum(q * a8), scaled by the block's d and the group's s; the bias multiplies the float32 group
// sum of x. The SIMD versions compute the same integers and differ only in float rounding.
void qmatvec_q8_one(const QuantMatrix& w, const Q8Activation& xa, float* y, int64_t row_begin,
                    int64_t row_end) {
  thread_local std::vector<float> sums;
  sums.resize(static_cast<size_t>(groups_per_row(w)));
  q8_group_sums(xa, w.group_size, sums.data());
  const int64_t wpr = words_per_row(w);
  const int64_t gpr = groups_per_row(w);
  const int64_t blocks_per_group = w.group_size / kQ8Block;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint32_t* row = w.packed + r * wpr;
    float acc = 0.0f;
    for (int64_t g = 0; g < gpr; ++g) {
      float sq = 0.0f;
      for (int64_t blk = g * blocks_per_group; blk < (g + 1) * blocks_per_group; ++blk) {
        int32_t isum = 0;
        for (int64_t c = blk * kQ8Block; c < (blk + 1) * kQ8Block; ++c) {
          isum += static_cast<int32_t>(quant_at(row, w.bits, c)) * xa.q[q8_index(w.bits, c)];
        }
        sq += xa.scale[blk] * static_cast<float>(isum);
      }
      const float s = load_scale(w.scales, w.scale_type, r * gpr + g);
      const float b = load_scale(w.biases, w.scale_type, r * gpr + g);
      acc += s * sq + b * sums[static_cast<size_t>(g)];
    }
    y[r] = acc;
  }
}

void qmatmul_q8_scalar(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y,
                       int64_t y_stride, int64_t row_begin, int64_t row_end) {
  for (int64_t t = 0; t < n_x; ++t) qmatvec_q8_one(w, xa[t], y + t * y_stride, row_begin, row_end);
}

// The reference for the matrix-unit product: x rebuilt exactly from its three bfloat16 parts,
// then qmatvec's per-group accumulation (s * sum(q x) + b * sum(x)), the group sums of x taken
// from the per-block sums in order, as the matrix-unit version does.
void qmatmul_split_scalar(const QuantMatrix& w, const SplitActivation& xs, float* y,
                          int64_t y_stride, int64_t row_begin, int64_t row_end) {
  thread_local std::vector<float> x;
  x.resize(static_cast<size_t>(w.cols));
  const int64_t n_kc = w.cols / kSplitK;
  const int64_t wpr = words_per_row(w);
  const int64_t gpr = groups_per_row(w);
  const int64_t blocks_per_group = w.group_size / kSplitK;
  for (int64_t t = 0; t < xs.rows(); ++t) {
    const int64_t tile_row = t / kSplitTile;
    const int64_t in_tile = t % kSplitTile;
    for (int64_t kc = 0; kc < n_kc; ++kc) {
      const uint16_t* tile = xs.tiles() + (tile_row * n_kc + kc) * 3 * 512 + in_tile * kSplitK;
      for (int j = 0; j < kSplitK; ++j) {
        // hi + mid + lo is exact in float32 (kernels.h), so the order of the two additions
        // does not matter.
        x[static_cast<size_t>(kc * kSplitK + j)] = bf16_bits_to_f32(tile[j]) +
                                                   bf16_bits_to_f32(tile[512 + j]) +
                                                   bf16_bits_to_f32(tile[1024 + j]);
      }
    }
    const float* block_sums = xs.block_sums() + t * n_kc;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint32_t* row = w.packed + r * wpr;
      float acc = 0.0f;
      for (int64_t g = 0; g < gpr; ++g) {
        float sxq = 0.0f;
        float sx = 0.0f;
        for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b)
          sx += block_sums[b];
        for (int64_t c = g * w.group_size; c < (g + 1) * w.group_size; ++c)
          sxq += x[static_cast<size_t>(c)] * static_cast<float>(quant_at(row, w.bits, c));
        const float s = load_scale(w.scales, w.scale_type, r * gpr + g);
        const float b = load_scale(w.biases, w.scale_type, r * gpr + g);
        acc += s * sxq + b * sx;
      }
      y[t * y_stride + r] = acc;
    }
  }
}

// Dequantizes one weight row at a time (s * q + b in float32, like MLX's qmm) and reuses it for
// every row of X.
void qmatmul_scalar(const QuantMatrix& w, const float* x, int64_t n_rows_x, int64_t x_stride,
                    float* y, int64_t y_stride, int64_t row_begin, int64_t row_end) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  for (int64_t r = row_begin; r < row_end; ++r) {
    qdequant_row_scalar(w, r, row.data());
    for (int64_t t = 0; t < n_rows_x; ++t) {
      const float* xt = x + t * x_stride;
      float acc = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) acc += row[static_cast<size_t>(c)] * xt[c];
      y[t * y_stride + r] = acc;
    }
  }
}

void rms_norm_scalar(const float* x, const float* weight, float weight_offset, float eps, int64_t n,
                     float* y) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    const float scale = weight ? weight_offset + weight[i] : 1.0f;
    y[i] = x[i] * inv * scale;
  }
}

void gelu_tanh_mul_scalar(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float t = std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g));
    out[i] = 0.5f * g * (1.0f + t) * up[i];
  }
}

void softcap_scalar(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void rope_neox_scalar(float* x, int64_t n_heads, int64_t head_dim, const float* cos,
                      const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t j = 0; j < half; ++j) {
      const float a = v[j];
      const float b = v[j + half];
      v[j] = a * cos[j] - b * sin[j];
      v[j + half] = b * cos[j] + a * sin[j];
    }
  }
}

float dot_f32_scalar(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

float dot_f16_scalar(const float* a, const uint16_t* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * f16_bits_to_f32(b[i]);
  return acc;
}

void axpy_f32_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void axpy_f16_scalar(float a, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * f16_bits_to_f32(x[i]);
}

void f32_to_f16_scalar(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16_bits(x[i]);
}

void f16_to_f32_scalar(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16_bits_to_f32(x[i]);
}

void bf16_to_f32_scalar(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_bits_to_f32(x[i]);
}

void softmax_scalar(float* x, int64_t n) {
  if (n <= 0) return;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{
      .qmatvec = qmatvec_scalar,
      .qmatmul = qmatmul_scalar,
      .qdequant_row = qdequant_row_scalar,
      .qmatmul_q8 = qmatmul_q8_scalar,
      .qmatmul_split = qmatmul_split_scalar,
      .rms_norm = rms_norm_scalar,
      .gelu_tanh_mul = gelu_tanh_mul_scalar,
      .softcap = softcap_scalar,
      .rope_neox = rope_neox_scalar,
      .dot_f32 = dot_f32_scalar,
      .dot_f16 = dot_f16_scalar,
      .axpy_f32 = axpy_f32_scalar,
      .axpy_f16 = axpy_f16_scalar,
      .f32_to_f16 = f32_to_f16_scalar,
      .f16_to_f32 = f16_to_f32_scalar,
      .bf16_to_f32 = bf16_to_f32_scalar,
      .softmax = softmax_scalar,
      .x24 = {},         // qmatvec's integer method needs integer dot products (kernels.h)
      .row_groups = {},  // rows one after another: dispatch.cpp copies row groups back to rows
  };
  return table;
}

}  // namespace redwing::cpu
