#include "models/expert_source.h"

namespace redwing {

void ExpertSource::for_each(int layer, std::span<const int32_t> experts,
                            const std::function<void(size_t, const ExpertMatrices&)>& fn) {
  std::vector<ExpertMatrices> mats = acquire(layer, experts);
  struct Release {
    ExpertSource* self;
    int layer;
    ~Release() { self->release(layer); }
  } guard{this, layer};
  for (size_t k = 0; k < mats.size(); ++k) fn(k, mats[k]);
}

void ExpertSource::for_each_slot(
    int layer, std::span<const int32_t> experts,
    const std::function<void(size_t, int, const ExpertMatrices&)>& fn) {
  for_each(layer, experts, [&](size_t k, const ExpertMatrices& m) { fn(k, -1, m); });
}

void ExpertSource::for_each_slot_batched(int layer, std::span<const int32_t> experts,
                                         const std::function<void(const SlotDelivery&)>& fn) {
  for_each_slot(layer, experts, [&](size_t k, int slot, const ExpertMatrices& m) {
    fn(SlotDelivery{k, slot, m, false});
  });
}

const ExpertLayerInfo& checked_expert_layer(const ModelDir& dir, int i) {
  const Architecture& arch = dir.arch();
  const ExpertLayerInfo* info = dir.expert_layer(i);
  if (info == nullptr)
    throw FormatError(dir.path() + "/manifest.json: layer " + std::to_string(i) +
                      " is an MoE layer but has no expert file");
  const MoeConfig& moe = *arch.moe;
  auto check = [&](const QuantTensorInfo& q, int64_t rows, int64_t cols, const char* part) {
    if (q.rows != rows || q.cols != cols)
      throw FormatError(dir.path() + "/manifest.json: " + info->file + " " + part + " has shape [" +
                        std::to_string(q.rows) + ", " + std::to_string(q.cols) + "], expected [" +
                        std::to_string(rows) + ", " + std::to_string(cols) + "]");
  };
  check(info->gate, moe.intermediate_size, arch.hidden_size, "gate_proj");
  check(info->up, moe.intermediate_size, arch.hidden_size, "up_proj");
  check(info->down, arch.hidden_size, moe.intermediate_size, "down_proj");
  if (info->count != moe.num_experts)
    throw FormatError(dir.path() + "/manifest.json: " + info->file + " holds " +
                      std::to_string(info->count) + " experts, the architecture has " +
                      std::to_string(moe.num_experts));
  return *info;
}

void check_expert_file_size(const std::string& path, const ExpertLayerInfo& info, uint64_t actual) {
  const uint64_t size = static_cast<uint64_t>(info.count) * info.stride;
  if (actual != size)
    throw FormatError(path + ": size is " + std::to_string(actual) + " bytes, expected " +
                      std::to_string(size) + " (" + std::to_string(info.count) + " experts of " +
                      std::to_string(info.stride) + " bytes)");
}

// Views of the chosen experts of a layer whose whole file lies in memory at `base`.
static std::vector<ExpertMatrices> experts_in_memory(const ExpertLayerInfo& info,
                                                     const std::byte* base, const std::string& path,
                                                     std::span<const int32_t> experts,
                                                     int row_group = 1) {
  std::vector<ExpertMatrices> out;
  out.reserve(experts.size());
  for (int32_t e : experts) {
    if (e < 0 || e >= info.count)
      throw std::out_of_range("expert " + std::to_string(e) + " out of range in " + path);
    const std::byte* blob = base + static_cast<uint64_t>(e) * info.stride;
    ExpertMatrices m{host_quant_at(info.gate, blob), host_quant_at(info.up, blob),
                     host_quant_at(info.down, blob)};
    for (HostQuantMatrix* h : {&m.gate, &m.up, &m.down})
      if (h->rows % row_group == 0) h->row_group = row_group;
    out.push_back(m);
  }
  return out;
}

ResidentExpertSource::ResidentExpertSource(const ModelDir& dir, const Backend* layout) {
  const Architecture& arch = dir.arch();
  for (int i = 0; i < arch.num_layers; ++i) {
    if (!arch.layers[static_cast<size_t>(i)].moe) continue;
    const ExpertLayerInfo& info = checked_expert_layer(dir, i);
    Layer layer;
    layer.info = info;
    layer.path = dir.file_path(info.file);
    const uint64_t size = static_cast<uint64_t>(info.count) * info.stride;
    auto file = platform::ReadFile::open(layer.path);
    check_expert_file_size(layer.path, info, file.size());
    layer.data = platform::allocate_aligned(size, 16384);
    file.read_exact(layer.data.get(), size, 0);
    if (layout != nullptr && layout->preferred_row_group() != 1) {
      layer.row_group = layout->preferred_row_group();
      for (int e = 0; e < info.count; ++e) {
        std::byte* blob = layer.data.get() + static_cast<uint64_t>(e) * info.stride;
        for (const QuantTensorInfo* q : {&info.gate, &info.up, &info.down})
          if (q->rows % layer.row_group == 0)  // the same test as experts_in_memory's
            layout->lay_out_rows(reinterpret_cast<uint32_t*>(blob + q->weight.offset), q->rows,
                                 q->cols * q->bits / 32);
      }
    }
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
  return experts_in_memory(l.info, l.data.get(), l.path, experts, l.row_group);
}

MappedExpertSource::MappedExpertSource(const ModelDir& dir) {
  const Architecture& arch = dir.arch();
  for (int i = 0; i < arch.num_layers; ++i) {
    if (!arch.layers[static_cast<size_t>(i)].moe) continue;
    const ExpertLayerInfo& info = checked_expert_layer(dir, i);
    Layer layer{info, platform::MappedFile::open(dir.file_path(info.file))};
    check_expert_file_size(layer.map.path(), info, layer.map.size());
    layers_.emplace(i, std::move(layer));
  }
}

std::vector<ExpertMatrices> MappedExpertSource::acquire(int layer,
                                                        std::span<const int32_t> experts) {
  auto it = layers_.find(layer);
  if (it == layers_.end())
    throw std::logic_error("layer " + std::to_string(layer) + " has no experts");
  const Layer& l = it->second;
  return experts_in_memory(l.info, l.map.data(), l.map.path(), experts);
}

}  // namespace redwing
