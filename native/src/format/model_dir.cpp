#include "format/model_dir.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace redwing {

using nlohmann::json;

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::f32:
      return "f32";
  }
  return "?";
}

namespace {

constexpr uint64_t kTensorAlignment = 64;

// Exact widening conversions (the format is little-endian; so are all supported hosts).
float bf16_bits_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

class ManifestReader {
 public:
  explicit ManifestReader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& what) const { throw FormatError(file_ + ": " + what); }

  const json& field(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) fail(where + " is not an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(where + " has no \"" + key + "\"");
    return *it;
  }

  template <typename T>
  T get(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    try {
      return v.get<T>();
    } catch (const json::exception&) {
      fail(where + "." + key + " has the wrong type");
    }
  }

  DType dtype(const json& v, const std::string& where) const {
    if (!v.is_string()) fail(where + " is not a dtype string");
    auto s = v.get<std::string>();
    if (s == "bf16") return DType::bf16;
    if (s == "f16") return DType::f16;
    if (s == "f32") return DType::f32;
    fail(where + " has unknown dtype \"" + s + "\"");
  }

  Region region(const json& obj, const std::string& where) const {
    Region r;
    r.offset = get<uint64_t>(obj, "offset", where);
    r.nbytes = get<uint64_t>(obj, "nbytes", where);
    if (r.offset % kTensorAlignment != 0) fail(where + " offset is not a multiple of 64");
    return r;
  }

  QuantTensorInfo quant(const json& t, const std::string& where) const {
    QuantTensorInfo q;
    q.bits = get<int>(t, "bits", where);
    q.group_size = get<int>(t, "group_size", where);
    q.scale_dtype = dtype(field(t, "scale_dtype", where), where + ".scale_dtype");
    auto shape = get<std::vector<int64_t>>(t, "shape", where);
    if (shape.size() != 2 || shape[0] <= 0 || shape[1] <= 0)
      fail(where + " shape is not [rows, cols]");
    q.rows = shape[0];
    q.cols = shape[1];
    if (q.bits != 4 && q.bits != 8) fail(where + " has unsupported bits " + std::to_string(q.bits));
    if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
      fail(where + " has unsupported group_size " + std::to_string(q.group_size));
    if (q.cols % q.group_size != 0) fail(where + " cols is not a multiple of group_size");
    q.weight = region(field(t, "weight", where), where + ".weight");
    q.scales = region(field(t, "scales", where), where + ".scales");
    q.biases = region(field(t, "biases", where), where + ".biases");
    uint64_t wbytes = static_cast<uint64_t>(q.rows) * static_cast<uint64_t>(q.cols) * q.bits / 8;
    uint64_t sbytes = static_cast<uint64_t>(q.rows) * static_cast<uint64_t>(q.cols / q.group_size) *
                      dtype_size(q.scale_dtype);
    if (q.weight.nbytes != wbytes) fail(where + ".weight nbytes does not match its shape");
    if (q.scales.nbytes != sbytes) fail(where + ".scales nbytes does not match its shape");
    if (q.biases.nbytes != sbytes) fail(where + ".biases nbytes does not match its shape");
    return q;
  }

 private:
  std::string file_;
};

bool safe_relative_path(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.find('\\') != std::string::npos) return false;
  std::stringstream ss(p);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return p.back() != '/';
}

void check_within(const Region& r, uint64_t size, const std::string& what,
                  const std::string& file) {
  if (r.offset > size || r.nbytes > size - r.offset)
    throw FormatError(file + ": " + what + " lies outside the file (" + std::to_string(size) +
                      " bytes)");
}

}  // namespace

HostQuantMatrix host_quant_at(const QuantTensorInfo& info, const std::byte* base) {
  HostQuantMatrix m;
  m.packed = reinterpret_cast<const uint32_t*>(base + info.weight.offset);
  m.scales = base + info.scales.offset;
  m.biases = base + info.biases.offset;
  m.scale_dtype = info.scale_dtype;
  m.bits = info.bits;
  m.group_size = info.group_size;
  m.rows = info.rows;
  m.cols = info.cols;
  return m;
}

