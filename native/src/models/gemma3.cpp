// Gemma 3 text decoder (transformers' Gemma3ForCausalLM), read top to bottom:
//
//   x = embed_tokens[ids] * embed_scale                      (embed_scale bf16-rounded sqrt(H))
//   per layer:
//     x = x + post_attention_layernorm(attention(input_layernorm(x)))       (gemma_common)
//     x = x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x))) dense GeGLU
//   logits = embed_tokens . norm(x)
//
// Every RMSNorm (q_norm and k_norm included) multiplies by (1 + w): norm_weight_offset 1.
// There is no v_norm, no layer scalar and no final softcap; the attention scale is
// query_pre_attn_scalar^-1/2, and RoPE's linear scaling applies to full-attention layers only
// (all of which the manifest spells out per layer).
#include "models/gemma3.h"

#include "models/gemma_common.h"

namespace redwing {
namespace {

class Gemma3 final : public Model {
 public:
  Gemma3(const ModelDir& dir, Backend& backend)
      : arch_(dir.arch()), backend_(backend), scratch_(backend) {
    if (arch_.moe) throw FormatError(dir.path() + "/manifest.json: a gemma3 model has no experts");
    const int64_t hidden = arch_.hidden_size;
    embed_ = gemma::load_matrix(backend, dir, "embed_tokens", arch_.vocab_size, hidden,
                                ProductKind::head);  // tied: also the output head
    norm_ = gemma::load_vector(backend, dir, "norm", hidden);
    for (int i = 0; i < arch_.num_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      Layer l;
      l.attn = gemma::load_attention(backend, dir, i);
      l.pre_ffn_norm = gemma::load_vector(backend, dir, p + "pre_feedforward_layernorm", hidden);
      l.post_ffn_norm = gemma::load_vector(backend, dir, p + "post_feedforward_layernorm", hidden);
      l.mlp = gemma::load_mlp(backend, dir, p + "mlp", hidden, arch_.intermediate_size);
      layers_.push_back(std::move(l));
    }
  }

  const Architecture& arch() const override { return arch_; }

  void forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
               std::vector<float>& logits) override {
    const int64_t T = static_cast<int64_t>(tokens.size());
    if (T == 0) return;
    cache.check_room(T);
    const int64_t pos0 = cache.length();
    const float off = arch_.norm_weight_offset;
    const float eps = arch_.rms_norm_eps;
    const int64_t hidden = arch_.hidden_size;

    Mat x = scratch_.get(gemma::kResidual, T, hidden);
    backend_.embed(*embed_, tokens, arch_.embed_scale, x);

    for (int i = 0; i < arch_.num_layers; ++i) {
      const Layer& l = layers_[static_cast<size_t>(i)];
      gemma::attention_block(backend_, arch_, i, l.attn, cache.layer(i), x, pos0, scratch_);

      Mat h = scratch_.get(gemma::kNormed, T, hidden);
      Mat m = scratch_.get(gemma::kBranch, T, hidden);
      backend_.rms_norm(x, l.pre_ffn_norm.get(), off, eps, h);
      gemma::gated_mlp(backend_, l.mlp, h, m, scratch_);
      backend_.add_rms_norm(m, l.post_ffn_norm.get(), off, eps, x);  // x += post_ffn_norm(m)
    }
    cache.advance(T);

    gemma::finish_logits(backend_, arch_, *norm_, *embed_, x, which, scratch_, logits,
                         kept_logits_);
  }

 private:
  struct Layer {
    gemma::AttentionWeights attn;
    std::unique_ptr<Buffer> pre_ffn_norm, post_ffn_norm;
    gemma::MlpWeights mlp;
  };

  Architecture arch_;
  Backend& backend_;
  gemma::Scratch scratch_;
  std::unique_ptr<QWeight> embed_;
  std::unique_ptr<Buffer> norm_;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_gemma3(const ModelDir& dir, Backend& backend) {
  return std::make_unique<Gemma3>(dir, backend);
}

}  // namespace redwing
