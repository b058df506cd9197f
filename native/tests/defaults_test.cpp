// The native defaults live in runtime/defaults.h: what the service fills in for a field a request
// leaves out, what the engine and the sampler start from, and what `redwing-engine defaults
// --json` prints must all be those values (a literal left behind in one of them fails here).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "runtime/defaults.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "service/service.h"

using namespace redwing;
using nlohmann::json;

TEST_CASE("a load or generate request without settings gets runtime/defaults.h") {
  const service::LoadRequest load = service::parse_load(json{{"model", "/m"}});
  CHECK(load.context == defaults::kContext);
  CHECK(load.prefix_slack == defaults::kPrefixSlack);
  const EngineOptions& o = load.options;
  CHECK(o.context == defaults::kContext);
  CHECK(o.chunk == 0);  // the plan picks defaults::prefill_chunk
  CHECK(o.kv_dtype == defaults::kKvDtype);
  CHECK(o.backend == defaults::kBackend);
  CHECK(o.threads == defaults::kThreads);
  CHECK(o.expert_cache_slots == defaults::kEngineExpertCacheSlots);
  CHECK(o.memory_budget == defaults::kMemoryBudget);
  CHECK(o.expert_io_threads == defaults::kExpertIoThreads);
  CHECK(o.expert_read_piece_bytes == defaults::kExpertReadPieceBytes);
  CHECK(o.gpu_misses == defaults::kGpuMisses);
  CHECK(o.gpu_expert_copies == defaults::kGpuExpertCopies);

  const service::GenerateRequest gen = service::parse_generate(json{{"tokens", {2, 3}}});
  CHECK(gen.request.max_new == defaults::kMaxNewTokens);
  CHECK(gen.stats_interval_ms == defaults::kStatsIntervalMs);
  CHECK_FALSE(gen.seed.has_value());
  const SamplerConfig& s = gen.request.sampler;
  CHECK(s.temperature == defaults::kTemperature);
  CHECK(s.top_k == defaults::kTopK);
  CHECK(s.top_p == defaults::kTopP);
  CHECK(s.repetition_penalty == defaults::kRepetitionPenalty);
  CHECK(s.repetition_context == defaults::kRepetitionContext);
}

TEST_CASE("defaults_json prints every default as a front end reads it") {
  const json j = json::parse(defaults::defaults_json());
  CHECK(j.at("context") == defaults::kContext);
  CHECK(j.at("prefill_chunk") == defaults::kPrefillChunk);
  CHECK(j.at("kv_dtype") == "f16");
  CHECK(j.at("backend") == defaults::kBackend);
  CHECK(j.at("threads") == defaults::kThreads);
  CHECK(j.at("expert_cache_slots") == defaults::kExpertCacheSlots);
  CHECK(j.at("engine_expert_cache_slots") == defaults::kEngineExpertCacheSlots);
  CHECK(j.at("max_new_tokens") == defaults::kMaxNewTokens);
  const json& s = j.at("sampling");
  // The decimals as written (0.2, not the float's double 0.20000000298...), equal as floats.
  CHECK(s.at("temperature").dump() == "0.2");
  CHECK(s.at("top_p").dump() == "0.95");
  CHECK(static_cast<float>(s.at("temperature").get<double>()) == defaults::kTemperature);
  CHECK(static_cast<float>(s.at("top_p").get<double>()) == defaults::kTopP);
  CHECK(s.at("top_k") == defaults::kTopK);
  CHECK(s.at("repetition_context") == defaults::kRepetitionContext);
  CHECK(s.at("seed").is_null());
}

TEST_CASE("a load request picks how a GPU's expert misses run (hybrid experts)") {
  const service::LoadRequest hybrid =
      service::parse_load(json{{"model", "/m"}, {"gpu_misses", "cpu"}, {"gpu_expert_copies", 3}});
  CHECK(hybrid.options.gpu_misses == "cpu");
  CHECK(hybrid.options.gpu_expert_copies == 3);
  CHECK(service::parse_load(json{{"model", "/m"}, {"gpu_misses", "split"}}).options.gpu_misses ==
        "split");
  CHECK_THROWS(service::parse_load(json{{"model", "/m"}, {"gpu_misses", "gpu"}}));
  CHECK_THROWS(service::parse_load(json{{"model", "/m"}, {"gpu_expert_copies", -1}}));
}

TEST_CASE("the prefill chunk: the one asked for, else the default, smaller under a budget") {
  CHECK(defaults::kBudgetPrefillChunk < defaults::kPrefillChunk);
  CHECK(defaults::prefill_chunk(0, 0, 0) == defaults::kPrefillChunk);
  CHECK(defaults::prefill_chunk(0, uint64_t{2} << 30, 0) == defaults::kBudgetPrefillChunk);
  CHECK(defaults::prefill_chunk(0, 0, uint64_t{4} << 30) == defaults::kBudgetPrefillChunk);
  CHECK(defaults::prefill_chunk(7, uint64_t{2} << 30, 0) == 7);
  CHECK(defaults::prefill_chunk(1000, 0, 0) == 1000);
}