ModelDir ModelDir::open(const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  using platform::PathKind;
  auto kind = platform::path_kind(dir);
  if (kind == PathKind::missing) throw FormatError("model directory not found: " + dir);
  // The directory itself may be reached through a link the user made; its contents may not.
  if (kind != PathKind::directory && kind != PathKind::symlink)
    throw FormatError("not a directory: " + dir);

  // A writer builds a model under ".<name>.partial-<pid>-<random>" and renames it when done.
  {
    const std::string base = dir.substr(dir.find_last_of('/') + 1);
    if (!base.empty() && base[0] == '.' && base.find(".partial-") != std::string::npos)
      throw FormatError("an unfinished model (partial directory), not an installed one: " + dir);
  }
  const std::string manifest_path = dir + "/manifest.json";
  auto mkind = platform::path_kind(manifest_path);
  if (mkind == PathKind::missing)
    throw FormatError("not an installed Redwing model (no manifest.json): " + dir);
  if (mkind != PathKind::regular)
    throw FormatError(manifest_path + ": not a regular file (symbolic links are not allowed)");

  json m;
  {
    auto file = platform::MappedFile::open(manifest_path);
    const char* begin = reinterpret_cast<const char*>(file.data());
    try {
      m = json::parse(begin, begin + file.size());
    } catch (const json::parse_error& e) {
      throw FormatError(manifest_path + ": invalid JSON: " + e.what());
    }
  }
  ManifestReader r(manifest_path);
  if (!m.is_object()) r.fail("not a JSON object");
  if (!m.contains("format") || m["format"] != "redwing-model")
    r.fail("not a Redwing model manifest (\"format\" is not \"redwing-model\")");
  {
    const json& v = r.field(m, "format_version", "manifest");
    if (!v.is_number_integer()) r.fail("format_version is not an integer");
    int version = v.get<int>();
    if (version != kFormatVersion)
      r.fail("format version " + std::to_string(version) +
             " is not supported; this engine reads format version " +
             std::to_string(kFormatVersion));
  }

  ModelDir md;
  md.dir_ = dir;

  // ---- files: present, regular, inside the directory, with their listed sizes.
  std::map<std::string, uint64_t> files;
  for (const json& f : r.field(m, "files", "manifest")) {
    auto path = r.get<std::string>(f, "path", "files[]");
    auto size = r.get<uint64_t>(f, "size", "files[" + path + "]");
    if (!safe_relative_path(path))
      r.fail("file path \"" + path + "\" is not a plain relative path");
    // Every component must be a real directory or file: no symbolic links anywhere.
    std::string so_far = dir;
    std::stringstream ss(path);
    std::string part;
    std::vector<std::string> parts;
    while (std::getline(ss, part, '/')) parts.push_back(part);
    for (size_t i = 0; i < parts.size(); ++i) {
      so_far += "/" + parts[i];
      auto k = platform::path_kind(so_far);
      bool last = i + 1 == parts.size();
      if (k == PathKind::missing)
        throw FormatError(so_far + ": listed in the manifest but missing");
      if (k == PathKind::symlink) throw FormatError(so_far + ": symbolic links are not allowed");
      if (last && k != PathKind::regular) throw FormatError(so_far + ": not a regular file");
      if (!last && k != PathKind::directory) throw FormatError(so_far + ": not a directory");
    }
    uint64_t actual = platform::file_size(so_far);
    if (actual != size)
      throw FormatError(so_far + ": size is " + std::to_string(actual) +
                        " bytes, the manifest says " + std::to_string(size));
    files[path] = size;
  }
  if (!files.count("weights.bin")) r.fail("\"files\" does not list weights.bin");

  // ---- architecture
  {
    const json& a = r.field(m, "architecture", "manifest");
    Architecture& arch = md.arch_;
    const std::string w = "architecture";
    arch.family = r.get<std::string>(a, "family", w);
    if (arch.family != "gemma4" && arch.family != "gemma3")
      r.fail("architecture family \"" + arch.family + "\" is not supported (gemma4, gemma3)");
    arch.vocab_size = r.get<int64_t>(a, "vocab_size", w);
    arch.hidden_size = r.get<int64_t>(a, "hidden_size", w);
    arch.num_layers = r.get<int>(a, "num_layers", w);
    arch.num_attention_heads = r.get<int>(a, "num_attention_heads", w);
    arch.intermediate_size = r.get<int64_t>(a, "intermediate_size", w);
    arch.rms_norm_eps = static_cast<float>(r.get<double>(a, "rms_norm_eps", w));
    arch.norm_weight_offset = static_cast<float>(r.get<double>(a, "norm_weight_offset", w));
    arch.embed_scale = static_cast<float>(r.get<double>(a, "embed_scale", w));
    arch.attention_scale = static_cast<float>(r.get<double>(a, "attention_scale", w));
    const json& cap = r.field(a, "final_logit_softcap", w);
    if (!cap.is_null()) arch.final_logit_softcap = static_cast<float>(cap.get<double>());
    arch.activation = r.get<std::string>(a, "activation", w);
    if (arch.activation != "gelu_tanh")
      r.fail("activation \"" + arch.activation + "\" is not supported (gelu_tanh)");
    arch.tie_word_embeddings = r.get<bool>(a, "tie_word_embeddings", w);
    if (!arch.tie_word_embeddings) r.fail("untied output heads are not supported");
    arch.v_norm = r.get<bool>(a, "v_norm", w);
    const json& moe = r.field(a, "moe", w);
    if (!moe.is_null()) {
      MoeConfig mc;
      mc.num_experts = r.get<int>(moe, "num_experts", w + ".moe");
      mc.top_k = r.get<int>(moe, "top_k", w + ".moe");
      mc.intermediate_size = r.get<int64_t>(moe, "intermediate_size", w + ".moe");
      if (mc.num_experts <= 0 || mc.top_k <= 0 || mc.top_k > mc.num_experts ||
          mc.intermediate_size <= 0)
        r.fail("architecture.moe is inconsistent");
      arch.moe = mc;
    }
    arch.bos_token_id = r.get<int>(a, "bos_token_id", w);
    arch.eos_token_ids = r.get<std::vector<int32_t>>(a, "eos_token_ids", w);
    const json& pad = r.field(a, "pad_token_id", w);
    arch.pad_token_id = pad.is_null() ? -1 : pad.get<int>();
    arch.max_position_embeddings = r.get<int64_t>(a, "max_position_embeddings", w);
    if (arch.vocab_size <= 0 || arch.hidden_size <= 0 || arch.num_layers <= 0 ||
        arch.num_attention_heads <= 0 || arch.intermediate_size <= 0 ||
        arch.max_position_embeddings <= 0)
      r.fail("architecture sizes must be positive");
    const json& layers = r.field(a, "layers", w);
    if (!layers.is_array() || static_cast<int>(layers.size()) != arch.num_layers)
      r.fail("architecture.layers does not have num_layers entries");
    for (int i = 0; i < arch.num_layers; ++i) {
      const json& l = layers[i];
      const std::string lw = "architecture.layers[" + std::to_string(i) + "]";
      LayerConfig lc;
      auto type = r.get<std::string>(l, "attention", lw);
      if (type != "sliding" && type != "full") r.fail(lw + ".attention is not sliding or full");
      lc.sliding = type == "sliding";
      const json& win = r.field(l, "sliding_window", lw);
      lc.sliding_window = win.is_null() ? 0 : win.get<int>();
      if (lc.sliding && lc.sliding_window <= 0)
        r.fail(lw + " is sliding without a positive window");
      if (!lc.sliding && lc.sliding_window != 0) r.fail(lw + " is full but has a sliding window");
      lc.head_dim = r.get<int>(l, "head_dim", lw);
      lc.num_kv_heads = r.get<int>(l, "num_kv_heads", lw);
      lc.k_eq_v = r.get<bool>(l, "k_eq_v", lw);
      lc.moe = r.get<bool>(l, "moe", lw);
      if (lc.head_dim <= 0 || lc.head_dim % 2 != 0)
        r.fail(lw + ".head_dim must be positive and even");
      if (lc.num_kv_heads <= 0 || arch.num_attention_heads % lc.num_kv_heads != 0)
        r.fail(lw + ".num_kv_heads must divide num_attention_heads");
      if (lc.moe && !arch.moe) r.fail(lw + " is an MoE layer but architecture.moe is null");
      const json& rope = r.field(l, "rope", lw);
      lc.rope.theta = r.get<double>(rope, "theta", lw + ".rope");
      lc.rope.rotary_pairs = r.get<int>(rope, "rotary_pairs", lw + ".rope");
      lc.rope.freq_dim = r.get<int>(rope, "freq_dim", lw + ".rope");
      lc.rope.scale = r.get<double>(rope, "scale", lw + ".rope");
      if (lc.rope.rotary_pairs < 0 || lc.rope.rotary_pairs > lc.head_dim / 2 ||
          lc.rope.freq_dim <= 0 || !(lc.rope.theta > 0) || !(lc.rope.scale > 0))
        r.fail(lw + ".rope is inconsistent");
      arch.layers.push_back(lc);
    }
  }
  if (m.contains("source") && m["source"].is_object() && m["source"].contains("kind") &&
      m["source"]["kind"].is_string())
    md.source_kind_ = m["source"]["kind"].get<std::string>();

  // ---- resident tensors
  const uint64_t weights_size = files.at("weights.bin");
  const std::string weights_path = dir + "/weights.bin";
  for (const auto& [name, t] : r.field(m, "tensors", "manifest").items()) {
    const std::string w = "tensor \"" + name + "\"";
    auto dt = r.get<std::string>(t, "dtype", w);
    if (dt == "affine") {
      QuantTensorInfo q = r.quant(t, w);
      check_within(q.weight, weights_size, w + " weight", weights_path);
      check_within(q.scales, weights_size, w + " scales", weights_path);
      check_within(q.biases, weights_size, w + " biases", weights_path);
      md.quant_[name] = q;
    } else {
      PlainTensorInfo p;
      p.dtype = r.dtype(t["dtype"], w + ".dtype");
      p.shape = r.get<std::vector<int64_t>>(t, "shape", w);
      p.data = r.region(t, w);
      uint64_t numel = 1;
      for (int64_t d : p.shape) {
        if (d < 0) r.fail(w + " has a negative dimension");
        numel *= static_cast<uint64_t>(d);
      }
      if (p.data.nbytes != numel * dtype_size(p.dtype))
        r.fail(w + " nbytes does not match its shape");
      check_within(p.data, weights_size, w, weights_path);
      md.plain_[name] = p;
    }
  }

  // ---- expert files
  const json& ex = r.field(m, "experts", "manifest");
  if (!ex.is_null()) {
    auto alignment = r.get<uint64_t>(ex, "alignment", "experts");
    for (const auto& [key, l] : r.field(ex, "layers", "experts").items()) {
      const std::string w = "experts.layers[\"" + key + "\"]";
      int layer = -1;
      try {
        size_t used = 0;
        layer = std::stoi(key, &used);
        if (used != key.size()) layer = -1;
      } catch (const std::exception&) {
      }
      if (layer < 0 || layer >= md.arch_.num_layers) r.fail(w + ": not a layer index");
      ExpertLayerInfo info;
      info.file = r.get<std::string>(l, "file", w);
      info.count = r.get<int>(l, "count", w);
      info.stride = r.get<uint64_t>(l, "stride", w);
      if (!files.count(info.file))
        r.fail(w + ".file \"" + info.file + "\" is not listed in \"files\"");
      if (alignment == 0 || info.stride == 0 || info.stride % alignment != 0)
        r.fail(w + ".stride is not a positive multiple of the alignment");
      if (files.at(info.file) != static_cast<uint64_t>(info.count) * info.stride)
        r.fail(w + ": " + info.file + " is not count * stride bytes");
      const json& parts = r.field(l, "parts", w);
      info.gate = r.quant(r.field(parts, "gate_proj", w), w + ".gate_proj");
      info.up = r.quant(r.field(parts, "up_proj", w), w + ".up_proj");
      info.down = r.quant(r.field(parts, "down_proj", w), w + ".down_proj");
      for (const QuantTensorInfo* q : {&info.gate, &info.up, &info.down})
        for (const Region* reg : {&q->weight, &q->scales, &q->biases})
          check_within(*reg, info.stride, w + " part", dir + "/" + info.file);
      md.experts_[layer] = info;
    }
  }

  md.weights_ = platform::MappedFile::open(weights_path);
  if (md.weights_.size() != weights_size)
    throw FormatError(weights_path + ": size changed while opening");
  return md;
}

