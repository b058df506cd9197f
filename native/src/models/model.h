// A loaded language model: runs tokens through the network on a backend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "format/model_dir.h"
#include "runtime/expert_source.h"
#include "runtime/kv_cache.h"

namespace redwing {

// Which positions of a forward call need logits. The output head is the most expensive product
// of the network, so only the positions that will be read are computed.
enum class LogitsFor { none, last, all };

class Model {
 public:
  virtual ~Model() = default;
  virtual const Architecture& arch() const = 0;

  // Runs `tokens` at positions cache.length() .. cache.length() + tokens.size() - 1, stores their
  // keys and values in `cache` and advances it. Appends the logits of the positions `which`
  // selects (vocab_size floats each, in position order) to `logits`. Batched products are used
  // for several tokens, matrix-vector products for one.
  virtual void forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
                       std::vector<float>& logits) = 0;
};

// Builds the model the manifest describes. `experts` must outlive the model and is required
// when the model has MoE layers. The ModelDir must outlive the model (weights stay mapped).
std::unique_ptr<Model> load_model(const ModelDir& dir, Backend& backend, ExpertSource* experts);

}  // namespace redwing
