// Test support: tiny random Gemma-style models written as Redwing model directories, and an
// independent, naive double-precision forward pass over the same weights (whole sequence, full
// attention matrix with the causal/sliding mask, no cache) to check the engine against.
//
// The reference is written from the architecture description in docs/format.md and
// shared/research/gemma-arch.md, not from the engine's code; it dequantizes with its own loop.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>
#include <string>
#include <vector>

namespace synth {

namespace fs = std::filesystem;
using nlohmann::json;
using Vec = std::vector<double>;

inline uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
inline float from_bf16(uint16_t h) {
  uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

struct LayerSpec {
  bool sliding = true;
  int window = 0;
  int head_dim = 16;
  int kv_heads = 2;
  bool k_eq_v = false;
  bool moe = false;
  double theta = 10000;
  int pairs = 8;
  int freq_dim = 16;
  double scale = 1.0;
};

struct Spec {
  std::string family = "gemma4";
  int vocab = 300;
  int hidden = 64;
  int heads = 4;
  int inter = 96;
  float eps = 1e-6f;
  float norm_offset = 0.0f;
  float embed_scale = 8.0f;
  float attention_scale = 1.0f;
  double softcap = 30.0;  // <= 0: none
  bool v_norm = true;
  bool layer_scalar = true;
  int experts = 0, top_k = 0, moe_inter = 0;
  int group = 32;
  std::vector<LayerSpec> layers;
  uint64_t seed = 1;
};

// A small MoE Gemma 4: sliding window 5 (so short prompts already slide), one proportional-RoPE
// full layer with k_eq_v, 8 experts top-2.
inline Spec gemma4_moe_spec() {
  Spec s;
  s.experts = 8;
  s.top_k = 2;
  s.moe_inter = 32;
  LayerSpec sl;
  sl.sliding = true;
  sl.window = 5;
  sl.moe = true;
  LayerSpec fl;
  fl.sliding = false;
  fl.head_dim = 32;
  fl.kv_heads = 1;
  fl.k_eq_v = true;
  fl.moe = true;
  fl.theta = 1e6;
  fl.pairs = 4;  // proportional: a quarter of the pairs rotate, exponent over the full head_dim
  fl.freq_dim = 32;
  s.layers = {sl, sl, fl, sl};
  return s;
}

inline Spec gemma3_spec() {
  Spec s;
  s.family = "gemma3";
  s.norm_offset = 1.0f;
  s.attention_scale = 0.25f;
  s.softcap = 0;
  s.v_norm = false;
  s.layer_scalar = false;
  s.embed_scale = 8.0f;
  LayerSpec sl;
  sl.window = 4;
  LayerSpec fl = sl;
  fl.sliding = false;
  fl.window = 0;
  fl.theta = 1e6;
  fl.scale = 8.0;  // linear scaling on full layers only
  s.layers = {sl, fl, sl};
  return s;
}

// A quantized matrix as the reference sees it (dequantized, double) and its bytes.
struct QMat {
  int rows = 0, cols = 0, bits = 4, group = 32;
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases;  // bf16
  std::vector<double> w;                 // dequantized [rows * cols]
};

class Writer {
 public:
  Writer(const Spec& spec) : spec_(spec), rng_(spec.seed) {}

  QMat random_qmat(int rows, int cols, int bits, double target_std) {
    QMat m;
    m.rows = rows;
    m.cols = cols;
    m.bits = bits;
    m.group = spec_.group;
    const int per_word = 32 / bits;
    const uint32_t qmax = (1u << bits) - 1;
    m.packed.assign(static_cast<size_t>(rows) * cols / per_word, 0);
    std::uniform_int_distribution<uint32_t> q(0, qmax);
    std::uniform_real_distribution<double> u(0.5, 1.5);
    std::vector<uint32_t> qs(static_cast<size_t>(rows) * cols);
    for (size_t i = 0; i < qs.size(); ++i) {
      qs[i] = q(rng_);
      m.packed[i / per_word] |= qs[i] << (bits * (i % per_word));
    }
    const int groups = cols / m.group;
    // Spread of uniform q over [0, qmax] is qmax / sqrt(12): pick s for the target std.
    for (int r = 0; r < rows; ++r)
      for (int g = 0; g < groups; ++g) {
        const double s = target_std * std::sqrt(12.0) / qmax * u(rng_);
        const double b = -s * qmax / 2 * u(rng_);
        m.scales.push_back(to_bf16(static_cast<float>(s)));
        m.biases.push_back(to_bf16(static_cast<float>(b)));
      }
    m.w.resize(qs.size());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const size_t gi = static_cast<size_t>(r) * groups + c / m.group;
        m.w[static_cast<size_t>(r) * cols + c] =
            static_cast<double>(from_bf16(m.scales[gi])) * qs[static_cast<size_t>(r) * cols + c] +
            static_cast<double>(from_bf16(m.biases[gi]));
      }
    return m;
  }

  // Values rounded to bf16 (as stored).
  std::vector<double> random_vec(int n, double mean, double spread) {
    std::uniform_real_distribution<double> u(-spread, spread);
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = from_bf16(to_bf16(static_cast<float>(mean + u(rng_))));
    return v;
  }

  void add_plain(const std::string& name, const std::vector<double>& v) { plain_[name] = v; }
  void add_quant(const std::string& name, QMat m) { quant_[name] = std::move(m); }

  std::map<std::string, std::vector<double>> plain_;
  std::map<std::string, QMat> quant_;
  std::map<int, std::vector<std::array<QMat, 3>>> experts_;  // layer -> expert -> gate, up, down
  const Spec& spec() const { return spec_; }

  // Draws every weight of the spec.
  void build() {
    const Spec& s = spec_;
    add_quant("embed_tokens", random_qmat(s.vocab, s.hidden, 4, 0.5));
    // Gemma 4 norms multiply by w (around 1); Gemma 3 by 1 + w (w around 0).
    const double nm = s.norm_offset == 0.0f ? 1.0 : 0.0;
    add_plain("norm", random_vec(s.hidden, nm, 0.3));
    for (size_t i = 0; i < s.layers.size(); ++i) {
      const LayerSpec& l = s.layers[i];
      const std::string p = "layers." + std::to_string(i) + ".";
      for (const char* n : {"input_layernorm", "post_attention_layernorm",
                            "pre_feedforward_layernorm", "post_feedforward_layernorm"})
        add_plain(p + n, random_vec(s.hidden, nm, 0.3));
      add_plain(p + "self_attn.q_norm", random_vec(l.head_dim, nm, 0.3));
      add_plain(p + "self_attn.k_norm", random_vec(l.head_dim, nm, 0.3));
      add_quant(p + "self_attn.q_proj", random_qmat(s.heads * l.head_dim, s.hidden, 4, 0.15));
      add_quant(p + "self_attn.k_proj", random_qmat(l.kv_heads * l.head_dim, s.hidden, 4, 0.15));
      if (!l.k_eq_v)
        add_quant(p + "self_attn.v_proj", random_qmat(l.kv_heads * l.head_dim, s.hidden, 4, 0.15));
      add_quant(p + "self_attn.o_proj", random_qmat(s.hidden, s.heads * l.head_dim, 4, 0.15));
      add_quant(p + "mlp.gate_proj", random_qmat(s.inter, s.hidden, 4, 0.15));
      add_quant(p + "mlp.up_proj", random_qmat(s.inter, s.hidden, 4, 0.15));
      add_quant(p + "mlp.down_proj", random_qmat(s.hidden, s.inter, 4, 0.15));
      if (s.layer_scalar) add_plain(p + "layer_scalar", random_vec(1, 0.9, 0.2));
      if (l.moe) {
        for (const char* n : {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                              "post_feedforward_layernorm_2"})
          add_plain(p + n, random_vec(s.hidden, nm, 0.3));
        add_quant(p + "router.proj", random_qmat(s.experts, s.hidden, 8, 1.0));
        add_plain(p + "router.scale", random_vec(s.hidden, 1.0, 0.5));
        add_plain(p + "router.per_expert_scale", random_vec(s.experts, 1.0, 0.5));
        auto& ex = experts_[static_cast<int>(i)];
        for (int e = 0; e < s.experts; ++e)
          ex.push_back({random_qmat(s.moe_inter, s.hidden, 4, 0.15),
                        random_qmat(s.moe_inter, s.hidden, 4, 0.15),
                        random_qmat(s.hidden, s.moe_inter, 4, 0.15)});
      }
    }
  }

  // Writes the model directory.
  void write(const fs::path& dir) const {
    const Spec& s = spec_;
    fs::create_directories(dir);
    std::vector<uint8_t> bin;
    auto align = [](std::vector<uint8_t>& b, size_t a) {
      while (b.size() % a) b.push_back(0);
    };
    auto put = [&](std::vector<uint8_t>& b, const void* p, size_t n) {
      align(b, 64);
      size_t off = b.size();
      b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
      return json{{"offset", off}, {"nbytes", n}};
    };
    auto quant_json = [&](std::vector<uint8_t>& b, const QMat& m) {
      json t = {{"dtype", "affine"},
                {"bits", m.bits},
                {"group_size", m.group},
                {"scale_dtype", "bf16"},
                {"shape", {m.rows, m.cols}}};
      t["weight"] = put(b, m.packed.data(), m.packed.size() * 4);
      t["scales"] = put(b, m.scales.data(), m.scales.size() * 2);
      t["biases"] = put(b, m.biases.data(), m.biases.size() * 2);
      return t;
    };
    json tensors = json::object();
    for (const auto& [name, v] : plain_) {
      std::vector<uint16_t> h;
      for (double x : v) h.push_back(to_bf16(static_cast<float>(x)));
      json r = put(bin, h.data(), h.size() * 2);
      tensors[name] = {{"dtype", "bf16"},
                       {"shape", {v.size()}},
                       {"offset", r["offset"]},
                       {"nbytes", r["nbytes"]}};
    }
    for (const auto& [name, m] : quant_) tensors[name] = quant_json(bin, m);
    align(bin, 64);
    json files = json::array();
    write_file(dir / "weights.bin", bin);
    files.push_back(
        {{"path", "weights.bin"}, {"size", bin.size()}, {"sha256", std::string(64, '0')}});

    json experts = nullptr;
    if (!experts_.empty()) {
      experts = {{"alignment", 16384}, {"layers", json::object()}};
      fs::create_directories(dir / "experts");
      for (const auto& [layer, list] : experts_) {
        // One blob layout shared by every expert: measure it on expert 0.
        std::vector<uint8_t> blob0;
        json parts;
        const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int k = 0; k < 3; ++k)
          parts[names[k]] = quant_json(blob0, list[0][static_cast<size_t>(k)]);
        for (auto& [n, t] : parts.items()) t.erase("dtype");
        const size_t stride = (blob0.size() + 16383) / 16384 * 16384;
        std::vector<uint8_t> file;
        for (const auto& e : list) {
          std::vector<uint8_t> blob;
          for (int k = 0; k < 3; ++k) quant_json(blob, e[static_cast<size_t>(k)]);
          blob.resize(stride, 0);
          file.insert(file.end(), blob.begin(), blob.end());
        }
        char name[64];
        std::snprintf(name, sizeof(name), "experts/layer_%03d.bin", layer);
        write_file(dir / name, file);
        files.push_back({{"path", name}, {"size", file.size()}, {"sha256", std::string(64, '0')}});
        experts["layers"][std::to_string(layer)] = {
            {"file", name}, {"count", list.size()}, {"stride", stride}, {"parts", parts}};
      }
    }

    json layers = json::array();
    for (const LayerSpec& l : s.layers) {
      layers.push_back({{"attention", l.sliding ? "sliding" : "full"},
                        {"sliding_window", l.sliding ? json(l.window) : json(nullptr)},
                        {"head_dim", l.head_dim},
                        {"num_kv_heads", l.kv_heads},
                        {"k_eq_v", l.k_eq_v},
                        {"moe", l.moe},
                        {"rope",
                         {{"theta", l.theta},
                          {"rotary_pairs", l.pairs},
                          {"freq_dim", l.freq_dim},
                          {"scale", l.scale}}}});
    }
    json arch = {{"family", s.family},
                 {"vocab_size", s.vocab},
                 {"hidden_size", s.hidden},
                 {"num_layers", s.layers.size()},
                 {"num_attention_heads", s.heads},
                 {"intermediate_size", s.inter},
                 {"rms_norm_eps", s.eps},
                 {"norm_weight_offset", s.norm_offset},
                 {"embed_scale", s.embed_scale},
                 {"attention_scale", s.attention_scale},
                 {"final_logit_softcap", s.softcap > 0 ? json(s.softcap) : json(nullptr)},
                 {"activation", "gelu_tanh"},
                 {"tie_word_embeddings", true},
                 {"v_norm", s.v_norm},
                 {"moe", s.experts > 0 ? json{{"num_experts", s.experts},
                                              {"top_k", s.top_k},
                                              {"intermediate_size", s.moe_inter}}
                                       : json(nullptr)},
                 {"bos_token_id", 2},
                 {"eos_token_ids", {1, 106}},
                 {"pad_token_id", 0},
                 {"max_position_embeddings", 4096},
                 {"layers", layers}};
    json manifest = {{"format", "redwing-model"},
                     {"format_version", 1},
                     {"created_by", "redwing tests"},
                     {"architecture", arch},
                     {"source",
                      {{"kind", "mlx-affine"},
                       {"repo", nullptr},
                       {"revision", nullptr},
                       {"files", json::array()}}},
                     {"quantization", {{"group_size", s.group}, {"bits", 4}}},
                     {"tensors", tensors},
                     {"experts", experts},
                     {"files", files}};
    std::ofstream(dir / "manifest.json") << manifest.dump(1);
  }

