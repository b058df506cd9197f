// CPU kernels: the contract between the CPU backend and its implementations.
//
// Every kernel has a scalar reference implementation (kernels_scalar.cpp) and, where it matters
// for speed, SIMD versions (kernels_avx2.cpp, kernels_neon.cpp). The implementation is chosen at
// run time from the CPU's features (dispatch.cpp); tests force each one and compare it with the
// scalar reference. Activations and accumulation are float32, except where a kernel says
// otherwise (qmatvec's integer method, exact to float32's rounding; the 8-bit-activation
// products, approximate).
//
// Kernels work on row ranges so that the caller's thread pool can split the work: each call
// writes only the rows in [row_begin, row_end) and reads nothing another thread writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace redwing::cpu {

enum class ScaleType : uint8_t { bf16, f16, f32 };

// An MLX affine-quantized matrix [rows, cols] (docs/format.md): element (r, c) is
// s[r, c / group_size] * q[r, c] + b[r, c / group_size], with q packed low bits first into
// little-endian uint32 words. bits is 4 or 8; group_size 32, 64 or 128; cols % group_size == 0.
struct QuantMatrix {
  const uint32_t* packed = nullptr;  // [rows, cols * bits / 32]
  const void* scales = nullptr;      // [rows, cols / group_size], scale_type
  const void* biases = nullptr;      // [rows, cols / group_size], scale_type
  ScaleType scale_type = ScaleType::bf16;
  int bits = 4;
  int group_size = 64;
  int64_t rows = 0;
  int64_t cols = 0;
  // 1: rows one after another. kRowGroup: the row-group layout below (rows a multiple of 4).
  int row_group = 1;
};

// The row-group layout: rows in groups of 4, each group's 4 * words_per_row words holding block
// b of rows 4g, 4g + 1, 4g + 2, 4g + 3, then block b + 1, and so on, a block being 16 words (64
// bytes) of a row, the last one shorter where a row is not whole blocks (words_per_row % 16
// words each). The decode products read 4 rows a block at a time; laid out row after row that is
// 4 interleaved streams a row apart, which this machine's prefetchers follow at ~52 GB/s against
// ~67 for one stream (2 threads, docs/cpu.md session 32): grouped, the rows are one stream. Only
// the packed words move; scales and biases keep their row-major layout.
inline constexpr int kRowGroup = 4;

// Whether the active ISA's decode products (the exact one in use and the 8-bit-activation one)
// read row-grouped matrices natively: AVX512-VNNI (the integer method, its prefill tile and the
// 8-bit product) and AVX2 (the float32 and 8-bit decode products). Every kernel accepts both
// layouts; the others copy the groups they need back to rows first, which is correct but slower,
// so the CPU backend groups its resident weights only where this holds. REDWING_ROW_GROUPS=0
// says no (A/B runs).
bool row_groups_pay();

// Writes the row-group layout of the row-major packed words src (rows a multiple of 4) to dst,
// which may be src itself (then rewritten group by group in place).
void group_rows(const uint32_t* src, uint32_t* dst, int64_t rows, int64_t words_per_row);
// The inverse: n_groups groups at src back to 4 * n_groups rows at dst (not overlapping).
void ungroup_rows(const uint32_t* src, uint32_t* dst, int64_t n_groups, int64_t words_per_row);

// avx512 is the AVX2 set with the quantized products widened to 512 bits (needs AVX-512 F, BW,
// DQ and VL besides AVX2, FMA and F16C); the other kernels are the AVX2 ones. amx is the avx512
// set plus the prefill products on the matrix units (AMX-TILE and AMX-BF16, and the operating
// system's permission to use the tile registers): qmatmul and qmatmul_split below.
enum class Isa : uint8_t { scalar, avx2, neon, avx512, amx };

// The best implementation this CPU supports (AVX2 needs FMA and F16C too).
Isa detect_isa();
// The implementation in use; defaults to detect_isa(). Overridable with
// REDWING_ISA=scalar|avx2|avx512|amx|neon.
Isa active_isa();
// Tests and benchmarks switch implementations; returns false if the CPU lacks it.
bool set_active_isa(Isa isa);
const char* isa_name(Isa isa);
// The CPU features found, e.g. "avx2 fma f16c" (for diagnostics and the service's hello).
const char* cpu_features();

