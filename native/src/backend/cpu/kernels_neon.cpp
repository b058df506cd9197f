// AArch64 Advanced SIMD (NEON) kernels. Advanced SIMD and the half-precision conversions are
// part of the base AArch64 architecture, so no run-time feature check is needed; CMakeLists.txt
// compiles this file only for arm64 targets.
//
// The quantized matrix-vector product uses the method of kernels_avx2.cpp with 4 lanes: a
// 16-byte block holds 4 words, lane i holds word i; masking step k's bits leaves element
// (i * kPerWord + k) of the block scaled by 2^(kBits * k), the unsigned conversion to float is
// exact, and x is prepared once per call as x[i * kPerWord + k] * 2^(-kBits * k). NEON converts
// unsigned integers directly, so every step, the top one included, is a mask.
#include <arm_neon.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels_impl.h"

namespace redwing::cpu {
namespace {

inline float32x4_t load_bf16x4(const uint16_t* p) {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

inline float32x4_t load_f16x4(const uint16_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

void scales_to_f32(const void* p, ScaleType type, int64_t offset, int64_t n, float* out) {
  int64_t i = 0;
  const auto* h = static_cast<const uint16_t*>(p) + offset;
  if (type == ScaleType::bf16) {
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, load_bf16x4(h + i));
  } else if (type == ScaleType::f16) {
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, load_f16x4(h + i));
  }
  for (; i < n; ++i) out[i] = load_scale(p, type, offset + i);
}

// ---- qmatvec ---------------------------------------------------------------------------------

template <int kBits>
struct Layout {
  static constexpr int kPerWord = 32 / kBits;  // elements per uint32 word
  static constexpr int kBlock = 4 * kPerWord;  // elements per 16-byte block
  static constexpr uint32_t kMask = (1u << kBits) - 1u;
};

template <int kBits>
void prepare_x(const float* x, int64_t cols, int group_size, float* xt, float* sx) {
  using L = Layout<kBits>;
  for (int64_t b0 = 0; b0 < cols; b0 += L::kBlock) {
    for (int k = 0; k < L::kPerWord; ++k) {
      const float scale = std::ldexp(1.0f, -kBits * k);
      for (int i = 0; i < 4; ++i) xt[b0 + 4 * k + i] = x[b0 + i * L::kPerWord + k] * scale;
    }
  }
  for (int64_t g = 0; g * group_size < cols; ++g) {
    const float* xg = x + g * group_size;
    float32x4_t a0 = vld1q_f32(xg), a1 = vld1q_f32(xg + 4);
    float32x4_t a2 = vld1q_f32(xg + 8), a3 = vld1q_f32(xg + 12);
    for (int j = 16; j < group_size; j += 16) {
      a0 = vaddq_f32(a0, vld1q_f32(xg + j));
      a1 = vaddq_f32(a1, vld1q_f32(xg + j + 4));
      a2 = vaddq_f32(a2, vld1q_f32(xg + j + 8));
      a3 = vaddq_f32(a3, vld1q_f32(xg + j + 12));
    }
    sx[g] = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
  }
}

template <int kBits, int kRows>
inline void block_dot(const uint32_t* const* rows, int64_t blk, const float* xtb,
                      float32x4_t* out) {
  using L = Layout<kBits>;
  uint32x4_t wv[kRows];
  for (int i = 0; i < kRows; ++i) wv[i] = vld1q_u32(rows[i] + blk * 4);
  for (int k = 0; k < L::kPerWord; ++k) {
    const float32x4_t xk = vld1q_f32(xtb + 4 * k);
    const uint32x4_t mask = vdupq_n_u32(L::kMask << (kBits * k));
    for (int i = 0; i < kRows; ++i) {
      out[i] = vfmaq_f32(out[i], vcvtq_f32_u32(vandq_u32(wv[i], mask)), xk);
    }
  }
}

template <int kBits, int kGroup, int kRows>
void qmv_rows(const QuantMatrix& w, const float* xt, const float* sx, int64_t r0, float* y,
              float* sbuf, float* bbuf) {
  using L = Layout<kBits>;
  static_assert(kGroup % L::kBlock == 0);
  constexpr int kBlocksPerGroup = kGroup / L::kBlock;
  const int64_t wpr = w.cols / L::kPerWord;
  const int64_t gpr = w.cols / kGroup;
  const uint32_t* rows[kRows];
  for (int i = 0; i < kRows; ++i) rows[i] = w.packed + (r0 + i) * wpr;
  scales_to_f32(w.scales, w.scale_type, r0 * gpr, kRows * gpr, sbuf);
  scales_to_f32(w.biases, w.scale_type, r0 * gpr, kRows * gpr, bbuf);
  float32x4_t acc[kRows];
  float32x4_t bias_acc[kRows];
  for (int i = 0; i < kRows; ++i) {
    acc[i] = vdupq_n_f32(0.0f);
    bias_acc[i] = vdupq_n_f32(0.0f);
  }
  int64_t g = 0;
  for (; g + 4 <= gpr; g += 4) {
    for (int i = 0; i < kRows; ++i) {
      bias_acc[i] = vfmaq_f32(bias_acc[i], vld1q_f32(bbuf + i * gpr + g), vld1q_f32(sx + g));
    }
  }
  float bias_tail[kRows] = {};
  for (; g < gpr; ++g) {
    for (int i = 0; i < kRows; ++i) bias_tail[i] += bbuf[i * gpr + g] * sx[g];
  }
  for (g = 0; g < gpr; ++g) {
    float32x4_t gacc[kRows];
    for (int i = 0; i < kRows; ++i) gacc[i] = vdupq_n_f32(0.0f);
    for (int bb = 0; bb < kBlocksPerGroup; ++bb) {
      const int64_t blk = g * kBlocksPerGroup + bb;
      block_dot<kBits, kRows>(rows, blk, xt + blk * L::kBlock, gacc);
    }
    for (int i = 0; i < kRows; ++i) acc[i] = vfmaq_n_f32(acc[i], gacc[i], sbuf[i * gpr + g]);
  }
  for (int i = 0; i < kRows; ++i) {
    y[r0 + i] = vaddvq_f32(vaddq_f32(acc[i], bias_acc[i])) + bias_tail[i];
  }
}

template <int kBits, int kGroup>
void qmv_range(const QuantMatrix& w, const float* xt, const float* sx, float* y, int64_t rb,
               int64_t re, float* sbuf, float* bbuf) {
  constexpr int kRows = 4;
  int64_t r = rb;
  for (; r + kRows <= re; r += kRows) qmv_rows<kBits, kGroup, kRows>(w, xt, sx, r, y, sbuf, bbuf);
  for (; r < re; ++r) qmv_rows<kBits, kGroup, 1>(w, xt, sx, r, y, sbuf, bbuf);
}

template <int kBits, int kGroup>
void qmatvec_shaped(const QuantMatrix& w, const float* x, float* y, int64_t rb, int64_t re) {
  thread_local Scratch xt_buf, sx_buf, s_buf, b_buf;
  const int64_t gpr = groups_per_row(w);
  float* xt = xt_buf.floats(static_cast<size_t>(w.cols));
  float* sx = sx_buf.floats(static_cast<size_t>(gpr));
  float* sbuf = s_buf.floats(static_cast<size_t>(4 * gpr));
  float* bbuf = b_buf.floats(static_cast<size_t>(4 * gpr));
  prepare_x<kBits>(x, w.cols, w.group_size, xt, sx);
  qmv_range<kBits, kGroup>(w, xt, sx, y, rb, re, sbuf, bbuf);
}

void qmatvec_neon(const QuantMatrix& w, const float* x, float* y, int64_t rb, int64_t re) {
  with_quant_shape(
      w, [&]<int kBits, int kGroup>() { qmatvec_shaped<kBits, kGroup>(w, x, y, rb, re); });
}

// ---- dequantization and qmatmul --------------------------------------------------------------

void qdequant_row_neon(const QuantMatrix& w, int64_t row, float* out) {
  const int64_t gpr = groups_per_row(w);
  const uint32_t* packed = w.packed + row * words_per_row(w);
  const auto* bytes = reinterpret_cast<const uint8_t*>(packed);
  for (int64_t g = 0; g < gpr; ++g) {
    const float32x4_t s = vdupq_n_f32(load_scale(w.scales, w.scale_type, row * gpr + g));
    const float32x4_t b = vdupq_n_f32(load_scale(w.biases, w.scale_type, row * gpr + g));
    for (int64_t c = g * w.group_size; c < (g + 1) * w.group_size; c += 16) {
      uint8x16_t q;
      if (w.bits == 4) {
        // 8 bytes hold 16 nibbles, low nibble first: interleave the low and high halves.
        const uint8x8_t v = vld1_u8(bytes + c / 2);
        const uint8x8_t lo = vand_u8(v, vdup_n_u8(0xf));
        const uint8x8_t hi = vshr_n_u8(v, 4);
        q = vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
      } else {
        q = vld1q_u8(bytes + c);
      }
      const uint16x8_t q0 = vmovl_u8(vget_low_u8(q));
      const uint16x8_t q1 = vmovl_u8(vget_high_u8(q));
      vst1q_f32(out + c, vfmaq_f32(b, s, vcvtq_f32_u32(vmovl_u16(vget_low_u16(q0)))));
      vst1q_f32(out + c + 4, vfmaq_f32(b, s, vcvtq_f32_u32(vmovl_u16(vget_high_u16(q0)))));
      vst1q_f32(out + c + 8, vfmaq_f32(b, s, vcvtq_f32_u32(vmovl_u16(vget_low_u16(q1)))));
      vst1q_f32(out + c + 12, vfmaq_f32(b, s, vcvtq_f32_u32(vmovl_u16(vget_high_u16(q1)))));
    }
  }
}

// 4 weight rows x up to 4 X rows of dot products over n columns (a multiple of 4).
template <int kRows, int kCols>
void micro_kernel(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y,
                  int64_t ys) {
  float32x4_t acc[kRows][kCols];
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < kCols; ++t) acc[i][t] = vdupq_n_f32(0.0f);
  }
  for (int64_t c = 0; c < n; c += 4) {
    float32x4_t xv[kCols];
    for (int t = 0; t < kCols; ++t) xv[t] = vld1q_f32(x + t * xs + c);
    for (int i = 0; i < kRows; ++i) {
      const float32x4_t wv = vld1q_f32(w + i * ws + c);
      for (int t = 0; t < kCols; ++t) acc[i][t] = vfmaq_f32(acc[i][t], wv, xv[t]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < kCols; ++t) y[t * ys + i] = vaddvq_f32(acc[i][t]);
  }
}

template <int kRows>
void micro_rows(const float* w, int64_t ws, const float* x, int64_t xs, int64_t n, float* y,
                int64_t ys, int n_cols) {
  switch (n_cols) {
    case 4:
      return micro_kernel<kRows, 4>(w, ws, x, xs, n, y, ys);
    case 3:
      return micro_kernel<kRows, 3>(w, ws, x, xs, n, y, ys);
    case 2:
      return micro_kernel<kRows, 2>(w, ws, x, xs, n, y, ys);
    default:
      return micro_kernel<kRows, 1>(w, ws, x, xs, n, y, ys);
  }
}

void qmatmul_neon(const QuantMatrix& w, const float* x, int64_t n_x, int64_t xs, float* y,
                  int64_t ys, int64_t rb, int64_t re) {
  constexpr int64_t kPanel = 16;
  const int64_t cols = w.cols;
  thread_local Scratch panel_buf;
  float* panel = panel_buf.floats(static_cast<size_t>(kPanel * cols));
  for (int64_t p0 = rb; p0 < re; p0 += kPanel) {
    const int64_t np = std::min(kPanel, re - p0);
    for (int64_t i = 0; i < np; ++i) qdequant_row_neon(w, p0 + i, panel + i * cols);
    for (int64_t t0 = 0; t0 < n_x; t0 += 4) {
      const int nt = static_cast<int>(std::min<int64_t>(4, n_x - t0));
      const float* xt = x + t0 * xs;
      float* yt = y + t0 * ys + p0;
      int64_t i = 0;
      for (; i + 4 <= np; i += 4)
        micro_rows<4>(panel + i * cols, cols, xt, xs, cols, yt + i, ys, nt);
      for (; i < np; ++i) micro_rows<1>(panel + i * cols, cols, xt, xs, cols, yt + i, ys, nt);
    }
  }
}

// ---- element-wise, dot, axpy, conversions ----------------------------------------------------

void rms_norm_neon(const float* x, const float* weight, float weight_offset, float eps, int64_t n,
                   float* y) {
  float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float32x4_t v0 = vld1q_f32(x + i), v1 = vld1q_f32(x + i + 4);
    a0 = vfmaq_f32(a0, v0, v0);
    a1 = vfmaq_f32(a1, v1, v1);
  }
  float ss = vaddvq_f32(vaddq_f32(a0, a1));
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (i = 0; i + 4 <= n; i += 4) {
    float32x4_t v = vmulq_n_f32(vld1q_f32(x + i), inv);
    if (weight) v = vmulq_f32(v, vaddq_f32(vdupq_n_f32(weight_offset), vld1q_f32(weight + i)));
    vst1q_f32(y + i, v);
  }
  for (; i < n; ++i) y[i] = x[i] * inv * (weight ? weight_offset + weight[i] : 1.0f);
}

