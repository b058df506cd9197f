// A Redwing model directory (docs/format.md, format version 1): the manifest, the checks that
// the directory is complete and consistent, the mapped weights.bin and typed views of its tensors.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/host_tensor.h"
#include "platform/file.h"

namespace redwing {

// The only format version this engine reads.
inline constexpr int kFormatVersion = 1;

// A model directory that is missing, incomplete or inconsistent. The message names the file
// (and tensor) at fault.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RopeConfig {
  double theta = 10000.0;
  int rotary_pairs = 0;  // pairs (j, j + head_dim / 2) with j < rotary_pairs rotate
  int freq_dim = 0;      // the exponent's denominator: inv_freq[j] = theta^(-2j / freq_dim)
  double scale = 1.0;    // linear scaling: inv_freq /= scale
};

struct LayerConfig {
  bool sliding = false;
  int sliding_window = 0;  // keys seen including the current one; 0 on full-attention layers
  int head_dim = 0;
  int num_kv_heads = 0;
  bool k_eq_v = false;  // V from the raw k_proj output (no v_proj)
  bool moe = false;     // this layer has the expert branch
  RopeConfig rope;
};

struct MoeConfig {
  int num_experts = 0;
  int top_k = 0;
  int64_t intermediate_size = 0;
};

// The manifest's normalized architecture.
struct Architecture {
  std::string family;  // "gemma4" | "gemma3"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_layers = 0;
  int num_attention_heads = 0;
  int64_t intermediate_size = 0;
  float rms_norm_eps = 1e-6f;
  float norm_weight_offset = 0.0f;
  float embed_scale = 1.0f;
  float attention_scale = 1.0f;
  std::optional<float> final_logit_softcap;
  std::string activation;
  bool tie_word_embeddings = true;
  bool v_norm = false;
  std::optional<MoeConfig> moe;
  int bos_token_id = 2;
  std::vector<int32_t> eos_token_ids;
  int pad_token_id = 0;
  int64_t max_position_embeddings = 0;
  std::vector<LayerConfig> layers;
};

struct Region {
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

struct PlainTensorInfo {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  Region data;
};

struct QuantTensorInfo {
  int bits = 4;
  int group_size = 64;
  DType scale_dtype = DType::bf16;
  int64_t rows = 0;
  int64_t cols = 0;
  Region weight, scales, biases;
};

struct ExpertLayerInfo {
  std::string file;  // relative path, e.g. experts/layer_003.bin
  int count = 0;
  uint64_t stride = 0;
  QuantTensorInfo gate, up, down;  // offsets relative to an expert's blob
};

class ModelDir {
 public:
  // Reads and checks the directory: manifest format and version, every listed file present
  // (regular, not a symbolic link, inside the directory) with its listed size, every tensor
  // region inside its file. Throws FormatError naming the file at fault.
  static ModelDir open(const std::string& dir);

  const std::string& path() const { return dir_; }
  const Architecture& arch() const { return arch_; }
  const std::string& source_kind() const { return source_kind_; }

  bool has_tensor(const std::string& name) const;
  // A plain tensor converted to float32; throws if it is missing, quantized, or its element
  // count is not `expected_numel` (when >= 0).
  std::vector<float> load_f32(const std::string& name, int64_t expected_numel = -1) const;
  // A quantized matrix pointing into the mapped weights.bin; throws if it is missing, plain, or
  // its shape differs from the expected one (when >= 0).
  HostQuantMatrix quant(const std::string& name, int64_t expected_rows = -1,
                        int64_t expected_cols = -1) const;
  // Reads weights.bin into memory now (platform::MappedFile::populate): the engine calls it
  // while loading, so that the first prompt does not fault the resident weights in page by page.
  void load_weights() const { weights_.populate(); }
  // The expert file description of an MoE layer, or nullptr.
  const ExpertLayerInfo* expert_layer(int layer) const;
  // Absolute path of a file of the directory.
  std::string file_path(const std::string& relative) const { return dir_ + "/" + relative; }

 private:
  std::string dir_;
  Architecture arch_;
  std::string source_kind_;
  std::map<std::string, PlainTensorInfo> plain_;
  std::map<std::string, QuantTensorInfo> quant_;
  std::map<int, ExpertLayerInfo> experts_;
  platform::MappedFile weights_;
};

// A quantized matrix's shape and encoding without its data (null pointers): what a delivery into
// a backend expert slot that already holds the expert carries.
HostQuantMatrix quant_shape(const QuantTensorInfo& info);

// Points a HostQuantMatrix at a quantized tensor whose regions are relative to `base`.
HostQuantMatrix host_quant_at(const QuantTensorInfo& info, const std::byte* base);

}  // namespace redwing