// ---- quantized products --------------------------------------------------------------------

// y[r] = sum_c W[r, c] * x[c] for r in [row_begin, row_end). y is indexed by absolute row.
// Accumulates s * sum(x q) + b * sum(x) per group in float32, as MLX's qmv does; qmatmul below
// dequantizes s * q + b first, as MLX's qmm does. Both are float32-accurate; they differ in
// rounding only. Throws std::invalid_argument for an unsupported matrix or a bad row range.
//
// The integer method (CPUs with AVX512-VNNI, 4-bit weights; default on): x is held as 24-bit
// integers X, each 8 consecutive values sharing a power-of-two unit e chosen from their largest
// |x| so that |X| < 2^23, and the weights' codes multiply X in exact integer arithmetic (three
// byte limbs through vpdpbusd); each 8-value partial sum is converted to float32 once. The only
// rounding besides the float32 accumulation over groups is x to X: at most 2^-23 of the largest
// |x| of its 8 (float32 rounds each value to 2^-24 of itself), while the float32 path rounds
// each of the 8 partial sums it adds. It is held to the float32 path's error bound in the tests.
// x with inf or NaN takes the float32 path (which propagates them).
void qmatvec(const QuantMatrix& w, const float* x, float* y, int64_t row_begin, int64_t row_end);

// Turns the integer method on or off (tests, A/B runs; REDWING_EXACT_PRODUCT=float|integer sets
// it at start-up); returns the previous setting. integer_exact_product_active() says whether
// qmatvec uses it now (on, and the active ISA has it).
bool set_integer_exact_product(bool on);
bool integer_exact_product_active();

// Rows of x prepared once for the integer method, then read by any number of threads (a
// product's row ranges, and every product of a batch with the same input): qmatvec converts x
// again at every call, which costs about as much as 20 rows of a 2,816-column product.
class X24Buffer {
 public:
  // Prepares one row of cols values for 4-bit matrices with this group size. Returns false,
  // leaving the buffer empty, where qmatvec would not use the integer method (off, not on this
  // ISA) or x holds inf or NaN: callers then use qmatvec. Throws std::invalid_argument for a
  // width that is not whole groups.
  bool prepare(const float* x, int64_t cols, int group_size);
  // The same for n_rows rows in two steps, so that rows can be prepared in parallel: resize
  // (false where the integer method is not in use; the same checks), then prepare_row for every
  // row t < n_rows, false where row t holds inf or NaN (the buffer must then not be used: take
  // the float32 path, which propagates them).
  bool resize(int64_t n_rows, int64_t cols, int group_size);
  bool prepare_row(int64_t t, const float* x);
  void clear() { cols_ = 0; }             // empty again (the storage is kept)
  int64_t cols() const { return cols_; }  // 0 when empty
  int64_t rows() const { return cols_ == 0 ? 0 : rows_; }
  int group_size() const { return group_size_; }

 private:
  friend void qmatvec(const QuantMatrix&, const float*, float*, int64_t, int64_t);
  friend void qmatvec_x24(const QuantMatrix&, const X24Buffer&, float*, int64_t, int64_t);
  friend void qmatmul_x24(const QuantMatrix&, const X24Buffer&, float*, int64_t, int64_t, int64_t);
  // Row t's limbs, units and sums are at limbs_ + t * limb_stride_ and so on.
  std::vector<std::byte> storage_;
  int8_t* limbs_ = nullptr;
  float* units_ = nullptr;
  float* sums_ = nullptr;
  int64_t limb_stride_ = 0, unit_stride_ = 0, sum_stride_ = 0;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int group_size_ = 0;
};