float dot_f32_neon(const float* a, const float* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0.0f), s1 = vdupq_n_f32(0.0f);
  float32x4_t s2 = vdupq_n_f32(0.0f), s3 = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
    s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
  }
  for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
  float total = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

float dot_f16_neon(const float* a, const uint16_t* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0.0f), s1 = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), load_f16x4(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), load_f16x4(b + i + 4));
  }
  for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), load_f16x4(b + i));
  float total = vaddvq_f32(vaddq_f32(s0, s1));
  for (; i < n; ++i) total += a[i] * f16_bits_to_f32(b[i]);
  return total;
}

void axpy_f32_neon(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
  for (; i < n; ++i) y[i] += a * x[i];
}

void axpy_f16_neon(float a, const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), load_f16x4(x + i), a));
  for (; i < n; ++i) y[i] += a * f16_bits_to_f32(x[i]);
}

void f32_to_f16_neon(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  // FCVTN rounds with the FPCR mode, which is round-to-nearest-even unless changed.
  for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
  for (; i < n; ++i) y[i] = f32_to_f16_bits(x[i]);
}

void f16_to_f32_neon(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_f16x4(x + i));
  for (; i < n; ++i) y[i] = f16_bits_to_f32(x[i]);
}

// ---- qmatmul_q8 (8-bit activations, kernels.h) ----------------------------------------------

