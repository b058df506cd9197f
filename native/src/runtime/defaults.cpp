#include "runtime/defaults.h"

#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>

namespace redwing::defaults {
namespace {

// The double that prints as the float's shortest decimal form (0.2f as 0.2, not as the double
// nearest the float, 0.20000000298...): what the default was written as, and what a front end
// holds.
double as_written(float v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf) - 1, v);
  *end = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

std::string defaults_json() {
  nlohmann::ordered_json j;
  j["context"] = kContext;
  j["prefill_chunk"] = kPrefillChunk;
  j["budget_prefill_chunk"] = kBudgetPrefillChunk;
  j["kv_dtype"] = kKvDtype == KvDType::f16 ? "f16" : "f32";
  j["backend"] = kBackend;
  j["activations"] = activation_plan_name(kActivations);
  j["threads"] = kThreads;
  j["expert_cache_slots"] = kExpertCacheSlots;
  j["engine_expert_cache_slots"] = kEngineExpertCacheSlots;
  j["max_budget_slots"] = kMaxBudgetSlots;
  j["memory_budget_bytes"] = kMemoryBudget;
  j["prefix_slack"] = kPrefixSlack;
  j["expert_io_threads"] = kExpertIoThreads;
  j["expert_read_piece_bytes"] = kExpertReadPieceBytes;
  j["gpu_misses"] = kGpuMisses;
  j["gpu_expert_copies"] = kGpuExpertCopies;
  j["process_allowance_bytes"] = kProcessAllowanceBytes;
  j["max_new_tokens"] = kMaxNewTokens;
  j["stats_interval_ms"] = kStatsIntervalMs;
  j["sampling"] = {{"temperature", as_written(kTemperature)},
                   {"top_k", kTopK},
                   {"top_p", as_written(kTopP)},
                   {"repetition_penalty", as_written(kRepetitionPenalty)},
                   {"repetition_context", kRepetitionContext},
                   {"seed", nullptr}};  // none: a random seed per generation
  return j.dump(1);
}

}  // namespace redwing::defaults