// qmatvec of a 4-bit matrix with a prepared x (row 0 of xa): the same bits as qmatvec with the
// integer method. Throws std::invalid_argument for a bad matrix or row range or an x prepared for
// another width or group size (or none), std::logic_error if the active ISA has no integer
// method.
void qmatvec_x24(const QuantMatrix& w, const X24Buffer& xa, float* y, int64_t row_begin,
                 int64_t row_end);

// Y[t * y_stride + r] for every prepared row t of xs and r in [row_begin, row_end): the exact
// prefill product by the integer method, row t getting the bits qmatvec_x24 gives it (so a
// token's products do not depend on how many tokens share the call). Weight rows stay in
// cache across a tile of tokens and each weight block's nibbles are unpacked once for several
// tokens. The same checks as qmatvec_x24.
void qmatmul_x24(const QuantMatrix& w, const X24Buffer& xs, float* y, int64_t y_stride,
                 int64_t row_begin, int64_t row_end);

// Y[t * y_stride + r] = sum_c W[r, c] * X[t * x_stride + c] for t in [0, n_rows_x),
// r in [row_begin, row_end). Reads each weight block once for all rows of X.
void qmatmul(const QuantMatrix& w, const float* x, int64_t n_rows_x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t row_begin, int64_t row_end);

// out[c] = W[row, c] for every column (embedding lookup).
void qdequant_row(const QuantMatrix& w, int64_t row, float* out);

// ---- exact products on bfloat16 matrix units ------------------------------------------------
//
// A float32 x is the exact sum of three bfloat16 values: hi = x with its low 16 bits cleared,
// mid = (x - hi) likewise, lo = x - hi - mid (8 + 8 + 8 significant bits, float32's 24; each
// subtraction is exact). The weights' 4-bit and 8-bit codes are exact in bfloat16 too, and the
// product of two bfloat16 values is exact in float32. So a bfloat16 dot-product unit that
// accumulates in float32 (AMX TDPBF16PS) computes sum(q * x) over a group as hi, mid and lo
// passes whose products are all exact: the result differs from the float32 path only in
// summation order. The product then accumulates s * sum(q x) + b * sum(x) per group, as qmatvec
// does. Limits: the split is exact for |x| >= 2^-110 (below, lo loses the bits under
// bfloat16's smallest subnormal, 2^-133); the matrix unit reads bfloat16 subnormals as zero
// (parts under 2^-126, so inputs under about 2^-103 = 1e-31 lose up to 2^-126 each) and flushes
// float32 subnormal sums, all far below what a model's activations or logits resolve. inf or NaN
// in x gives hi = x and mid = lo = 0 (NaN stays NaN).
void split_bf16x3(float x, uint16_t& hi, uint16_t& mid, uint16_t& lo);

inline constexpr int kSplitTile = 16;  // activation rows per tile
inline constexpr int kSplitK = 32;     // columns per tile (64 bytes of bfloat16)

// Activation rows split for the matrix unit. Storage is in whole tiles: tile (i, k, part) holds
// rows [16 i, 16 i + 16) and columns [32 k, 32 k + 32) of one part, 16 rows of 32 bfloat16, so
// that a product loads it with one instruction; rows past rows() are zero.
class SplitActivation {
 public:
  // For n_rows rows of cols values (a positive multiple of kSplitK); throws
  // std::invalid_argument otherwise. Then split_row for every row t < n_rows (rows may be split
  // in parallel).
  void resize(int64_t n_rows, int64_t cols);
  void split_row(int64_t t, const float* x);
  // Both steps for rows at x + t * x_stride.
  void split(const float* x, int64_t n_rows, int64_t x_stride, int64_t cols);
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // Tile (i, k, part) starts at tiles() + ((i * cols / kSplitK + k) * 3 + part) * 512.
  const uint16_t* tiles() const { return tiles_.data(); }
  // Float32 sums of row t over each block of kSplitK columns: block_sums() + t * cols / kSplitK.
  const float* block_sums() const { return sums_.data(); }

 private:
  std::vector<uint16_t> tiles_;
  std::vector<float> sums_;
  int64_t rows_ = 0, cols_ = 0;
};

