#include "format/model_dir.h"

#include "format/checked.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
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
constexpr uint64_t kExpertAlignment = 16384;

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

// Bounds of the manifest's numbers (docs/format.md "Validation"); core/format/manifest.ts holds
// the same ones and fixtures/manifest-corpus keeps the two readers equal.
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
// Sizes and offsets stay exact in a JavaScript number (the TypeScript reader's z.number().int()).
constexpr int64_t kMaxInt64 = (int64_t{1} << 53) - 1;
// Float fields that scale activations: finite and within a range no real model leaves, so a
// manifest cannot turn every activation into inf or NaN.
constexpr double kMinScale = 1e-6, kMaxScale = 1e6;
constexpr double kMinEps = 1e-12, kMaxEps = 1.0;
constexpr double kMinTheta = 1.0, kMaxTheta = 1e12;
const char* const kAuxiliaryFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                       "chat_template.jinja", "generation_config.json",
                                       "special_tokens_map.json"};

// A value as it appears in an error message: JSON, cut short.
std::string short_dump(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 64 ? s.substr(0, 60) + "..." : s;
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

  std::string string(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string()) fail(where + "." + key + " is not a string");
    return v.get<std::string>();
  }

  bool boolean(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_boolean()) fail(where + "." + key + " is not a boolean");
    return v.get<bool>();
  }

  // An integer within [lo, hi]; a float, a string or a value outside the range (which nlohmann
  // would otherwise truncate to the C++ type) is an error naming the field.
  int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) const {
    // 64.0 is the integer 64 to JSON.parse, so here too.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d == std::floor(d) && d >= static_cast<double>(lo) && d <= static_cast<double>(hi))
        return static_cast<int64_t>(d);
    }
    const bool in_range =
        (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
         static_cast<int64_t>(v.get<uint64_t>()) >= lo) ||
        (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= lo &&
         v.get<int64_t>() <= hi);
    if (!in_range)
      fail(name + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
           "], not " + short_dump(v));
    return v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
  }
  int64_t integer(const json& obj, const char* key, const std::string& where, int64_t lo,
                  int64_t hi) const {
    return integer(field(obj, key, where), where + "." + key, lo, hi);
  }

  double number(const json& obj, const char* key, const std::string& where, double lo,
                double hi) const {
    const json& v = field(obj, key, where);
    if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi))
      fail(where + "." + key + " must be a number in [" + json(lo).dump() + ", " + json(hi).dump() +
           "], not " + short_dump(v));
    return v.get<double>();
  }

  // checked::mul/add with the error turned into a FormatError of this manifest.
  uint64_t mul(uint64_t a, uint64_t b, const std::string& what) const {
    try {
      return checked::mul(a, b, what);
    } catch (const SizeOverflow& e) {
      fail(e.what());
    }
  }
  uint64_t add(uint64_t a, uint64_t b, const std::string& what) const {
    try {
      return checked::add(a, b, what);
    } catch (const SizeOverflow& e) {
      fail(e.what());
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
    r.offset = static_cast<uint64_t>(integer(obj, "offset", where, 0, kMaxInt64));
    r.nbytes = static_cast<uint64_t>(integer(obj, "nbytes", where, 0, kMaxInt64));
    if (r.offset % kTensorAlignment != 0) fail(where + " offset is not a multiple of 64");
    return r;
  }

  QuantTensorInfo quant(const json& t, const std::string& where) const {
    QuantTensorInfo q;
    q.bits = static_cast<int>(integer(t, "bits", where, 0, kMaxInt));
    q.group_size = static_cast<int>(integer(t, "group_size", where, 0, kMaxInt));
    q.scale_dtype = dtype(field(t, "scale_dtype", where), where + ".scale_dtype");
    const json& shape = field(t, "shape", where);
    if (!shape.is_array() || shape.size() != 2) fail(where + " shape is not [rows, cols]");
    q.rows = integer(shape[0], where + ".shape[0]", 1, kMaxInt64);
    q.cols = integer(shape[1], where + ".shape[1]", 1, kMaxInt64);
    if (q.bits != 4 && q.bits != 8) fail(where + " has unsupported bits " + std::to_string(q.bits));
    if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
      fail(where + " has unsupported group_size " + std::to_string(q.group_size));
    if (q.cols % q.group_size != 0) fail(where + " cols is not a multiple of group_size");
    q.weight = region(field(t, "weight", where), where + ".weight");
    q.scales = region(field(t, "scales", where), where + ".scales");
    q.biases = region(field(t, "biases", where), where + ".biases");
    const uint64_t rows = static_cast<uint64_t>(q.rows), cols = static_cast<uint64_t>(q.cols);
    const uint64_t wbytes = mul(mul(rows, cols, where + ".weight bytes"),
                                static_cast<uint64_t>(q.bits), where + ".weight bytes") /
                            8;
    const uint64_t sbytes =
        mul(mul(rows, cols / static_cast<uint64_t>(q.group_size), where + ".scales bytes"),
            static_cast<uint64_t>(dtype_size(q.scale_dtype)), where + ".scales bytes");
    if (q.weight.nbytes != wbytes) fail(where + ".weight nbytes does not match its shape");
    if (q.scales.nbytes != sbytes) fail(where + ".scales nbytes does not match its shape");
    if (q.biases.nbytes != sbytes) fail(where + ".biases nbytes does not match its shape");
    return q;
  }

 private:
  std::string file_;
};

