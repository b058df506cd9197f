#include "runtime/expert_source.h"

namespace redwing {

ResidentExpertSource::ResidentExpertSource(const ModelDir& dir) {
  const Architecture& arch = dir.arch();
  for (int i = 0; i < arch.num_layers; ++i) {
    if (!arch.layers[static_cast<size_t>(i)].moe) continue;
    const ExpertLayerInfo* info = dir.expert_layer(i);
    if (info == nullptr)
      throw FormatError(dir.path() + "/manifest.json: layer " + std::to_string(i) +
                        " is an MoE layer but has no expert file");
    const MoeConfig& moe = *arch.moe;
    auto check = [&](const QuantTensorInfo& q, int64_t rows, int64_t cols, const char* part) {
      if (q.rows != rows || q.cols != cols)
        throw FormatError(dir.path() + "/manifest.json: " + info->file + " " + part +
                          " has shape [" + std::to_string(q.rows) + ", " + std::to_string(q.cols) +
                          "], expected [" + std::to_string(rows) + ", " + std::to_string(cols) +
                          "]");
    };
    check(info->gate, moe.intermediate_size, arch.hidden_size, "gate_proj");
    check(info->up, moe.intermediate_size, arch.hidden_size, "up_proj");
    check(info->down, arch.hidden_size, moe.intermediate_size, "down_proj");
    if (info->count != moe.num_experts)
      throw FormatError(dir.path() + "/manifest.json: " + info->file + " holds " +
                        std::to_string(info->count) + " experts, the architecture has " +
                        std::to_string(moe.num_experts));
    Layer layer;
    layer.info = *info;
    layer.path = dir.file_path(info->file);
    const uint64_t size = static_cast<uint64_t>(info->count) * info->stride;
    auto file = platform::ReadFile::open(layer.path);
    if (file.size() != size)
      throw FormatError(layer.path + ": size is " + std::to_string(file.size()) +
                        " bytes, expected " + std::to_string(size));
    layer.data = platform::allocate_aligned(size, 16384);
    file.read_exact(layer.data.get(), size, 0);
    bytes_ += size;
    layers_.emplace(i, std::move(layer));
  }
}

std::vector<ExpertMatrices> ResidentExpertSource::acquire(int layer,
                                                          std::span<const int32_t> experts) {
  auto it = layers_.find(layer);
  if (it == layers_.end())
    throw std::logic_error("layer " + std::to_string(layer) + " has no experts");
  const Layer& l = it->second;
  std::vector<ExpertMatrices> out;
  out.reserve(experts.size());
  for (int32_t e : experts) {
    if (e < 0 || e >= l.info.count)
      throw std::out_of_range("expert " + std::to_string(e) + " out of range in " + l.path);
    const std::byte* blob = l.data.get() + static_cast<uint64_t>(e) * l.info.stride;
    out.push_back({host_quant_at(l.info.gate, blob), host_quant_at(l.info.up, blob),
                   host_quant_at(l.info.down, blob)});
  }
  return out;
}

}  // namespace redwing
