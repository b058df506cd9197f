#include "models/gemma_common.h"

#include "format/checked.h"

namespace redwing::gemma {

Mat Scratch::get(int id, int64_t rows, int64_t cols) {
  if (id < 0) throw std::logic_error("bad scratch slot");
  if (slots_.size() <= static_cast<size_t>(id)) slots_.resize(static_cast<size_t>(id) + 1);
  auto& buf = slots_[static_cast<size_t>(id)];
  const size_t bytes = checked::to_size_t(
      checked::mul(
          checked::size(checked::mul_i64(rows, cols, "scratch activations"), "scratch activations"),
          sizeof(float), "scratch activations"),
      "scratch activations");
  if (!buf || buf->size_bytes() < bytes) buf = backend_.alloc(bytes);
  return Mat{buf.get(), 0, rows, cols, cols};
}

std::unique_ptr<Buffer> load_vector(Backend& backend, const ModelDir& dir, const std::string& name,
                                    int64_t n) {
  std::vector<float> v = dir.load_f32(name, n);
  auto buf = backend.alloc(v.size() * sizeof(float));
  backend.upload(*buf, 0, v.data(), v.size() * sizeof(float));
  return buf;
}

std::unique_ptr<QWeight> load_matrix(Backend& backend, const ModelDir& dir, const std::string& name,
                                     int64_t rows, int64_t cols, ProductKind kind) {
  std::unique_ptr<QWeight> w = backend.import_resident_qweight(dir.quant(name, rows, cols));
  w->kind = kind;
  return w;
}

AttentionWeights load_attention(Backend& backend, const ModelDir& dir, int layer) {
  const Architecture& arch = dir.arch();
  const LayerConfig& lc = arch.layers[static_cast<size_t>(layer)];
  const std::string p = "layers." + std::to_string(layer) + ".";
  const int64_t hidden = arch.hidden_size;
  const int64_t q_width = static_cast<int64_t>(arch.num_attention_heads) * lc.head_dim;
  const int64_t kv_width = static_cast<int64_t>(lc.num_kv_heads) * lc.head_dim;
  AttentionWeights w;
  w.input_norm = load_vector(backend, dir, p + "input_layernorm", hidden);
  w.post_norm = load_vector(backend, dir, p + "post_attention_layernorm", hidden);
  w.q_norm = load_vector(backend, dir, p + "self_attn.q_norm", lc.head_dim);
  w.k_norm = load_vector(backend, dir, p + "self_attn.k_norm", lc.head_dim);
  w.q_proj =
      load_matrix(backend, dir, p + "self_attn.q_proj", q_width, hidden, ProductKind::attention);
  w.k_proj =
      load_matrix(backend, dir, p + "self_attn.k_proj", kv_width, hidden, ProductKind::attention);
  if (lc.k_eq_v) {
    if (dir.has_tensor(p + "self_attn.v_proj"))
      throw FormatError(dir.path() + "/manifest.json: layer " + std::to_string(layer) +
                        " is k_eq_v but has a v_proj tensor");
  } else {
    w.v_proj =
        load_matrix(backend, dir, p + "self_attn.v_proj", kv_width, hidden, ProductKind::attention);
  }
  w.o_proj =
      load_matrix(backend, dir, p + "self_attn.o_proj", hidden, q_width, ProductKind::attention);
  return w;
}

MlpWeights load_mlp(Backend& backend, const ModelDir& dir, const std::string& prefix,
                    int64_t hidden, int64_t inter) {
  MlpWeights w;
  w.gate = load_matrix(backend, dir, prefix + ".gate_proj", inter, hidden, ProductKind::mlp);
  w.up = load_matrix(backend, dir, prefix + ".up_proj", inter, hidden, ProductKind::mlp);
  w.down = load_matrix(backend, dir, prefix + ".down_proj", hidden, inter, ProductKind::mlp);
  return w;
}

void attention_block(Backend& backend, const Architecture& arch, int layer,
                     const AttentionWeights& w, const KvLayerView& kv, Mat x, int64_t pos0,
                     Scratch& scratch, bool input_normed, const NormPairOut* then_norms) {
  const LayerConfig& lc = arch.layers[static_cast<size_t>(layer)];
  const int64_t T = x.rows;
  const int heads = arch.num_attention_heads;
  const int d = lc.head_dim;
  const float off = arch.norm_weight_offset;
  const float eps = arch.rms_norm_eps;
  const RopeParams rope{lc.rope.theta, lc.rope.rotary_pairs, lc.rope.freq_dim, lc.rope.scale};

  // h = input_norm(x); q, k and v read it: one batched product (a GPU folds the norm into it),
  // then q's norm and rotation and the keys' and values' norms, rotation and store.
  Mat h = scratch.get(kNormed, T, arch.hidden_size);
  Mat q = scratch.get(kQuery, T, static_cast<int64_t>(heads) * d);
  Mat k = scratch.get(kKey, T, static_cast<int64_t>(lc.num_kv_heads) * d);
  Mat v = scratch.get(kValue, T, static_cast<int64_t>(lc.num_kv_heads) * d);
  const Backend::QkvProducts qkv{
      {w.q_proj.get(), h, q}, {w.k_proj.get(), h, k}, {lc.k_eq_v ? nullptr : w.v_proj.get(), h, v}};
  const Backend::InputNorm norm{w.input_norm.get(), off, eps, std::nullopt};
  Mat a = scratch.get(kAttnOut, T, static_cast<int64_t>(heads) * d);
  backend.attention_from_input(x, input_normed ? nullptr : &norm, h, qkv,
                               {w.q_norm.get(), w.k_norm.get(), off, eps, rope, arch.v_norm}, kv,
                               pos0, arch.attention_scale, a);

  Mat o = scratch.get(kBranch, T, arch.hidden_size);
  if (then_norms) {  // x += post_norm(o), then the feed-forward's two norms of it
    backend.qmatmul_add_rms_norm_pair(*w.o_proj, a, o, w.post_norm.get(), off, eps, x, 1.0f,
                                      then_norms->weight1, then_norms->weight2, then_norms->y1,
                                      then_norms->y2);
    return;
  }
  backend.qmatmul(*w.o_proj, a, o);
  backend.add_rms_norm(o, w.post_norm.get(), off, eps, x);  // x += post_norm(o)
}

void gated_mlp(Backend& backend, const MlpWeights& w, Mat in, Mat out, Scratch& scratch) {
  const int64_t inter = w.gate->rows;
  // gate and up side by side in one buffer: a GPU reads both in the down product's staging.
  Mat gu = scratch.get(kGate, in.rows, 2 * inter);
  Mat g = gu.col_range(0, inter);
  Mat u = gu.col_range(inter, inter);
  const Backend::QProduct gate_up[] = {{w.gate.get(), in, g}, {w.up.get(), in, u}};
  backend.qmatmul_batch(gate_up);
  backend.geglu_qmatmul(*w.down, g, u, out);
}

Mat head_logits(Backend& backend, const Architecture& arch, const Buffer& final_norm,
                const QWeight& embed_tokens, Mat x, int64_t r0, int64_t n, Scratch& scratch) {
  Mat h = scratch.get(kHeadIn, n, arch.hidden_size);
  Mat l = scratch.get(kLogits, n, arch.vocab_size);
  // l = embed_tokens * final_norm(x): the tied head, the quantized embedding as output matrix.
  const Backend::QProduct head[] = {{&embed_tokens, h, l}};
  backend.qmatmul_normed(x.row_range(r0, n),
                         {&final_norm, arch.norm_weight_offset, arch.rms_norm_eps, std::nullopt}, h,
                         head);
  if (arch.final_logit_softcap) backend.softcap(l, *arch.final_logit_softcap);
  return l;
}

void output_logits(Backend& backend, const Architecture& arch, const Buffer& final_norm,
                   const QWeight& embed_tokens, Mat x, int64_t r0, int64_t n, Scratch& scratch,
                   std::vector<float>& logits) {
  if (n <= 0) return;
  const Mat l = head_logits(backend, arch, final_norm, embed_tokens, x, r0, n, scratch);
  const size_t old = logits.size();
  const size_t count = checked::to_size_t(
      checked::size(checked::mul_i64(n, arch.vocab_size, "logits"), "logits"), "logits");
  logits.resize(checked::to_size_t(checked::add(old, count, "logits"), "logits"));
  backend.download(*l.buf, 0, logits.data() + old, count * sizeof(float));
}

void finish_logits(Backend& backend, const Architecture& arch, const Buffer& final_norm,
                   const QWeight& embed_tokens, Mat x, LogitsFor which, Scratch& scratch,
                   std::vector<float>& logits, Mat& kept) {
  const int64_t T = x.rows;
  if (which == LogitsFor::all)
    output_logits(backend, arch, final_norm, embed_tokens, x, 0, T, scratch, logits);
  else if (which == LogitsFor::last)
    output_logits(backend, arch, final_norm, embed_tokens, x, T - 1, 1, scratch, logits);
  else if (which == LogitsFor::last_kept)
    kept = head_logits(backend, arch, final_norm, embed_tokens, x, T - 1, 1, scratch);
}

}  // namespace redwing::gemma