bool safe_relative_path(const std::string& p) {
  if (p.empty() || p.size() > 4096 || p.front() == '/' || p.find('\\') != std::string::npos ||
      p.find('\0') != std::string::npos)
    return false;
  std::stringstream ss(p);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return p.back() != '/';
}

struct NamedRegion {
  std::string what;
  Region r;
};

// Every region inside a container of `size` bytes, and no two overlapping.
void check_regions(std::vector<NamedRegion> regions, uint64_t size, const std::string& container,
                   const ManifestReader& r) {
  for (const NamedRegion& n : regions)
    if (n.r.offset > size || n.r.nbytes > size - n.r.offset)
      r.fail(n.what + " lies outside " + container + " (" + std::to_string(size) + " bytes)");
  std::sort(regions.begin(), regions.end(), [](const NamedRegion& a, const NamedRegion& b) {
    return a.r.offset < b.r.offset || (a.r.offset == b.r.offset && a.r.nbytes < b.r.nbytes);
  });
  for (size_t i = 1; i < regions.size(); ++i) {
    const NamedRegion& a = regions[i - 1];
    const NamedRegion& b = regions[i];
    if (b.r.offset < a.r.offset + a.r.nbytes) r.fail(a.what + " and " + b.what + " overlap");
  }
}

std::string expert_file_name(int layer) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "experts/layer_%03d.bin", layer);
  return buf;
}

// What an architecture needs: every resident tensor's name, kind and logical shape, in the
// order docs/format.md "Names" lists them (core/format/manifest.ts expectedTensors).
struct TensorSpec {
  std::string name;
  bool quantized = false;
  std::vector<int64_t> shape;
};