// Y[t * y_stride + r] = sum_c W[r, c] * X[t, c] for every row t of xs and r in [row_begin,
// row_end), accumulated per group as s * sum(q x) + b * sum(x) (float32-accurate, like qmatvec).
// On the amx ISA this runs on the matrix unit; elsewhere a scalar version computes the same
// sums (x rebuilt from its parts), so callers should prefer qmatmul unless
// has_matrix_product(). Throws std::invalid_argument for a bad matrix, range or input width.
void qmatmul_split(const QuantMatrix& w, const SplitActivation& xs, float* y, int64_t y_stride,
                   int64_t row_begin, int64_t row_end);
// Whether the active ISA runs qmatmul_split on a matrix unit.
bool has_matrix_product();

// ---- 8-bit-activation products (approximate; the float32 ones above are exact) ---------------
//
// The activation vector is quantized to int8 in blocks of kQ8Block values, each with its own
// scale d = max|x| / 127 (x ≈ d * a8), and the weights' integer codes multiply the int8 values
// with integer dot products (VNNI vpdpbusd, AVX2 vpmaddubsw, or scalar). For an MLX affine row
// w = s * q + b per group, the product is
//   sum_g s_g * sum_{blocks in g} d * sum(q * a8)  +  b_g * sum_{c in g} x_c,
// where the bias term uses the float32 sum of the unquantized x (exact, and as cheap as the
// quantized sum), so the only approximation is the rounding of x to int8 in the first term.
inline constexpr int kQ8Block = 32;

// A quantized activation vector as the q8 kernels read it. For 4-bit weights each 128-value
// block stores its even-indexed values in its first 64 bytes and the odd-indexed ones in the
// next 64 (so the low and high nibbles of 64 packed weight bytes meet their activations with
// one load each); for 8-bit weights the values are in order. q is zero-padded to a multiple of
// 128 values, so a kernel may load whole 128-value blocks.
struct Q8Activation {
  const int8_t* q = nullptr;         // [padded cols]
  const float* scale = nullptr;      // [cols / kQ8Block]: d of each block
  const float* block_sum = nullptr;  // [cols / kQ8Block]: float32 sum of x over each block
  int64_t cols = 0;
  int bits = 4;  // the weight width whose layout q follows
};

// Owns the storage of quantized activation rows.
class Q8Buffer {
 public:
  // Quantizes n_rows rows of x (row t at x + t * x_stride, cols values, a multiple of
  // kQ8Block) for products with `bits`-wide weights. Throws std::invalid_argument otherwise.
  void quantize(const float* x, int64_t n_rows, int64_t x_stride, int64_t cols, int bits);
  // The same in two steps, so that rows can be quantized in parallel: resize (same checks), then
  // quantize_row for every row t < n_rows.
  void resize(int64_t n_rows, int64_t cols, int bits);
  void quantize_row(int64_t t, const float* x);
  Q8Activation row(int64_t t) const;
  int64_t rows() const { return rows_; }

 private:
  std::vector<int8_t> q_;
  std::vector<float> scale_, block_sum_;
  int64_t rows_ = 0, cols_ = 0, padded_ = 0;
  int bits_ = 4;
};

// y[r] = the 8-bit-activation product of row r with xa, for r in [row_begin, row_end). Throws
// std::invalid_argument for an unsupported matrix, a bad row range, or xa quantized for another
// width or length.
void qmatvec_q8(const QuantMatrix& w, const Q8Activation& xa, float* y, int64_t row_begin,
                int64_t row_end);

// Y[t * y_stride + r] = qmatvec_q8 of row r with xa.row(t), for t < xa.rows() and rows in
// [row_begin, row_end), keeping a panel of weight rows in cache across the rows of X (prefill).
void qmatmul_q8(const QuantMatrix& w, const Q8Buffer& xa, float* y, int64_t y_stride,
                int64_t row_begin, int64_t row_end);

// ---- element-wise and reductions -----------------------------------------------------------

// y = x * rsqrt(mean(x^2) + eps) * (weight_offset + weight); weight may be null (no weight).
// x and y may alias.
void rms_norm(const float* x, const float* weight, float weight_offset, float eps, int64_t n,
              float* y);

