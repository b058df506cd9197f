// The engine: a model directory loaded onto a backend, with the prefill, decode and generation
// loops the tools and the service run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/model_dir.h"
#include "models/model.h"
#include "runtime/expert_source.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"

namespace redwing {

struct EngineOptions {
  std::string model_dir;
  int threads = 0;  // 0: REDWING_THREADS or the hardware thread count
  KvDType kv_dtype = KvDType::f16;
  int64_t chunk = 128;  // prefill chunk: tokens per batched forward call
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated tokens; a final end-of-sequence token is included
  std::string stop_reason;      // "eos" or "length"
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

class Engine {
 public:
  // Opens and checks the model directory, reads the experts and builds the model.
  explicit Engine(const EngineOptions& options);
  ~Engine();

  const Architecture& arch() const { return dir_.arch(); }
  const EngineOptions& options() const { return options_; }
  Backend& backend() { return *backend_; }
  Model& model() { return *model_; }

  // A fresh KV cache for up to `context` positions (the engine's dtype and chunk size).
  KvCache new_cache(int64_t context);

  // Logits [tokens.size(), vocab] for every position. Prefill mode runs chunks of `chunk`
  // tokens with batched products; decode mode runs one token at a time.
  std::vector<float> all_logits(std::span<const int32_t> tokens, bool decode_mode);

  // Prefills `prompt` in chunks, then samples up to max_new tokens one at a time, stopping after
  // an end-of-sequence token (the manifest's eos_token_ids). on_token sees each new token.
  GenerateResult generate(std::span<const int32_t> prompt, int max_new,
                          const SamplerConfig& sampler,
                          const std::function<void(int32_t)>& on_token = {});

 private:
  EngineOptions options_;
  ModelDir dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ExpertSource> experts_;
  std::unique_ptr<Model> model_;
};

}  // namespace redwing
