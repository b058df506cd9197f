#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace redwing {

// ---- Rng -------------------------------------------------------------------------------------

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

// ---- Sampler ---------------------------------------------------------------------------------

int32_t argmax(std::span<const float> values) {
  if (values.empty()) throw std::invalid_argument("argmax of an empty vector");
  // The largest value in 8 independent running maxima (a scan that tracks the best index waits
  // on a load and a branch per entry: 1.1 ms over Gemma's 262,144 logits, every token; this is
  // 0.07 ms), then its first index. NaN is never larger, so it is never chosen (0 when every
  // value is NaN).
  constexpr size_t kLanes = 8;
  float top[kLanes];
  std::fill_n(top, kLanes, -std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + kLanes <= values.size(); i += kLanes)
    for (size_t k = 0; k < kLanes; ++k) top[k] = values[i + k] > top[k] ? values[i + k] : top[k];
  float best = top[0];
  for (size_t k = 1; k < kLanes; ++k) best = top[k] > best ? top[k] : best;
  for (; i < values.size(); ++i) best = values[i] > best ? values[i] : best;
  for (size_t j = 0; j < values.size(); ++j)
    if (values[j] == best) return static_cast<int32_t>(j);
  return 0;
}

Sampler::Sampler(const SamplerConfig& config) : config_(config), rng_(config.seed) {
  if (!(config.temperature >= 0.0f) || !std::isfinite(config.temperature))
    throw std::invalid_argument("temperature must be >= 0");
  if (config.top_k < 0) throw std::invalid_argument("top-k must be >= 0");
  if (!(config.top_p >= 0.0f && config.top_p <= 1.0f))
    throw std::invalid_argument("top-p must be in [0, 1]");
  if (!(config.repetition_penalty > 0.0f) || !std::isfinite(config.repetition_penalty))
    throw std::invalid_argument("repetition penalty must be > 0");
  if (config.repetition_context < 0) throw std::invalid_argument("repetition context must be >= 0");
}

std::vector<int32_t> Sampler::penalized_ids(std::span<const int32_t> history, size_t vocab) const {
  std::vector<int32_t> ids;
  if (config_.repetition_penalty == 1.0f || config_.repetition_context == 0) return ids;
  const size_t n = std::min(history.size(), static_cast<size_t>(config_.repetition_context));
  std::unordered_set<int32_t> seen;  // a repeated token is penalized once, as in mlx-lm
  for (size_t i = history.size() - n; i < history.size(); ++i) {
    int32_t t = history[i];
    if (t < 0 || static_cast<size_t>(t) >= vocab || !seen.insert(t).second) continue;
    ids.push_back(t);
  }
  return ids;
}

void Sampler::penalize(std::span<float> logits, std::span<const int32_t> history) const {
  const float penalty = config_.repetition_penalty;
  for (int32_t t : penalized_ids(history, logits.size())) {
    float& l = logits[static_cast<size_t>(t)];
    l = l < 0.0f ? l * penalty : l / penalty;
  }
}

std::vector<Candidate> Sampler::candidates(std::span<float> logits,
                                           std::span<const int32_t> history) const {
  if (logits.empty()) throw std::invalid_argument("no logits to sample from");
  if (!(config_.temperature > 0.0f))
    throw std::invalid_argument("candidates() needs temperature > 0");
  penalize(logits, history);
  const size_t n = logits.size();
  const double max = logits[static_cast<size_t>(argmax(logits))];

  // Probabilities of the full distribution (temperature 1), as top-p sees them.
  double total = 0.0;
  for (float l : logits) total += std::exp(static_cast<double>(l) - max);

  // Order the vocabulary by logit, most probable first (ties: lower id). Only a prefix is
  // needed: top-k bounds it, otherwise grow it until the top-p mass is reached.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  const bool use_top_p = config_.top_p > 0.0f && config_.top_p < 1.0f;
  const bool use_top_k = config_.top_k > 0 && static_cast<size_t>(config_.top_k) < n;
  size_t limit = use_top_k ? static_cast<size_t>(config_.top_k) : n;

  size_t sorted = 0;
  auto sort_prefix = [&](size_t m) {
    m = std::min(m, n);
    if (m > sorted) {
      std::partial_sort(order.begin() + static_cast<std::ptrdiff_t>(sorted),
                        order.begin() + static_cast<std::ptrdiff_t>(m), order.end(), before);
      sorted = m;
    }
  };

  size_t kept = 0;
  double mass_above = 0.0;  // probability of the tokens ranked above the current one
  size_t chunk = use_top_k ? limit : std::min<size_t>(n, 1024);
  while (kept < limit) {
    if (kept == sorted) {
      sort_prefix(std::max(chunk, sorted * 4));
    }
    const int32_t id = order[kept];
    if (use_top_p && mass_above >= config_.top_p) break;
    mass_above += std::exp(static_cast<double>(logits[static_cast<size_t>(id)]) - max) / total;
    ++kept;
  }

  // Temperature on the kept tokens.
  std::vector<Candidate> out(kept);
  const double inv_t = 1.0 / config_.temperature;
  double z = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    const int32_t id = order[i];
    out[i].id = id;
    out[i].prob = std::exp((static_cast<double>(logits[static_cast<size_t>(id)]) - max) * inv_t);
    z += out[i].prob;
  }
  for (Candidate& c : out) c.prob /= z;
  return out;
}

