// A loaded language model: runs tokens through the network on a backend.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "format/model_dir.h"
#include "models/expert_source.h"
#include "models/kv_cache.h"

namespace redwing {

// Which positions of a forward call need logits. The output head is the most expensive product
// of the network, so only the positions that will be read are computed.
// last_kept: the last position's logits stay in backend memory (Model::kept_logits), for a
// sampler that reads them there (Sampler::sample_in_place).
enum class LogitsFor { none, last, all, last_kept };

// Benchmark-only: replaces the router's choice of experts (runtime/routing_trace.h). Never set
// in normal use: it changes the model's output.
class RoutingHook {
 public:
  virtual ~RoutingHook() = default;
  // idx holds rows x top_k expert ids as the router chose them; the hook may overwrite them
  // (distinct ids within a row, each in [0, num_experts)).
  virtual void apply(int layer, int64_t rows, int top_k, int num_experts, int32_t* idx) = 0;
};

// Wall time spent in each part of forward() since the model was built, for benchmarks ("where
// the time goes per token"). The CPU backend runs ops synchronously, so these are exact there; a
// backend that queues work must synchronize before they mean anything. `experts` includes any
// wait for expert reads (the expert source counts that wait on its own).
struct ForwardParts {
  double embed_ms = 0, attention_ms = 0, router_ms = 0, dense_mlp_ms = 0, experts_ms = 0,
         head_ms = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const Architecture& arch() const = 0;
  void set_routing_hook(RoutingHook* hook) { routing_hook_ = hook; }
  const ForwardParts& forward_parts() const { return parts_; }
  // The logits row of the last forward() with LogitsFor::last_kept, in backend memory; valid
  // until the next forward().
  Mat kept_logits() const { return kept_logits_; }

  // Runs `tokens` at positions cache.length() .. cache.length() + tokens.size() - 1, stores their
  // keys and values in `cache` and advances it. Appends the logits of the positions `which`
  // selects (vocab_size floats each, in position order) to `logits`. Batched products are used
  // for several tokens, matrix-vector products for one.
  virtual void forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
                       std::vector<float>& logits) = 0;

 protected:
  RoutingHook* routing_hook_ = nullptr;
  ForwardParts parts_;
  Mat kept_logits_;

  // Runs f() and adds its wall time to `ms`.
  template <class F>
  static void timed(double& ms, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

// Builds the model the manifest describes. `experts` must outlive the model and is required
// when the model has MoE layers. The ModelDir must outlive the model (weights stay mapped).
std::unique_ptr<Model> load_model(const ModelDir& dir, Backend& backend, ExpertSource* experts);

}  // namespace redwing
