// How much memory a model needs at a given context size and expert cache size, before loading
// it; and the expert cache size that fits a memory budget.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "format/model_dir.h"

namespace redwing {

struct MemoryPlan {
  int64_t context = 0;
  int slots = 0;  // expert slots per MoE layer; 0: every expert resident
  int moe_layers = 0;
  uint64_t expert_stride = 0;      // bytes of one expert (the largest stride)
  uint64_t core_bytes = 0;         // weights.bin: mapped once, every page touched each token
  uint64_t kv_bytes = 0;           // KV cache for `context` positions
  uint64_t expert_bytes = 0;       // slots (streaming) or every expert file (resident)
  uint64_t work_bytes = 0;         // activations, logits, threads and the process itself
  uint64_t all_experts_bytes = 0;  // every expert file, for comparison
  uint64_t total() const;          // throws SizeOverflow when the sum does not fit
  std::string to_json() const;
};

// The expected memory of running `dir` with `slots` expert slots per layer (0: resident).
MemoryPlan plan_memory(const ModelDir& dir, int64_t context, int slots, KvDType kv_dtype,
                       int64_t chunk);

// The most expert slots per layer (at most 128, at most the expert count) whose plan fits
// `budget` bytes. Throws std::runtime_error with the numbers when even the core, the KV cache and
// the working memory plus one slot per layer do not fit.
int slots_for_budget(const ModelDir& dir, uint64_t budget, int64_t context, KvDType kv_dtype,
                     int64_t chunk);

// "2.5G", "800M", "1024K" or plain bytes; throws std::invalid_argument.
uint64_t parse_byte_size(const std::string& s);

}  // namespace redwing
