// The routing-prediction report (runtime/routing_prediction.h): recall and the simulated cache
// on hand-made routing, and through the model: the layer's own router logits must predict its
// routing exactly, and observing must not change the logits.
#include <doctest/doctest.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "lavapipe.h"
#include "runtime/engine.h"
#include "runtime/routing_prediction.h"
#include "synthetic_model.h"

using namespace redwing;
namespace fs = std::filesystem;

namespace {

// Logits for `rows` rows of `experts` experts: the listed ids of each row first, in order.
std::vector<float> logits_ranking(const std::vector<std::vector<int32_t>>& first, int experts) {
  std::vector<float> l(first.size() * static_cast<size_t>(experts), 0.0f);
  for (size_t t = 0; t < first.size(); ++t)
    for (size_t j = 0; j < first[t].size(); ++j)
      l[t * static_cast<size_t>(experts) + static_cast<size_t>(first[t][j])] =
          10.0f - static_cast<float>(j);
  return l;
}

using test_support::engine_backends;

}  // namespace

TEST_CASE("routing prediction: recall and prefetch on hand-made routing") {
  // 8 experts, top-2, layer 1 over 6 tokens; layer 0 has no earlier source and is not evaluated.
  const int experts = 8;
  const std::vector<std::vector<int32_t>> truth = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2}, {1, 3}};
  // after_attention ranks the true experts first; before_attention ranks them 3rd and 4th.
  std::vector<std::vector<int32_t>> wrong_first;
  for (const auto& t : truth) {
    std::vector<int32_t> r;
    for (int32_t e = 0; e < experts && r.size() < 2; ++e)
      if (e != t[0] && e != t[1]) r.push_back(e);
    r.push_back(t[0]);
    r.push_back(t[1]);
    wrong_first.push_back(r);
  }
  std::vector<int32_t> idx;
  for (const auto& t : truth) idx.insert(idx.end(), t.begin(), t.end());
  const auto rows = static_cast<int64_t>(truth.size());

  RoutingPredictionOptions o;
  o.cache_slots = {1, 2, 4};  // 1 < top_k: not simulated
  o.policy = EvictionPolicy::lru;
  RoutingPredictionReport report(o);
  report.routed(0, rows, 2, experts, idx.data());
  const auto right = logits_ranking(truth, experts);
  const auto wrong = logits_ranking(wrong_first, experts);
  report.router_logits(1, RoutingSource::after_attention, rows, experts, right.data());
  report.router_logits(1, RoutingSource::before_attention, rows, experts, wrong.data());
  report.routed(1, rows, 2, experts, idx.data());

  CHECK(report.tokens() == truth.size());
  CHECK(report.recall(Predictor::after_attention).rows == truth.size());
  CHECK(report.recall(Predictor::after_attention).at_k() == 1.0);
  CHECK(report.recall(Predictor::before_attention).at_k() == 0.0);
  CHECK(report.recall(Predictor::before_attention).at_2k() == 1.0);
  CHECK(report.recall(Predictor::own).rows == 0);  // no own logits given
  // previous_token (the last two rows' experts): rows 1.. have one; no row repeats them.
  CHECK(report.recall(Predictor::previous_token).rows == truth.size() - 1);
  CHECK(report.recall(Predictor::previous_token).in_2k == 0);
  // LRU with 2 slots, no prefetch: every row misses both (no row repeats the last row's pair).
  const auto base = report.cache_without_prefetch(2);
  CHECK(base.rows == truth.size());
  CHECK(base.demand_misses == 12);
  // A perfect prediction turns every miss into a prefetch: no demand misses, no extra reads.
  const auto perfect = report.cache(2, Predictor::after_attention, 2);
  CHECK(perfect.demand_misses == 0);
  CHECK(perfect.reads() == base.demand_misses);
  // An always-wrong one saves nothing and reads two experts for nothing, except in the two
  // rows (1 and 5) whose wrong guess is what the cache already holds.
  const auto useless = report.cache(2, Predictor::before_attention, 2);
  CHECK(useless.demand_misses == base.demand_misses);
  CHECK(useless.prefetch_reads == 8);
  // Its top-2k (4 experts) fits 4 slots and covers the truth.
  CHECK(report.cache(4, Predictor::before_attention, 4).demand_misses == 0);
  CHECK(report.cache_without_prefetch(1).rows == 0);
  const std::string json = report.to_json();
  CHECK(json.find("\"after_attention\": {\"top_k\": 1,") != std::string::npos);
  CHECK(json.find("\"layers\": [1]") != std::string::npos);

  // Logits for other rows than the routing: a caller bug, said so.
  report.router_logits(1, RoutingSource::after_attention, rows - 1, experts, right.data());
  CHECK_THROWS_AS(report.routed(1, rows, 2, experts, idx.data()), std::logic_error);
  CHECK_THROWS_AS(RoutingPredictionReport(RoutingPredictionOptions{{0}}), std::invalid_argument);
}

TEST_CASE("routing prediction: through the model, the layer's own router predicts it exactly") {
  const fs::path dir =
      fs::temp_directory_path() / ("redwing-prediction-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  synth::Writer w(synth::gemma4_moe_spec());  // 4 MoE layers, 8 experts, top-2, random
  w.build();
  w.write(dir);
  std::vector<int32_t> ids;
  for (int i = 0; i < 19; ++i) ids.push_back((i * 37 + 5) % 300);
  for (const std::string& backend : engine_backends()) {
    for (int slots : {0, 2}) {  // resident (a GPU's banked path) and streamed
      const std::string what = backend + ", " + std::to_string(slots) + " slots";
      CAPTURE(what);
      EngineOptions o;
      o.model_dir = dir.string();
      o.backend = backend;
      o.kv_dtype = KvDType::f32;
      o.threads = 2;
      o.chunk = 8;  // three forward calls: the report follows the rows across them
      o.expert_cache_slots = slots;
      Engine e(o);
      const std::vector<float> plain = e.all_logits(ids, false);
      RoutingPredictionReport report;
      e.model().set_routing_observer(&report);
      const std::vector<float> observed = e.all_logits(ids, false);
      e.model().set_routing_observer(nullptr);
      CHECK(observed == plain);
      CHECK(report.tokens() == ids.size());
      const auto own = report.recall(Predictor::own);
      CHECK(own.rows == 3 * ids.size());  // layers 1..3
      CHECK(own.at_k() == 1.0);
      CHECK(own.at_2k() == 1.0);
      // Random weights: the next layer's router on an earlier residual is a weak predictor.
      CHECK(report.recall(Predictor::after_attention).at_k() < 1.0);
      CHECK(report.recall(Predictor::before_attention).at_k() < 1.0);
      CHECK(report.to_json().find("\"layers\": [1, 2, 3]") != std::string::npos);
      // The own predictor is perfect: prefetching it leaves no demand misses.
      CHECK(report.cache(4, Predictor::own, 2).demand_misses == 0);
      CHECK(report.cache_without_prefetch(4).demand_misses > 0);
    }
  }
  fs::remove_all(dir);
}