// The int32 dot products of 16 weight bytes with their activations, one lane per uint32 word.
// 4-bit: the low nibbles (even values) meet a_lo, the high nibbles (odd values) a_hi; 8-bit:
// codes 0..255 are not int8, so they are split into nibbles and recombined as lo + 16 * hi.
// SDOT (the dot-product extension, every Apple CPU) does a word per lane in one instruction;
// without it, widening multiplies and two pairwise additions do the same.
inline int32x4_t dot_words(uint8x16_t w, const int8_t* a_lo, const int8_t* a_hi, int bits) {
  const uint8x16_t nibble = vdupq_n_u8(0x0f);
  const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(w, nibble));
  const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
  const int8x16_t x_lo = vld1q_s8(a_lo);
  const int8x16_t x_hi = vld1q_s8(a_hi);
#if defined(__ARM_FEATURE_DOTPROD)
  const int32x4_t dl = vdotq_s32(vdupq_n_s32(0), lo, x_lo);
  const int32x4_t dh = vdotq_s32(vdupq_n_s32(0), hi, x_hi);
#else
  auto dot = [](int8x16_t q, int8x16_t x) {
    const int32x4_t p0 = vpaddlq_s16(vmull_s8(vget_low_s8(q), vget_low_s8(x)));
    const int32x4_t p1 = vpaddlq_s16(vmull_high_s8(q, x));
    return vpaddq_s32(p0, p1);
  };
  const int32x4_t dl = dot(lo, x_lo);
  const int32x4_t dh = dot(hi, x_hi);
