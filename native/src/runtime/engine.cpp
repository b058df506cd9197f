#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "backend/cpu/cpu_backend.h"

namespace redwing {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Engine::Engine(const EngineOptions& options)
    : options_(options), dir_(ModelDir::open(options.model_dir)) {
  if (options_.chunk <= 0) throw std::invalid_argument("chunk size must be positive");
  backend_ = make_cpu_backend(options_.threads);
  if (dir_.arch().moe) experts_ = std::make_unique<ResidentExpertSource>(dir_);
  model_ = load_model(dir_, *backend_, experts_.get());
}

Engine::~Engine() = default;

KvCache Engine::new_cache(int64_t context) {
  KvCacheOptions o;
  o.context = context;
  o.max_chunk = options_.chunk;
  o.dtype = options_.kv_dtype;
  return KvCache(*backend_, arch(), o);
}

std::vector<float> Engine::all_logits(std::span<const int32_t> tokens, bool decode_mode) {
  if (tokens.empty()) throw std::invalid_argument("no tokens");
  KvCache cache = new_cache(static_cast<int64_t>(tokens.size()));
  std::vector<float> logits;
  logits.reserve(tokens.size() * static_cast<size_t>(arch().vocab_size));
  const size_t step = decode_mode ? 1 : static_cast<size_t>(options_.chunk);
  for (size_t i = 0; i < tokens.size(); i += step) {
    const size_t n = std::min(step, tokens.size() - i);
    model_->forward(tokens.subspan(i, n), cache, LogitsFor::all, logits);
  }
  return logits;
}

GenerateResult Engine::generate(std::span<const int32_t> prompt, int max_new,
                                const SamplerConfig& sampler_config,
                                const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) throw std::invalid_argument("the prompt has no tokens");
  if (max_new < 0) throw std::invalid_argument("max-new must be >= 0");
  GenerateResult result;
  if (max_new == 0) {
    result.stop_reason = "length";
    return result;
  }
  Sampler sampler(sampler_config);
  // The last sampled token is never run through the model, hence the - 1.
  KvCache cache = new_cache(static_cast<int64_t>(prompt.size()) + max_new - 1);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits;

  auto t0 = std::chrono::steady_clock::now();
  const size_t step = static_cast<size_t>(options_.chunk);
  for (size_t i = 0; i < prompt.size(); i += step) {
    const size_t n = std::min(step, prompt.size() - i);
    const bool last = i + n == prompt.size();
    model_->forward(prompt.subspan(i, n), cache, last ? LogitsFor::last : LogitsFor::none, logits);
  }
  result.prefill_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  const auto& eos = arch().eos_token_ids;
  result.stop_reason = "length";
  for (int k = 0; k < max_new; ++k) {
    const int32_t token = sampler.sample(logits, history);
    result.tokens.push_back(token);
    history.push_back(token);
    if (on_token) on_token(token);
    if (std::find(eos.begin(), eos.end(), token) != eos.end()) {
      result.stop_reason = "eos";
      break;
    }
    if (k + 1 == max_new) break;
    logits.clear();
    model_->forward(std::span<const int32_t>(&token, 1), cache, LogitsFor::last, logits);
  }
  result.decode_seconds = seconds_since(t0);
  return result;
}

}  // namespace redwing
