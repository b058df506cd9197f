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

// Measurement only (runtime/routing_prediction.h): sees the routing a MoE layer used and, before
// the layer runs, what its router would choose from residuals available earlier, to measure
// whether a layer's experts can be predicted (and read) ahead of its router. Never set in normal
// use; when set, the model runs one extra router product per source and MoE layer and reads
// the logits back, which leaves its output unchanged.
enum class RoutingSource {
  after_attention,   // layer L+1's router on layer L's residual after attention (what L routes on)
  before_attention,  // layer L+1's router on layer L's output (layer L+1's input)
  own,               // the layer's router on its own residual: the actual choice (a self-check)
};
class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  // The router's logits (rows x num_experts) of `layer` on the residual `source` names; the
  // earlier sources arrive before the layer's routed() call for the same rows.
  virtual void router_logits(int layer, RoutingSource source, int64_t rows, int num_experts,
                             const float* logits) = 0;
  // The experts `layer` used (rows x top_k ids, after any RoutingHook).
  virtual void routed(int layer, int64_t rows, int top_k, int num_experts, const int32_t* idx) = 0;
};

// Wall time spent in each part of forward() since the model was built, for benchmarks ("where
// the time goes per token"). The CPU backend runs ops synchronously, so these are exact there; a
// backend that queues work must synchronize before they mean anything. `experts` includes any
// wait for expert reads (the expert source counts that wait on its own).
struct ForwardParts {
  double embed_ms = 0, attention_ms = 0, router_ms = 0, dense_mlp_ms = 0, experts_ms = 0,
         head_ms = 0;
  // Of experts_ms, the host's products of hybrid experts (a GPU's misses computed on the CPU).
  double host_experts_ms = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const Architecture& arch() const = 0;
  void set_routing_hook(RoutingHook* hook) { routing_hook_ = hook; }
  // Models without MoE layers never call it.
  void set_routing_observer(RoutingObserver* observer) { routing_observer_ = observer; }
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
  RoutingObserver* routing_observer_ = nullptr;
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
// `host`: with experts streamed into a GPU backend's slots under the RAM tier, a CPU backend that
// computes the experts the GPU's slots do not hold (hybrid experts, docs/gpu.md); the expert
// source must then deliver them for the host (ExpertStore::hybrid). It must outlive the model.
std::unique_ptr<Model> load_model(const ModelDir& dir, Backend& backend, ExpertSource* experts,
                                  Backend* host = nullptr);

}  // namespace redwing
