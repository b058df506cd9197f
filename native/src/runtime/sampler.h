// Token sampling, in mlx-lm's order (mlx_lm/sample_utils.py):
//   1. repetition penalty on the logits over the last `repetition_context` tokens of the
//      sequence (prompt included): a logit l becomes l * penalty if l < 0, else l / penalty;
//   2. temperature 0: argmax (lowest id on ties);
//   3. otherwise top-p over the full distribution p = softmax(logits): tokens are kept from the
//      most probable down while the probability mass strictly above them is < top_p (mlx-lm's
//      "ascending cumulative sum > 1 - top_p"); top_p of 0 or 1 disables it;
//   4. top-k caps the kept tokens at the k most probable (0 disables it);
//   5. a token is drawn from the kept ones with probability proportional to exp(logit / T).
// The random source is xoshiro256** seeded through splitmix64, owned by each Sampler: the same
// seed and inputs give the same tokens on every platform.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "backend/backend.h"
#include "runtime/defaults.h"

namespace redwing {

// The model produced an inf or NaN logit (poisoned weights, or activations that overflowed):
// generation stops with this error instead of sampling a meaningless token.
class NonFiniteLogits : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws NonFiniteLogits naming the first inf or NaN entry of `logits`.
void check_finite_logits(std::span<const float> logits);

struct SamplerConfig {
  float temperature = defaults::kTemperature;
  int top_k = defaults::kTopK;
  float top_p = defaults::kTopP;
  float repetition_penalty = defaults::kRepetitionPenalty;
  int repetition_context = defaults::kRepetitionContext;
  uint64_t seed = 0;
};

// xoshiro256** (Blackman and Vigna), state filled from splitmix64(seed).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t s_[4];
};

struct Candidate {
  int32_t id;
  double prob;  // after temperature, normalized over the kept candidates
};

class Sampler {
 public:
  // Throws std::invalid_argument for out-of-range settings.
  explicit Sampler(const SamplerConfig& config);

  const SamplerConfig& config() const { return config_; }

  // Picks the next token. `logits` (one per vocabulary entry) is modified in place by the
  // repetition penalty; `history` is the sequence so far (prompt and generated tokens).
  // Throws NonFiniteLogits when a logit is inf or NaN.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

  // The same choice from one row of logits held by `backend` (the row is modified in place by
  // the penalty). A backend that samples in place (a GPU) returns only the top candidates, the
  // max and the exp-sum (the rest of the work is then the same as sample()'s on at most top_k
  // candidates); greedy and top_k up to kInPlaceTopK take that path, anything else downloads
  // the row and calls sample(). Throws NonFiniteLogits as sample() does.
  static constexpr int kInPlaceTopK = 64;
  int32_t sample_in_place(Backend& backend, Mat row, std::span<const int32_t> history);

  // Steps 1-5 without the draw: the kept tokens, most probable first, with their final
  // probabilities (temperature must be > 0). Exposed for tests and diagnostics.
  std::vector<Candidate> candidates(std::span<float> logits,
                                    std::span<const int32_t> history) const;

 private:
  void penalize(std::span<float> logits, std::span<const int32_t> history) const;
  // The distinct ids penalize() changes, in the order it first meets them.
  std::vector<int32_t> penalized_ids(std::span<const int32_t> history, size_t vocab) const;
  // Step 5's draw over candidates whose probabilities sum to 1.
  int32_t draw(const std::vector<Candidate>& c);
  SamplerConfig config_;
  Rng rng_;
};

// Index of the largest value; lowest index on ties.
int32_t argmax(std::span<const float> values);

}  // namespace redwing
