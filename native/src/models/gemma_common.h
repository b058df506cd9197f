// Pieces shared by the Gemma 3 and Gemma 4 forward passes: weight loading, the attention block,
// the gated MLP and the output head. Each family's file (gemma3.cpp, gemma4.cpp) reads top to
// bottom as its network does and calls these.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/model_dir.h"
#include "models/model.h"

namespace redwing::gemma {

// ---- scratch activations ----

// Named activation buffers, grown on demand. A view's contents survive until the same slot is
// requested with a larger size.
enum Slot : int {
  kResidual,         // x [T, hidden]
  kNormed,           // [T, hidden]
  kQuery,            // [T, heads * head_dim]
  kKey,              // [T, kv_heads * head_dim]
  kValue,            // [T, kv_heads * head_dim]
  kAttnOut,          // [T, heads * head_dim]
  kBranch,           // [T, hidden]: a block's output before the residual add
  kGate,             // [T, intermediate]
  kUp,               // [T, intermediate]
  kHeadIn,           // [n, hidden]: final-normed rows that need logits
  kLogits,           // [n, vocab]
  kFirstFamilySlot,  // families number their own slots from here
};

class Scratch {
 public:
  explicit Scratch(Backend& backend) : backend_(backend) {}
  // A contiguous [rows, cols] view of slot `id`.
  Mat get(int id, int64_t rows, int64_t cols);

 private:
  Backend& backend_;
  std::vector<std::unique_ptr<Buffer>> slots_;
};

// ---- weights ----

// A plain vector tensor of n values, as a float32 backend buffer.
std::unique_ptr<Buffer> load_vector(Backend& backend, const ModelDir& dir, const std::string& name,
                                    int64_t n);
// A quantized [rows, cols] matrix imported into the backend, tagged with what it is for (the
// activation plan picks its input precision by that).
std::unique_ptr<QWeight> load_matrix(Backend& backend, const ModelDir& dir, const std::string& name,
                                     int64_t rows, int64_t cols, ProductKind kind);

struct AttentionWeights {
  std::unique_ptr<Buffer> input_norm, q_norm, k_norm, post_norm;
  std::unique_ptr<QWeight> q_proj, k_proj, v_proj, o_proj;  // v_proj is null where k_eq_v
};
AttentionWeights load_attention(Backend& backend, const ModelDir& dir, int layer);

struct MlpWeights {
  std::unique_ptr<QWeight> gate, up, down;
};
// `prefix` e.g. "layers.3.mlp"; gate/up [inter, hidden], down [hidden, inter].
MlpWeights load_mlp(Backend& backend, const ModelDir& dir, const std::string& prefix,
                    int64_t hidden, int64_t inter);

// ---- blocks ----

// The attention half of a decoder layer, in place on the residual x [T, hidden] whose rows sit
// at positions pos0 + row:
//   h = input_layernorm(x)
//   q = RoPE(q_norm(q_proj h))                    per head
//   k = RoPE(k_norm(k_proj h))
//   v = v_proj h, or the raw k_proj h on k_eq_v layers; then a weightless RMSNorm if v_norm
//   store k, v; a = softmax(scale * q k^T over visible keys) v     (GQA)
//   x += post_attention_layernorm(o_proj a)
// input_normed: h (scratch slot kNormed) already holds input_layernorm(x), written by the
// previous layer's end (Backend::FfnTail::next). then_norms: also the two norms of the new x
// that the feed-forward starts with (Backend::add_rms_norm_pair), written with the residual add.
struct NormPairOut {
  const Buffer* weight1 = nullptr;
  const Buffer* weight2 = nullptr;
  Mat y1, y2;
};
void attention_block(Backend& backend, const Architecture& arch, int layer,
                     const AttentionWeights& w, const KvLayerView& kv, Mat x, int64_t pos0,
                     Scratch& scratch, bool input_normed = false,
                     const NormPairOut* then_norms = nullptr);

// out = down(gelu_tanh(gate in) * up in). `out` may not alias `in`.
void gated_mlp(Backend& backend, const MlpWeights& w, Mat in, Mat out, Scratch& scratch);

// logits = softcap(embed_tokens . norm(x[row])) for rows [r0, r0 + n) of x, left in backend
// memory (a scratch slot, valid until the next call).
Mat head_logits(Backend& backend, const Architecture& arch, const Buffer& final_norm,
                const QWeight& embed_tokens, Mat x, int64_t r0, int64_t n, Scratch& scratch);

// head_logits appended to `logits` on the host.
void output_logits(Backend& backend, const Architecture& arch, const Buffer& final_norm,
                   const QWeight& embed_tokens, Mat x, int64_t r0, int64_t n, Scratch& scratch,
                   std::vector<float>& logits);

// The logits a forward pass was asked for (`which`) from its final residual x [T, hidden]: every
// row or the last one appended to `logits` on the host, or the last one left in backend memory
// in `kept` (LogitsFor::last_kept); nothing for LogitsFor::none.
void finish_logits(Backend& backend, const Architecture& arch, const Buffer& final_norm,
                   const QWeight& embed_tokens, Mat x, LogitsFor which, Scratch& scratch,
                   std::vector<float>& logits, Mat& kept);

}  // namespace redwing::gemma