void check_finite_logits(std::span<const float> logits) {
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      throw NonFiniteLogits("the model produced a non-finite logit (" +
                            std::string(std::isnan(logits[i]) ? "NaN" : "inf") + " at entry " +
                            std::to_string(i) +
                            "): its weights or its manifest's scales are broken");
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  check_finite_logits(logits);
  if (config_.temperature == 0.0f) {
    penalize(logits, history);
    return argmax(logits);
  }
  return draw(candidates(logits, history));
}

int32_t Sampler::draw(const std::vector<Candidate>& c) {
  const double u = rng_.uniform();
  double acc = 0.0;
  for (const Candidate& x : c) {
    acc += x.prob;
    if (u < acc) return x.id;
  }
  return c.back().id;  // u within rounding of 1
}

int32_t Sampler::sample_in_place(Backend& backend, Mat row, std::span<const int32_t> history) {
  if (row.rows != 1 || row.cols <= 0) throw std::invalid_argument("no logits to sample from");
  const size_t n = static_cast<size_t>(row.cols);
  const bool greedy = config_.temperature == 0.0f;
  const bool use_top_k = config_.top_k > 0 && static_cast<size_t>(config_.top_k) < n;
  if (!backend.samples_in_place() || (!greedy && (!use_top_k || config_.top_k > kInPlaceTopK))) {
    std::vector<float> logits(n);
    backend.download(*row.buf, static_cast<size_t>(row.offset) * sizeof(float), logits.data(),
                     n * sizeof(float));
    return sample(logits, history);
  }
  const std::vector<int32_t> ids = penalized_ids(history, n);
  if (!ids.empty()) backend.penalize_logits(row, ids, config_.repetition_penalty);
  const Backend::TopLogits top = backend.top_logits(row, greedy ? 1 : config_.top_k);
  if (!top.finite || top.ids.empty()) {
    std::vector<float> logits(n);  // name the first bad entry, as sample() does
    backend.download(*row.buf, static_cast<size_t>(row.offset) * sizeof(float), logits.data(),
                     n * sizeof(float));
    check_finite_logits(logits);
    throw NonFiniteLogits("the model produced a non-finite logit");
  }
  if (greedy) return top.ids[0];
  // candidates()'s steps 3-5 on the top_k most probable, in the same order and arithmetic.
  const bool use_top_p = config_.top_p > 0.0f && config_.top_p < 1.0f;
  const double max = top.max;
  size_t kept = 0;
  double mass_above = 0.0;
  while (kept < top.ids.size()) {
    if (use_top_p && mass_above >= config_.top_p) break;
    mass_above += std::exp(static_cast<double>(top.logits[kept]) - max) / top.exp_sum;
    ++kept;
  }
  std::vector<Candidate> out(kept);
  const double inv_t = 1.0 / config_.temperature;
  double z = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    out[i].id = top.ids[i];
    out[i].prob = std::exp((static_cast<double>(top.logits[i]) - max) * inv_t);
    z += out[i].prob;
  }
  for (Candidate& c : out) c.prob /= z;
  return draw(out);
}

}  // namespace redwing
