// MEASUREMENT ONLY: does predicting a MoE layer's experts before its router runs pay? (issue 13,
// docs/gpu.md "Predicting the next layer's experts"). A RoutingObserver on the model collects,
// for every MoE layer L+1 and every row (token), the experts the layer really used and the
// router's choice on residuals available earlier (models/model.h RoutingSource), plus the
// previous token's experts of the same layer (what an expert cache already exploits), and
// reports:
//   - recall: the share of the true top-k found in a predictor's top-k and in its top-2k;
//   - what a prefetch of the predicted experts would have bought with an expert cache of S slots
//     per layer (a simulation of the store's policy over the rows in order, as decode would see
//     them): demand misses (reads the layer waits for) and reads in all, against the same cache
//     without prefetch.
// Layers without an earlier source (the first MoE layer) are not evaluated.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/expert_store.h"

namespace redwing {

// The predictors the report compares, in its JSON's order.
enum class Predictor { after_attention, before_attention, own, previous_token };
constexpr int kPredictors = 4;
const char* predictor_name(Predictor p);

struct RoutingPredictionOptions {
  std::vector<int> cache_slots = {4, 8, 16};  // per layer; sizes below top_k are skipped
  EvictionPolicy policy = EvictionPolicy::lrfu;
  double lrfu_half_life = 16;  // as ExpertStoreOptions
};

class RoutingPredictionReport final : public RoutingObserver {
 public:
  explicit RoutingPredictionReport(RoutingPredictionOptions options = {});
  RoutingPredictionReport(const RoutingPredictionReport&) = delete;  // its caches point at options_
  RoutingPredictionReport& operator=(const RoutingPredictionReport&) = delete;
  void router_logits(int layer, RoutingSource source, int64_t rows, int num_experts,
                     const float* logits) override;
  void routed(int layer, int64_t rows, int top_k, int num_experts, const int32_t* idx) override;

  struct Recall {
    uint64_t rows = 0;   // layer-rows this predictor had a prediction for
    uint64_t truth = 0;  // true experts in those rows (rows * top_k)
    uint64_t in_k = 0;   // of which in the predictor's top-k
    uint64_t in_2k = 0;  // of which in its top-2k
    double at_k() const { return truth ? static_cast<double>(in_k) / truth : 0; }
    double at_2k() const { return truth ? static_cast<double>(in_2k) / truth : 0; }
  };
  // Over every evaluated layer (layer -1), or one layer.
  Recall recall(Predictor p, int layer = -1) const;

  struct CacheOutcome {
    uint64_t rows = 0;            // evaluated layer-rows
    uint64_t demand_misses = 0;   // true experts not in the cache when the layer ran
    uint64_t prefetch_reads = 0;  // experts read ahead (prediction not already cached)
    uint64_t reads() const { return demand_misses + prefetch_reads; }
  };
  // The cache of `slots` per layer without prefetch (width 0), or prefetching the predictor's
  // top `width` (capped at the slots) before each layer runs.
  CacheOutcome cache(int slots, Predictor p, int width) const;
  CacheOutcome cache_without_prefetch(int slots) const;

  uint64_t tokens() const;  // rows of the first evaluated layer
  int top_k() const { return top_k_; }
  std::string to_json() const;

 private:
  // One layer's slots under the store's eviction policy (runtime/expert_store.cpp: empty slot
  // first, else the smallest LRFU value / fewest uses / least recent use; the request's experts
  // pinned). A prefetch reads into slots like a request but does not count as a use.
  class SimCache {
   public:
    SimCache(int slots, int num_experts, const RoutingPredictionOptions& options);
    // Reads `experts` ahead; returns how many were read (not already cached).
    uint64_t prefetch(const std::vector<int32_t>& experts);
    // The layer's request; returns its misses.
    uint64_t request(const std::vector<int32_t>& experts);

   private:
    uint64_t bring(const std::vector<int32_t>& experts);  // reads the missing ones
    int victim(const std::vector<int32_t>& pinned) const;
    double crf_now(int32_t e) const;
    const RoutingPredictionOptions* options_;
    std::vector<int32_t> slots_;  // expert per slot, -1 empty
    std::vector<uint64_t> last_use_, uses_, crf_at_;
    std::vector<double> crf_;
    uint64_t requests_ = 0, tick_ = 0;
  };
  struct Sim {  // one cache size, one predictor and width (width 0: no prefetch)
    int slots = 0;
    Predictor predictor = Predictor::own;
    int width = 0;
    SimCache cache;
    CacheOutcome outcome;
  };
  struct LayerState {
    uint64_t rows = 0;  // evaluated rows
    Recall recall[kPredictors];
    // Ranked predictions (top-2k ids per row) from router logits, waiting for routed().
    std::map<RoutingSource, std::vector<int32_t>> pending;
    std::vector<int32_t> previous[2];  // the true experts of the last two rows
    std::vector<Sim> sims;
  };
  LayerState& layer_state(int layer);

  RoutingPredictionOptions options_;
  int top_k_ = 0;
  int num_experts_ = 0;
  std::map<int, LayerState> layers_;
};

}  // namespace redwing