#endif
  return bits == 4 ? vaddq_s32(dl, dh) : vaddq_s32(dl, vshlq_n_s32(dh, 4));
}

// One 16-byte register covers 32 4-bit or 16 8-bit values: a single activation block and a
// single weight group, so one scale s * d applies to the whole register.
void qmatmul_q8_neon(const QuantMatrix& w, const Q8Activation* xa, int64_t n_x, float* y,
                     int64_t y_stride, int64_t rb, int64_t re) {
  const int values = 128 / w.bits;  // per 16-byte register
  const int64_t n_regs = w.cols / values;
  const int64_t wpr = words_per_row(w);
  const int64_t gpr = groups_per_row(w);
  thread_local Scratch sums_buf, s_buf;
  float* sums = sums_buf.floats(static_cast<size_t>(gpr));
  float* sc = s_buf.floats(static_cast<size_t>(gpr));
  for (int64_t t = 0; t < n_x; ++t) {
    const Q8Activation& x = xa[t];
    q8_group_sums(x, w.group_size, sums);
    float* yt = y + t * y_stride;
    for (int64_t r = rb; r < re; ++r) {
      const auto* row = reinterpret_cast<const uint8_t*>(w.packed + r * wpr);
      scales_to_f32(w.scales, w.scale_type, r * gpr, gpr, sc);
      float32x4_t acc = vdupq_n_f32(0.0f);
      for (int64_t k = 0; k < n_regs; ++k) {
        const int64_t c0 = k * values;  // first value of the register
        const int8_t* a_lo;
        const int8_t* a_hi;
        if (w.bits == 4) {
          // Even values of the 128-value block first, then the odd ones (kernels.h).
          a_lo = x.q + (c0 & ~int64_t{127}) + (c0 & 127) / 2;
          a_hi = a_lo + 64;
        } else {
          a_lo = a_hi = x.q + c0;
        }
        const int32x4_t dots = dot_words(vld1q_u8(row + k * 16), a_lo, a_hi, w.bits);
        const float scale = sc[c0 / w.group_size] * x.scale[c0 / kQ8Block];
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(dots), scale);
      }
      float bias = 0.0f;
      for (int64_t g = 0; g < gpr; ++g)
        bias += load_scale(w.biases, w.scale_type, r * gpr + g) * sums[g];
      yt[r] = vaddvq_f32(acc) + bias;
    }
  }
}

void bf16_to_f32_neon(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_bf16x4(x + i));
  for (; i < n; ++i) y[i] = bf16_bits_to_f32(x[i]);
}

}  // namespace

const KernelTable& neon_kernels() {
  static const KernelTable table = [] {
    KernelTable t = scalar_kernels();
    t.qmatvec = qmatvec_neon;
    t.qmatmul = qmatmul_neon;
    t.qdequant_row = qdequant_row_neon;
    t.qmatmul_q8 = qmatmul_q8_neon;
    t.rms_norm = rms_norm_neon;
    t.dot_f32 = dot_f32_neon;
    t.dot_f16 = dot_f16_neon;
    t.axpy_f32 = axpy_f32_neon;
    t.axpy_f16 = axpy_f16_neon;
    t.f32_to_f16 = f32_to_f16_neon;
    t.f16_to_f32 = f16_to_f32_neon;
    t.bf16_to_f32 = bf16_to_f32_neon;
    return t;
  }();
  return table;
}

}  // namespace redwing::cpu