std::vector<TensorSpec> expected_tensors(const Architecture& a) {
  std::vector<TensorSpec> out;
  const int64_t h = a.hidden_size;
  auto plain = [&](const std::string& n, int64_t d) { out.push_back({n, false, {d}}); };
  auto quant = [&](const std::string& n, int64_t rows, int64_t cols) {
    out.push_back({n, true, {rows, cols}});
  };
  quant("embed_tokens", a.vocab_size, h);
  for (int i = 0; i < a.num_layers; ++i) {
    const LayerConfig& l = a.layers[static_cast<size_t>(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* n : {"input_layernorm", "post_attention_layernorm",
                          "pre_feedforward_layernorm", "post_feedforward_layernorm"})
      plain(p + n, h);
    if (l.moe)
      for (const char* n : {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                            "post_feedforward_layernorm_2"})
        plain(p + n, h);
    const int64_t q = int64_t{a.num_attention_heads} * l.head_dim;
    const int64_t kv = int64_t{l.num_kv_heads} * l.head_dim;
    quant(p + "self_attn.q_proj", q, h);
    quant(p + "self_attn.k_proj", kv, h);
    if (!l.k_eq_v) quant(p + "self_attn.v_proj", kv, h);
    quant(p + "self_attn.o_proj", h, q);
    plain(p + "self_attn.q_norm", l.head_dim);
    plain(p + "self_attn.k_norm", l.head_dim);
    quant(p + "mlp.gate_proj", a.intermediate_size, h);
    quant(p + "mlp.up_proj", a.intermediate_size, h);
    quant(p + "mlp.down_proj", h, a.intermediate_size);
    if (l.moe) {
      quant(p + "router.proj", a.moe->num_experts, h);
      plain(p + "router.scale", h);
      plain(p + "router.per_expert_scale", a.moe->num_experts);
    }
    if (a.family == "gemma4") plain(p + "layer_scalar", 1);
  }
  plain("norm", h);
  return out;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

HostQuantMatrix quant_shape(const QuantTensorInfo& info) {
  HostQuantMatrix m;
  m.scale_dtype = info.scale_dtype;
  m.bits = info.bits;
  m.group_size = info.group_size;
  m.rows = info.rows;
  m.cols = info.cols;
  return m;
}

HostQuantMatrix host_quant_at(const QuantTensorInfo& info, const std::byte* base) {
  HostQuantMatrix m = quant_shape(info);
  m.packed = reinterpret_cast<const uint32_t*>(base + info.weight.offset);
  m.scales = base + info.scales.offset;
  m.biases = base + info.biases.offset;
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

  ManifestReader r(manifest_path);
  json m;
  {
    auto file = platform::MappedFile::open(manifest_path);
    const char* begin = reinterpret_cast<const char*>(file.data());
    // The writer never emits a byte order mark; nlohmann would skip one silently, JSON.parse
    // would not: both readers refuse it.
    if (file.size() >= 3 && std::memcmp(begin, "\xEF\xBB\xBF", 3) == 0)
      r.fail("starts with a byte order mark (BOM); the manifest is plain UTF-8 JSON");
    try {
      m = json::parse(begin, begin + file.size());
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e400
      r.fail(std::string("invalid JSON: ") + e.what());
    }
  }
  if (!m.is_object()) r.fail("not a JSON object");
  if (!m.contains("format") || m["format"] != "redwing-model")
    r.fail("not a Redwing model manifest (\"format\" is not \"redwing-model\")");
  {
    const json& v = r.field(m, "format_version", "manifest");
    // Compared as JSON numbers: 2^32 + 1 is not version 1.
    if (!v.is_number_integer() || v != json(kFormatVersion))
      r.fail("format_version " + short_dump(v) +
             " is not supported; this engine reads format_version " +
             std::to_string(kFormatVersion));
  }
  if (!r.field(m, "created_by", "manifest").is_string()) r.fail("created_by is not a string");

  ModelDir md;
  md.dir_ = dir;

  // ---- files: plain relative paths, each once, present as regular files with their sizes.
  std::map<std::string, uint64_t> files;
  const json& file_list = r.field(m, "files", "manifest");
  if (!file_list.is_array()) r.fail("\"files\" is not an array");
  for (const json& f : file_list) {
    auto path = r.string(f, "path", "files[]");
    const std::string fw = "files[" + path + "]";
    auto size = static_cast<uint64_t>(r.integer(f, "size", fw, 0, kMaxInt64));
    const json& sha = r.field(f, "sha256", fw);
    if (!sha.is_string() || sha.get<std::string>().size() != 64 ||
        sha.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
      r.fail(fw + ".sha256 must be 64 lower-case hex digits");
    if (!safe_relative_path(path))
      r.fail("file path \"" + path + "\" is not a plain relative path");
    if (files.count(path)) r.fail("files lists " + path + " twice");
    if (path == "manifest.json") r.fail("files lists manifest.json itself");
    const bool aux = std::find(std::begin(kAuxiliaryFiles), std::end(kAuxiliaryFiles), path) !=
                     std::end(kAuxiliaryFiles);
    if (path != "weights.bin" && !aux &&
        !(path.rfind("experts/", 0) == 0 && path.find('/', 8) == std::string::npos))
      r.fail(path + " is not a file the format allows");
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
  // Nothing else in the directory: an unlisted file, a link or a special file is refused.
  {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<std::pair<fs::path, std::string>> todo = {{fs::path(dir), ""}};
    while (!todo.empty()) {
      auto [abs, rel] = todo.back();
      todo.pop_back();
      for (fs::directory_iterator it(abs, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        const std::string path = rel.empty() ? name : rel + "/" + name;
        const fs::file_status st = it->symlink_status(ec);
        if (ec) break;
        if (fs::is_symlink(st))
          throw FormatError(dir + "/" + path + ": symbolic links are not allowed");
        if (fs::is_directory(st)) {
          if (rel.empty() && name == "experts")
            todo.emplace_back(it->path(), path);
          else
            throw FormatError(dir + "/" + path + ": an unexpected directory");
        } else if (!fs::is_regular_file(st)) {
          throw FormatError(dir + "/" + path + ": not a regular file");
        } else if (path != "manifest.json" && !files.count(path)) {
          throw FormatError(dir + "/" + path +
                            ": not listed in the manifest; a model directory holds only its "
                            "listed files");
        }
      }
      if (ec) throw FormatError(dir + ": cannot list the directory: " + ec.message());
    }
  }

  // ---- architecture
  {
    const json& a = r.field(m, "architecture", "manifest");
    Architecture& arch = md.arch_;
    const std::string w = "architecture";
    arch.family = r.string(a, "family", w);
    if (arch.family != "gemma4" && arch.family != "gemma3")
      r.fail("architecture family \"" + arch.family + "\" is not supported (gemma4, gemma3)");
    arch.vocab_size = r.integer(a, "vocab_size", w, 1, kMaxInt);
    arch.hidden_size = r.integer(a, "hidden_size", w, 1, kMaxInt);
    arch.num_layers = static_cast<int>(r.integer(a, "num_layers", w, 1, kMaxInt));
    arch.num_attention_heads = static_cast<int>(r.integer(a, "num_attention_heads", w, 1, kMaxInt));
    arch.intermediate_size = r.integer(a, "intermediate_size", w, 1, kMaxInt);
    arch.rms_norm_eps = static_cast<float>(r.number(a, "rms_norm_eps", w, kMinEps, kMaxEps));
    arch.norm_weight_offset = static_cast<float>(r.number(a, "norm_weight_offset", w, 0, 1));
    if (arch.norm_weight_offset != 0.0f && arch.norm_weight_offset != 1.0f)
      r.fail("architecture.norm_weight_offset must be 0 or 1");
    arch.embed_scale = static_cast<float>(r.number(a, "embed_scale", w, kMinScale, kMaxScale));
    arch.attention_scale =
        static_cast<float>(r.number(a, "attention_scale", w, kMinScale, kMaxScale));
    if (!r.field(a, "final_logit_softcap", w).is_null())
      arch.final_logit_softcap =
          static_cast<float>(r.number(a, "final_logit_softcap", w, kMinScale, kMaxScale));
    arch.activation = r.string(a, "activation", w);
    if (arch.activation != "gelu_tanh")
      r.fail("activation \"" + arch.activation + "\" is not supported (gelu_tanh)");
    arch.tie_word_embeddings = r.boolean(a, "tie_word_embeddings", w);
    if (!arch.tie_word_embeddings) r.fail("untied output heads are not supported");
    arch.v_norm = r.boolean(a, "v_norm", w);
    const json& moe = r.field(a, "moe", w);
    if (!moe.is_null()) {
      MoeConfig mc;
      mc.num_experts = static_cast<int>(r.integer(moe, "num_experts", w + ".moe", 1, kMaxInt));
      mc.top_k = static_cast<int>(r.integer(moe, "top_k", w + ".moe", 1, kMaxInt));
      mc.intermediate_size = r.integer(moe, "intermediate_size", w + ".moe", 1, kMaxInt);
      if (mc.top_k > mc.num_experts) r.fail("architecture.moe.top_k exceeds num_experts");
      arch.moe = mc;
    }
    const json& bos = r.field(a, "bos_token_id", w);
    arch.bos_token_id =
        bos.is_null() ? -1 : static_cast<int>(r.integer(bos, w + ".bos_token_id", 0, kMaxInt));
    const json& eos = r.field(a, "eos_token_ids", w);
    if (!eos.is_array() || eos.empty()) r.fail(w + ".eos_token_ids is not a non-empty array");
    for (const json& e : eos)
      arch.eos_token_ids.push_back(
          static_cast<int32_t>(r.integer(e, w + ".eos_token_ids[]", 0, kMaxInt)));
    const json& pad = r.field(a, "pad_token_id", w);
    arch.pad_token_id =
        pad.is_null() ? -1 : static_cast<int>(r.integer(pad, w + ".pad_token_id", 0, kMaxInt));
    arch.max_position_embeddings = r.integer(a, "max_position_embeddings", w, 1, kMaxInt64);
    const json& layers = r.field(a, "layers", w);
    if (!layers.is_array() || layers.size() != static_cast<size_t>(arch.num_layers))
      r.fail("architecture.layers does not have num_layers entries");
    for (int i = 0; i < arch.num_layers; ++i) {
      const json& l = layers[static_cast<size_t>(i)];
      const std::string lw = "architecture.layers[" + std::to_string(i) + "]";
      LayerConfig lc;
      auto type = r.string(l, "attention", lw);
      if (type != "sliding" && type != "full") r.fail(lw + ".attention is not sliding or full");
      lc.sliding = type == "sliding";
      const json& win = r.field(l, "sliding_window", lw);
      lc.sliding_window =
          win.is_null() ? 0 : static_cast<int>(r.integer(win, lw + ".sliding_window", 1, kMaxInt));
      if (lc.sliding && lc.sliding_window <= 0)
        r.fail(lw + " is sliding without a positive window");
      if (!lc.sliding && lc.sliding_window != 0) r.fail(lw + " is full but has a sliding window");
      lc.head_dim = static_cast<int>(r.integer(l, "head_dim", lw, 1, kMaxInt));
      lc.num_kv_heads = static_cast<int>(r.integer(l, "num_kv_heads", lw, 1, kMaxInt));
      lc.k_eq_v = r.boolean(l, "k_eq_v", lw);
      lc.moe = r.boolean(l, "moe", lw);
      if (lc.head_dim % 2 != 0) r.fail(lw + ".head_dim must be positive and even");
      if (arch.num_attention_heads % lc.num_kv_heads != 0)
        r.fail(lw + ".num_kv_heads must divide num_attention_heads");
      if (lc.moe && !arch.moe) r.fail(lw + " is an MoE layer but architecture.moe is null");
      const json& rope = r.field(l, "rope", lw);
      lc.rope.theta = r.number(rope, "theta", lw + ".rope", kMinTheta, kMaxTheta);
      lc.rope.rotary_pairs =
          static_cast<int>(r.integer(rope, "rotary_pairs", lw + ".rope", 0, kMaxInt));
      lc.rope.freq_dim = static_cast<int>(r.integer(rope, "freq_dim", lw + ".rope", 1, kMaxInt));
      lc.rope.scale = r.number(rope, "scale", lw + ".rope", kMinScale, kMaxScale);
      if (lc.rope.rotary_pairs > lc.head_dim / 2)
        r.fail(lw + ".rope.rotary_pairs exceeds head_dim / 2");
      arch.layers.push_back(lc);
    }
  }
  {
    const json& source = r.field(m, "source", "manifest");
    md.source_kind_ = r.string(source, "kind", "source");
  }

  // ---- resident tensors: exactly the ones the architecture needs, with their shapes, each
  // inside weights.bin and none overlapping another.
  const Architecture& arch = md.arch_;
  const uint64_t weights_size = files.at("weights.bin");
  const std::string weights_path = dir + "/weights.bin";
  const json& tensors = r.field(m, "tensors", "manifest");
  if (!tensors.is_object()) r.fail("\"tensors\" is not an object");
  std::vector<NamedRegion> regions;
  for (const auto& [name, t] : tensors.items()) {
    const std::string w = "tensor \"" + name + "\"";
    auto dt = r.string(t, "dtype", w);
    if (dt == "affine") {
      QuantTensorInfo q = r.quant(t, w);
      regions.push_back({w + " weight", q.weight});
      regions.push_back({w + " scales", q.scales});
      regions.push_back({w + " biases", q.biases});
      md.quant_[name] = q;
    } else {
      PlainTensorInfo p;
      p.dtype = r.dtype(t["dtype"], w + ".dtype");
      const json& shape = r.field(t, "shape", w);
      if (!shape.is_array()) r.fail(w + ".shape is not an array");
      uint64_t numel = 1;
      for (const json& d : shape) {
        p.shape.push_back(r.integer(d, w + ".shape[]", 0, kMaxInt64));
        numel = r.mul(numel, static_cast<uint64_t>(p.shape.back()), w + " element count");
      }
      p.data = r.region(t, w);
      if (p.data.nbytes != r.mul(numel, static_cast<uint64_t>(dtype_size(p.dtype)), w + " bytes"))
        r.fail(w + " nbytes does not match its shape");
      regions.push_back({w, p.data});
      md.plain_[name] = p;
    }
  }
  check_regions(std::move(regions), weights_size, "weights.bin", r);
  {
    std::set<std::string> expected;
    for (const TensorSpec& spec : expected_tensors(arch)) {
      expected.insert(spec.name);
      const std::string w = "tensor \"" + spec.name + "\"";
      auto qi = md.quant_.find(spec.name);
      auto pi = md.plain_.find(spec.name);
      if (qi == md.quant_.end() && pi == md.plain_.end()) r.fail(w + " is missing");
      if (spec.quantized != (qi != md.quant_.end()))
        r.fail(w + " must be " + (spec.quantized ? "quantized" : "plain"));
      const std::vector<int64_t> shape =
          spec.quantized ? std::vector<int64_t>{qi->second.rows, qi->second.cols}
                         : pi->second.shape;
      if (shape != spec.shape)
        r.fail(w + " has shape " + shape_string(shape) + ", expected " + shape_string(spec.shape));
    }
    for (const auto& [name, t] : tensors.items())
      if (!expected.count(name)) r.fail("unexpected tensor \"" + name + "\"");
  }

  // ---- expert files: one per MoE layer, count * stride bytes, the three parts of the expected
  // shapes inside the stride and not overlapping.
  const json& ex = r.field(m, "experts", "manifest");
  std::set<std::string> expert_files;
  if (!ex.is_null()) {
    const uint64_t alignment =
        static_cast<uint64_t>(r.integer(ex, "alignment", "experts", 0, kMaxInt64));
    if (alignment != kExpertAlignment)
      r.fail("experts.alignment must be " + std::to_string(kExpertAlignment));
    const json& layers = r.field(ex, "layers", "experts");
    if (!layers.is_object()) r.fail("experts.layers is not an object");
    for (const auto& [key, l] : layers.items()) {
      const std::string w = "experts.layers[\"" + key + "\"]";
      int layer = -1;
      if (!key.empty() && key.size() <= 9 &&
          key.find_first_not_of("0123456789") == std::string::npos && (key == "0" || key[0] != '0'))
        layer = std::stoi(key);
      if (layer < 0 || layer >= arch.num_layers) r.fail(w + ": not a layer index");
      if (!arch.layers[static_cast<size_t>(layer)].moe)
        r.fail(w + ": layer " + key + " is not an MoE layer");
      ExpertLayerInfo info;
      info.file = r.string(l, "file", w);
      info.count = static_cast<int>(r.integer(l, "count", w, 1, kMaxInt));
      info.stride = static_cast<uint64_t>(r.integer(l, "stride", w, 1, kMaxInt64));
      if (info.file != expert_file_name(layer))
        r.fail(w + ".file must be " + expert_file_name(layer) + ", not " + info.file);
      if (!files.count(info.file))
        r.fail(w + ".file \"" + info.file + "\" is not listed in \"files\"");
      if (info.count != arch.moe->num_experts)
        r.fail(w + ".count " + std::to_string(info.count) + ", expected " +
               std::to_string(arch.moe->num_experts));
      if (info.stride % kExpertAlignment != 0)
        r.fail(w + ".stride is not a positive multiple of the alignment");
      if (files.at(info.file) !=
          r.mul(static_cast<uint64_t>(info.count), info.stride, w + " count * stride"))
        r.fail(w + ": " + info.file + " is not count * stride bytes");
      const json& parts = r.field(l, "parts", w);
      info.gate = r.quant(r.field(parts, "gate_proj", w + ".parts"), w + ".parts.gate_proj");
      info.up = r.quant(r.field(parts, "up_proj", w + ".parts"), w + ".parts.up_proj");
      info.down = r.quant(r.field(parts, "down_proj", w + ".parts"), w + ".parts.down_proj");
      const int64_t mi = arch.moe->intermediate_size, h = arch.hidden_size;
      const std::pair<const char*, const QuantTensorInfo*> named[] = {
          {"gate_proj", &info.gate}, {"up_proj", &info.up}, {"down_proj", &info.down}};
      std::vector<NamedRegion> blob;
      for (const auto& [pname, q] : named) {
        const std::vector<int64_t> want = std::string(pname) == "down_proj"
                                              ? std::vector<int64_t>{h, mi}
                                              : std::vector<int64_t>{mi, h};
        const std::vector<int64_t> got = {q->rows, q->cols};
        if (got != want)
          r.fail(w + ".parts." + pname + " has shape " + shape_string(got) + ", expected " +
                 shape_string(want));
        blob.push_back({w + ".parts." + pname + ".weight", q->weight});
        blob.push_back({w + ".parts." + pname + ".scales", q->scales});
        blob.push_back({w + ".parts." + pname + ".biases", q->biases});
      }
      check_regions(std::move(blob), info.stride, w + " blob (stride)", r);
      expert_files.insert(info.file);
      md.experts_[layer] = info;
    }
  }
  for (int i = 0; i < arch.num_layers; ++i)
    if (arch.layers[static_cast<size_t>(i)].moe && !md.experts_.count(i))
      r.fail("experts.layers[\"" + std::to_string(i) + "\"] is missing (layer " +
             std::to_string(i) + " is an MoE layer)");
  for (const auto& [path, size] : files)
    if (path.rfind("experts/", 0) == 0 && !expert_files.count(path))
      r.fail(path + " is not the file of any expert layer");

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