  static void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }

  // ---- the reference forward pass (double precision, whole sequence) ----

  // Logits [T, vocab] for every position of `ids`.
  std::vector<Vec> reference_logits(const std::vector<int32_t>& ids) const {
    const Spec& s = spec_;
    const int T = static_cast<int>(ids.size());
    const int H = s.hidden;
    auto matvec = [](const QMat& m, const Vec& x) {
      Vec y(static_cast<size_t>(m.rows), 0.0);
      for (int r = 0; r < m.rows; ++r) {
        double acc = 0;
        for (int c = 0; c < m.cols; ++c)
          acc += m.w[static_cast<size_t>(r) * m.cols + c] * x[static_cast<size_t>(c)];
        y[static_cast<size_t>(r)] = acc;
      }
      return y;
    };
    auto rms = [&](const Vec& x, const std::vector<double>* w, size_t begin, size_t n) {
      double ss = 0;
      for (size_t i = 0; i < n; ++i) ss += x[begin + i] * x[begin + i];
      const double inv = 1.0 / std::sqrt(ss / n + s.eps);
      Vec y(n);
      for (size_t i = 0; i < n; ++i)
        y[i] = x[begin + i] * inv * (w ? s.norm_offset + (*w)[i] : 1.0);
      return y;
    };
    auto gelu = [](double g) {
      return 0.5 * g *
             (1 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g)));
    };
    auto plain = [&](const std::string& n) -> const std::vector<double>& { return plain_.at(n); };

    std::vector<Vec> x(static_cast<size_t>(T));
    const QMat& emb = quant_.at("embed_tokens");
    for (int t = 0; t < T; ++t) {
      x[static_cast<size_t>(t)].assign(
          emb.w.begin() + static_cast<long>(ids[static_cast<size_t>(t)]) * H,
          emb.w.begin() + static_cast<long>(ids[static_cast<size_t>(t)] + 1) * H);
      for (double& v : x[static_cast<size_t>(t)]) v *= s.embed_scale;
    }
    for (size_t li = 0; li < s.layers.size(); ++li) {
      const LayerSpec& l = s.layers[li];
      const std::string p = "layers." + std::to_string(li) + ".";
      const int D = l.head_dim, half = D / 2;
      std::vector<Vec> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)),
          v(static_cast<size_t>(T));
      for (int t = 0; t < T; ++t) {
        Vec h = rms(x[static_cast<size_t>(t)], &plain(p + "input_layernorm"), 0,
                    static_cast<size_t>(H));
        Vec qq = matvec(quant_.at(p + "self_attn.q_proj"), h);
        Vec kk = matvec(quant_.at(p + "self_attn.k_proj"), h);
        Vec vv = l.k_eq_v ? kk : matvec(quant_.at(p + "self_attn.v_proj"), h);
        auto norm_heads = [&](Vec& z, int nh, const std::vector<double>* w) {
          for (int hh = 0; hh < nh; ++hh) {
            Vec y = rms(z, w, static_cast<size_t>(hh * D), static_cast<size_t>(D));
            std::copy(y.begin(), y.end(), z.begin() + hh * D);
          }
        };
        auto rope = [&](Vec& z, int nh) {
          for (int hh = 0; hh < nh; ++hh)
            for (int j = 0; j < half; ++j) {
              double inv = j < l.pairs ? std::pow(l.theta, -2.0 * j / l.freq_dim) / l.scale : 0.0;
              double a = t * inv, c = std::cos(a), sn = std::sin(a);
              double& x1 = z[static_cast<size_t>(hh * D + j)];
              double& x2 = z[static_cast<size_t>(hh * D + j + half)];
              double n1 = x1 * c - x2 * sn, n2 = x2 * c + x1 * sn;
              x1 = n1;
              x2 = n2;
            }
        };
        norm_heads(qq, s.heads, &plain(p + "self_attn.q_norm"));
        rope(qq, s.heads);
        norm_heads(kk, l.kv_heads, &plain(p + "self_attn.k_norm"));
        rope(kk, l.kv_heads);
        if (s.v_norm) norm_heads(vv, l.kv_heads, nullptr);
        q[static_cast<size_t>(t)] = qq;
        k[static_cast<size_t>(t)] = kk;
        v[static_cast<size_t>(t)] = vv;
      }
      for (int t = 0; t < T; ++t) {
        Vec att(static_cast<size_t>(s.heads * D), 0.0);
        for (int hh = 0; hh < s.heads; ++hh) {
          const int g = hh / (s.heads / l.kv_heads);
          std::vector<double> sc;
          std::vector<int> keys;
          for (int kp = 0; kp <= t; ++kp) {
            if (l.sliding && t - kp >= l.window) continue;
            double d = 0;
            for (int i = 0; i < D; ++i)
              d += q[static_cast<size_t>(t)][static_cast<size_t>(hh * D + i)] *
                   k[static_cast<size_t>(kp)][static_cast<size_t>(g * D + i)];
            sc.push_back(d * s.attention_scale);
            keys.push_back(kp);
          }
          double mx = *std::max_element(sc.begin(), sc.end()), z = 0;
          for (double& e : sc) z += (e = std::exp(e - mx));
          for (size_t j = 0; j < sc.size(); ++j)
            for (int i = 0; i < D; ++i)
              att[static_cast<size_t>(hh * D + i)] +=
                  sc[j] / z * v[static_cast<size_t>(keys[j])][static_cast<size_t>(g * D + i)];
        }
        Vec o = matvec(quant_.at(p + "self_attn.o_proj"), att);
        o = rms(o, &plain(p + "post_attention_layernorm"), 0, static_cast<size_t>(H));
        for (int i = 0; i < H; ++i)
          x[static_cast<size_t>(t)][static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
      }
      for (int t = 0; t < T; ++t) {
        Vec& r = x[static_cast<size_t>(t)];
        auto glu = [&](const QMat& gw, const QMat& uw, const QMat& dw, const Vec& in) {
          Vec gg = matvec(gw, in), uu = matvec(uw, in);
          for (size_t i = 0; i < gg.size(); ++i) gg[i] = gelu(gg[i]) * uu[i];
          return matvec(dw, gg);
        };
        Vec m = glu(quant_.at(p + "mlp.gate_proj"), quant_.at(p + "mlp.up_proj"),
                    quant_.at(p + "mlp.down_proj"),
                    rms(r, &plain(p + "pre_feedforward_layernorm"), 0, static_cast<size_t>(H)));
        if (l.moe) {
          Vec h1 = rms(m, &plain(p + "post_feedforward_layernorm_1"), 0, static_cast<size_t>(H));
          Vec z = rms(r, nullptr, 0, static_cast<size_t>(H));
          const auto& rs = plain(p + "router.scale");
          for (int i = 0; i < H; ++i)
            z[static_cast<size_t>(i)] *= rs[static_cast<size_t>(i)] / std::sqrt(double(H));
          Vec lg = matvec(quant_.at(p + "router.proj"), z);
          double mx = *std::max_element(lg.begin(), lg.end()), zz = 0;
          for (double& e : lg) zz += (e = std::exp(e - mx));
          for (double& e : lg) e /= zz;
          std::vector<int> order(lg.size());
          for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return lg[static_cast<size_t>(a)] > lg[static_cast<size_t>(b)];
          });
          double top = 0;
          for (int j = 0; j < s.top_k; ++j)
            top += lg[static_cast<size_t>(order[static_cast<size_t>(j)])];
          Vec ein = rms(r, &plain(p + "pre_feedforward_layernorm_2"), 0, static_cast<size_t>(H));
          Vec acc(static_cast<size_t>(H), 0.0);
          for (int j = 0; j < s.top_k; ++j) {
            const int e = order[static_cast<size_t>(j)];
            const double w = lg[static_cast<size_t>(e)] / top *
                             plain(p + "router.per_expert_scale")[static_cast<size_t>(e)];
            const auto& ex = experts_.at(static_cast<int>(li))[static_cast<size_t>(e)];
            Vec y = glu(ex[0], ex[1], ex[2], ein);
            for (int i = 0; i < H; ++i)
              acc[static_cast<size_t>(i)] += w * y[static_cast<size_t>(i)];
          }
          Vec h2 = rms(acc, &plain(p + "post_feedforward_layernorm_2"), 0, static_cast<size_t>(H));
          for (int i = 0; i < H; ++i)
            m[static_cast<size_t>(i)] = h1[static_cast<size_t>(i)] + h2[static_cast<size_t>(i)];
        }
        Vec f = rms(m, &plain(p + "post_feedforward_layernorm"), 0, static_cast<size_t>(H));
        const double ls = s.layer_scalar ? plain(p + "layer_scalar")[0] : 1.0;
        for (int i = 0; i < H; ++i)
          r[static_cast<size_t>(i)] = (r[static_cast<size_t>(i)] + f[static_cast<size_t>(i)]) * ls;
      }
    }
    std::vector<Vec> out;
    for (int t = 0; t < T; ++t) {
      Vec h = rms(x[static_cast<size_t>(t)], &plain("norm"), 0, static_cast<size_t>(H));
      Vec lg = matvec(emb, h);
      if (s.softcap > 0)
        for (double& e : lg) e = s.softcap * std::tanh(e / s.softcap);
      out.push_back(lg);
    }
    return out;
  }

 private:
  Spec spec_;
  std::mt19937_64 rng_;
};

}  // namespace synth