bool ModelDir::has_tensor(const std::string& name) const {
  return plain_.count(name) != 0 || quant_.count(name) != 0;
}

std::vector<float> ModelDir::load_f32(const std::string& name, int64_t expected_numel) const {
  auto it = plain_.find(name);
  if (it == plain_.end()) {
    if (quant_.count(name))
      throw FormatError(dir_ + "/manifest.json: tensor \"" + name +
                        "\" is quantized; a plain tensor was expected");
    throw FormatError(dir_ + "/manifest.json: missing tensor \"" + name + "\"");
  }
  const PlainTensorInfo& p = it->second;
  const int64_t n = static_cast<int64_t>(p.data.nbytes / dtype_size(p.dtype));
  if (expected_numel >= 0 && n != expected_numel)
    throw FormatError(dir_ + "/manifest.json: tensor \"" + name + "\" has " + std::to_string(n) +
                      " elements, expected " + std::to_string(expected_numel));
  std::vector<float> out(static_cast<size_t>(n));
  const std::byte* src = weights_.data() + p.data.offset;
  for (int64_t i = 0; i < n; ++i) {
    if (p.dtype == DType::f32) {
      std::memcpy(&out[i], src + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = p.dtype == DType::bf16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
    }
  }
  return out;
}

HostQuantMatrix ModelDir::quant(const std::string& name, int64_t expected_rows,
                                int64_t expected_cols) const {
  auto it = quant_.find(name);
  if (it == quant_.end()) {
    if (plain_.count(name))
      throw FormatError(dir_ + "/manifest.json: tensor \"" + name +
                        "\" is plain; a quantized matrix was expected");
    throw FormatError(dir_ + "/manifest.json: missing tensor \"" + name + "\"");
  }
  const QuantTensorInfo& q = it->second;
  if ((expected_rows >= 0 && q.rows != expected_rows) ||
      (expected_cols >= 0 && q.cols != expected_cols))
    throw FormatError(dir_ + "/manifest.json: tensor \"" + name + "\" has shape [" +
                      std::to_string(q.rows) + ", " + std::to_string(q.cols) + "], expected [" +
                      std::to_string(expected_rows) + ", " + std::to_string(expected_cols) + "]");
  return host_quant_at(q, weights_.data());
}

const ExpertLayerInfo* ModelDir::expert_layer(int layer) const {
  auto it = experts_.find(layer);
  return it == experts_.end() ? nullptr : &it->second;
}

}  // namespace redwing