// out[i] = gelu_tanh(gate[i]) * up[i]; gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715
// x^3)))
void gelu_tanh_mul(const float* gate, const float* up, int64_t n, float* out);

// x[i] = cap * tanh(x[i] / cap)
void softcap(float* x, int64_t n, float cap);

// Half-split (NeoX) rotation of n_heads vectors of head_dim floats, laid out contiguously:
// for j < head_dim / 2: (x[j], x[j + half]) <- (x[j] c - x[j + half] s, x[j + half] c + x[j] s)
// with c = cos[j], s = sin[j].
void rope_neox(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin);

float dot_f32(const float* a, const float* b, int64_t n);
// a · b with b stored as IEEE half (uint16 bits).
float dot_f16(const float* a, const uint16_t* b, int64_t n);
// y += a * x
void axpy_f32(float a, const float* x, float* y, int64_t n);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);

// Conversions (round to nearest even).
void f32_to_f16(const float* x, uint16_t* y, int64_t n);
void f16_to_f32(const uint16_t* x, float* y, int64_t n);
void bf16_to_f32(const uint16_t* x, float* y, int64_t n);
float bf16_to_f32(uint16_t x);
uint16_t f32_to_bf16(float x);
float f16_to_f32(uint16_t x);
uint16_t f32_to_f16(float x);

// In-place softmax over n values (max-subtracted, float32).
void softmax(float* x, int64_t n);

// ---- attention, split over blocks of keys ---------------------------------------------------
//
// A query's softmax over its visible keys is computed per block of at most kAttentionBlock keys
// (attention_partial: each block's own max and softmax) and the blocks are then merged exactly
// (attention_combine: rescaled by exp(block max - overall max)), as flash attention does. So
// one head's keys can be split over threads, and the query heads that share a KV head read each
// key and value row once for all of them. The scores and the weighted sum of the values are
// dispatched kernels (AVX2 and AVX-512: tiles over several heads and keys; scalar and NEON: the
// dot and axpy kernels above).
inline constexpr int64_t kAttentionBlock = 128;

// One KV head's keys and values as attention reads them: position p sits in row p (or
// p % capacity for a ring), row r of K at k + r * row_stride elements (float32, or IEEE half
// when f16).
struct AttentionKv {
  const void* k = nullptr;
  const void* v = nullptr;
  bool f16 = false;
  int64_t row_stride = 0;
  int64_t capacity = 0;
  bool ring = false;
  // Whether each row is read by this call only (decode: one query row): the SIMD tiles then
  // fetch rows ahead of use (prefetch_kv_keys). Prefill's calls for consecutive query rows share
  // a block, which is in cache after the first.
  bool fetch_ahead = false;
};

// The partial attention of `group` query heads (head i at q + i * q_stride, head_dim values)
// over the keys at positions [pos_begin, pos_end), at most kAttentionBlock of them. With
// s_ij = scale * q_i . k_j (float32) and p_ij = softmax_j(s_ij) over this block: m[i] = max_j
// s_ij, w[i] = p_ij at that max (1 / sum_j exp(s_ij - m[i])), and o + i * head_dim = sum_j p_ij
// v_j. scratch holds group * kAttentionBlock floats. Throws std::invalid_argument
// for an empty or oversized block.
void attention_partial(const float* q, int64_t q_stride, int group, int head_dim, float scale,
                       const AttentionKv& kv, int64_t pos_begin, int64_t pos_end, float* m,
                       float* w, float* o, float* scratch);

// Merges the partials of n_blocks blocks of one query head's keys (block b: m[b * stride],
// w[b * stride], o + b * stride * head_dim) into out (head_dim values): the softmax-weighted sum
// of the values over all those keys.
void attention_combine(const float* m, const float* w, const float* o, int64_t stride, int n_blocks,
                       int head_dim, float* out);

// The k largest of n scores: indices in descending score order (ties: lower index first).
void top_k(const float* scores, int64_t n, int k, int32_t* indices);

}  // namespace redwing::cpu
