#include "runtime/routing_prediction.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>

namespace redwing {

namespace {

Predictor predictor_of(RoutingSource s) {
  switch (s) {
    case RoutingSource::after_attention:
      return Predictor::after_attention;
    case RoutingSource::before_attention:
      return Predictor::before_attention;
    case RoutingSource::own:
      break;
  }
  return Predictor::own;
}

const char* policy_name(EvictionPolicy p) {
  switch (p) {
    case EvictionPolicy::lfu:
      return "lfu";
    case EvictionPolicy::lru:
      return "lru";
    case EvictionPolicy::lrfu:
      break;
  }
  return "lrfu";
}

size_t count_in(const std::vector<int32_t>& truth, const int32_t* ranked, size_t n) {
  size_t c = 0;
  for (int32_t e : truth)
    if (std::find(ranked, ranked + n, e) != ranked + n) ++c;
  return c;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

const char* predictor_name(Predictor p) {
  switch (p) {
    case Predictor::after_attention:
      return "after_attention";
    case Predictor::before_attention:
      return "before_attention";
    case Predictor::own:
      return "own";
    case Predictor::previous_token:
      break;
  }
  return "previous_token";
}

// ---- SimCache ----

RoutingPredictionReport::SimCache::SimCache(int slots, int num_experts,
                                            const RoutingPredictionOptions& options)
    : options_(&options),
      slots_(static_cast<size_t>(slots), -1),
      last_use_(static_cast<size_t>(num_experts), 0),
      uses_(static_cast<size_t>(num_experts), 0),
      crf_at_(static_cast<size_t>(num_experts), 0),
      crf_(static_cast<size_t>(num_experts), 0.0) {}

double RoutingPredictionReport::SimCache::crf_now(int32_t e) const {
  const auto i = static_cast<size_t>(e);
  return crf_[i] *
         std::exp2(-static_cast<double>(requests_ - crf_at_[i]) / options_->lrfu_half_life);
}

int RoutingPredictionReport::SimCache::victim(const std::vector<int32_t>& pinned) const {
  int best = -1;
  for (int s = 0; s < static_cast<int>(slots_.size()); ++s) {
    const int32_t c = slots_[static_cast<size_t>(s)];
    if (c < 0) return s;
    if (std::find(pinned.begin(), pinned.end(), c) != pinned.end()) continue;
    if (best < 0) {
      best = s;
      continue;
    }
    const int32_t b = slots_[static_cast<size_t>(best)];
    const uint64_t lc = last_use_[static_cast<size_t>(c)], lb = last_use_[static_cast<size_t>(b)];
    if (options_->policy == EvictionPolicy::lrfu) {
      const double vc = crf_now(c), vb = crf_now(b);
      if (vc < vb || (vc == vb && lc < lb)) best = s;
    } else if (options_->policy == EvictionPolicy::lfu) {
      const uint64_t uc = uses_[static_cast<size_t>(c)], ub = uses_[static_cast<size_t>(b)];
      if (uc < ub || (uc == ub && lc < lb)) best = s;
    } else if (lc < lb) {
      best = s;
    }
  }
  return best;
}

uint64_t RoutingPredictionReport::SimCache::bring(const std::vector<int32_t>& experts) {
  uint64_t read = 0;
  for (int32_t e : experts) {
    if (std::find(slots_.begin(), slots_.end(), e) != slots_.end()) continue;
    const int s = victim(experts);
    if (s < 0) throw std::logic_error("routing prediction: more experts than simulated slots");
    slots_[static_cast<size_t>(s)] = e;
    last_use_[static_cast<size_t>(e)] = ++tick_;
    ++read;
  }
  return read;
}

uint64_t RoutingPredictionReport::SimCache::prefetch(const std::vector<int32_t>& experts) {
  return bring(experts);
}

uint64_t RoutingPredictionReport::SimCache::request(const std::vector<int32_t>& experts) {
  ++requests_;
  for (int32_t e : experts) {
    const auto i = static_cast<size_t>(e);
    ++uses_[i];
    crf_[i] = crf_now(e) + 1.0;
    crf_at_[i] = requests_;
  }
  const uint64_t misses = bring(experts);
  for (int32_t e : experts) last_use_[static_cast<size_t>(e)] = ++tick_;
  return misses;
}

// ---- the report ----

RoutingPredictionReport::RoutingPredictionReport(RoutingPredictionOptions options)
    : options_(std::move(options)) {
  if (!(options_.lrfu_half_life > 0))
    throw std::invalid_argument("routing prediction: the LRFU half-life must be positive");
  for (int s : options_.cache_slots)
    if (s < 1) throw std::invalid_argument("routing prediction: cache slots must be positive");
}

RoutingPredictionReport::LayerState& RoutingPredictionReport::layer_state(int layer) {
  return layers_[layer];
}

void RoutingPredictionReport::router_logits(int layer, RoutingSource source, int64_t rows,
                                            int num_experts, const float* logits) {
  // Ranked ids per row, best first: the router picks the top-k of its softmax, the same order
  // as the logits (the per-expert scale only weights the chosen ones).
  const auto n = static_cast<size_t>(num_experts);
  std::vector<int32_t>& ranked = layer_state(layer).pending[source];
  ranked.assign(static_cast<size_t>(rows) * n, 0);
  for (int64_t t = 0; t < rows; ++t) {
    int32_t* row = ranked.data() + static_cast<size_t>(t) * n;
    const float* l = logits + static_cast<size_t>(t) * n;
    std::iota(row, row + n, 0);
    std::stable_sort(row, row + n, [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  }
}

void RoutingPredictionReport::routed(int layer, int64_t rows, int top_k, int num_experts,
                                     const int32_t* idx) {
  top_k_ = top_k;
  num_experts_ = num_experts;
  LayerState& st = layer_state(layer);
  const auto k = static_cast<size_t>(top_k);
  const auto n = static_cast<size_t>(num_experts);
  // Evaluated only where an earlier residual gave a prediction (not the first MoE layer).
  const bool evaluated = st.pending.count(RoutingSource::after_attention) > 0 ||
                         st.pending.count(RoutingSource::before_attention) > 0;
  for (const auto& [source, ranked] : st.pending)
    if (ranked.size() != static_cast<size_t>(rows) * n)
      throw std::logic_error("routing prediction: logits and routing disagree on the rows");
  if (evaluated && st.sims.empty()) {
    for (int slots : options_.cache_slots) {
      if (slots < top_k) continue;  // the store needs a request's experts in slots at once
      st.sims.push_back({slots, Predictor::own, 0, SimCache(slots, num_experts, options_), {}});
      for (int p = 0; p < kPredictors; ++p)
        for (int width : {top_k, 2 * top_k})
          st.sims.push_back({slots,
                             static_cast<Predictor>(p),
                             width,
                             SimCache(slots, num_experts, options_),
                             {}});
    }
  }
  std::vector<int32_t> truth(k), prev;
  for (int64_t t = 0; t < rows; ++t) {
    truth.assign(idx + static_cast<size_t>(t) * k, idx + static_cast<size_t>(t + 1) * k);
    if (evaluated) {
      ++st.rows;
      // Each predictor's ranked list for this row (empty: no prediction).
      std::vector<int32_t> ranked[kPredictors];
      for (const auto& [source, r] : st.pending) {
        const int32_t* row = r.data() + static_cast<size_t>(t) * n;
        ranked[static_cast<int>(predictor_of(source))].assign(row, row + std::min(n, 2 * k));
      }
      // The previous token's experts, then the one before's: what a cache already holds.
      prev = st.previous[0];
      for (int32_t e : st.previous[1])
        if (prev.size() < 2 * k && std::find(prev.begin(), prev.end(), e) == prev.end())
          prev.push_back(e);
      ranked[static_cast<int>(Predictor::previous_token)] = prev;
      for (int p = 0; p < kPredictors; ++p) {
        const std::vector<int32_t>& r = ranked[p];
        if (r.empty()) continue;
        Recall& rc = st.recall[p];
        ++rc.rows;
        rc.truth += k;
        rc.in_k += count_in(truth, r.data(), std::min(k, r.size()));
        rc.in_2k += count_in(truth, r.data(), std::min(2 * k, r.size()));
      }
      for (Sim& sim : st.sims) {
        if (sim.width > 0) {
          const std::vector<int32_t>& r = ranked[static_cast<int>(sim.predictor)];
          const size_t w =
              std::min({r.size(), static_cast<size_t>(sim.width), static_cast<size_t>(sim.slots)});
          sim.outcome.prefetch_reads +=
              sim.cache.prefetch(std::vector<int32_t>(r.begin(), r.begin() + w));
        }
        sim.outcome.demand_misses += sim.cache.request(truth);
        ++sim.outcome.rows;
      }
    }
    st.previous[1] = std::move(st.previous[0]);
    st.previous[0] = truth;
  }
  st.pending.clear();
}

RoutingPredictionReport::Recall RoutingPredictionReport::recall(Predictor p, int layer) const {
  Recall sum;
  for (const auto& [l, st] : layers_) {
    if (layer >= 0 && l != layer) continue;
    const Recall& r = st.recall[static_cast<int>(p)];
    sum.rows += r.rows;
    sum.truth += r.truth;
    sum.in_k += r.in_k;
    sum.in_2k += r.in_2k;
  }
  return sum;
}

RoutingPredictionReport::CacheOutcome RoutingPredictionReport::cache(int slots, Predictor p,
                                                                     int width) const {
  CacheOutcome sum;
  for (const auto& [l, st] : layers_)
    for (const Sim& sim : st.sims)
      if (sim.slots == slots && sim.width == width && (width == 0 || sim.predictor == p)) {
        sum.rows += sim.outcome.rows;
        sum.demand_misses += sim.outcome.demand_misses;
        sum.prefetch_reads += sim.outcome.prefetch_reads;
      }
  return sum;
}

RoutingPredictionReport::CacheOutcome RoutingPredictionReport::cache_without_prefetch(
    int slots) const {
  return cache(slots, Predictor::own, 0);
}

uint64_t RoutingPredictionReport::tokens() const {
  for (const auto& [l, st] : layers_)
    if (st.rows > 0) return st.rows;
  return 0;
}

std::string RoutingPredictionReport::to_json() const {
  const double n_tokens = static_cast<double>(std::max<uint64_t>(tokens(), 1));
  std::vector<int> evaluated;
  for (const auto& [l, st] : layers_)
    if (st.rows > 0) evaluated.push_back(l);
  std::string j = "{\"top_k\": " + std::to_string(top_k_) +
                  ", \"num_experts\": " + std::to_string(num_experts_) + ", \"policy\": \"" +
                  policy_name(options_.policy) + "\", \"tokens\": " + std::to_string(tokens()) +
                  ", \"layers\": [";
  for (size_t i = 0; i < evaluated.size(); ++i) j += (i ? ", " : "") + std::to_string(evaluated[i]);
  j += "], \"recall\": {";
  for (int p = 0; p < kPredictors; ++p) {
    const auto pred = static_cast<Predictor>(p);
    const Recall r = recall(pred);
    j += std::string(p ? ", " : "") + "\"" + predictor_name(pred) +
         "\": {\"top_k\": " + number(r.at_k()) + ", \"top_2k\": " + number(r.at_2k()) +
         ", \"per_layer_top_k\": [";
    for (size_t i = 0; i < evaluated.size(); ++i)
      j += (i ? ", " : "") + number(recall(pred, evaluated[i]).at_k());
    j += "]}";
  }
  j += "}, \"cache\": [";
  bool first = true;
  for (int slots : options_.cache_slots) {
    const CacheOutcome base = cache_without_prefetch(slots);
    if (base.rows == 0) continue;
    const double base_misses = static_cast<double>(base.demand_misses);
    j += std::string(first ? "" : ", ") + "{\"slots\": " + std::to_string(slots) +
         ", \"misses_per_token\": " + number(base_misses / n_tokens) + ", \"prefetch\": {";
    first = false;
    for (int p = 0; p < kPredictors; ++p) {
      const auto pred = static_cast<Predictor>(p);
      j += std::string(p ? ", " : "") + "\"" + predictor_name(pred) + "\": {";
      for (int w = 1; w <= 2; ++w) {
        const CacheOutcome c = cache(slots, pred, w * top_k_);
        const double misses = static_cast<double>(c.demand_misses);
        j += std::string(w == 1 ? "" : ", ") + (w == 1 ? "\"top_k\"" : "\"top_2k\"") +
             ": {\"demand_misses_per_token\": " + number(misses / n_tokens) +
             ", \"reads_per_token\": " + number(static_cast<double>(c.reads()) / n_tokens) +
             ", \"misses_avoided\": " +
             number(base_misses > 0 ? (base_misses - misses) / base_misses : 0) +
             ", \"extra_reads_per_token\": " +
             number((static_cast<double>(c.reads()) - base_misses) / n_tokens) + "}";
      }
      j += "}";
    }
    j += "}}";
  }
  j += "]}";
  return j;
}

}  // namespace redwing
