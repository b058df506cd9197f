// How much memory a model needs at given settings, before loading it; and the expert cache size
// that fits a memory budget. The one memory plan of the project: redwing-engine memory, the
// engine's budget check, the service's plan request (docs/protocol.md) and through it the app's
// Tuning view and `redwing models` all print these figures.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/backend.h"
#include "format/model_dir.h"
#include "runtime/defaults.h"

namespace redwing {

// Every part listed adds up to total(): nothing is counted that is not shown.
struct MemoryPlan {
  int64_t context = 0;
  int64_t chunk = 0;
  int64_t ring_slack = 0;
  KvDType kv_dtype = defaults::kKvDtype;
  int slots = 0;  // expert slots per MoE layer in host memory; 0: every expert resident
  // A GPU backend's expert slots per MoE layer: `slots` (its slots mirror the host's), fewer (the
  // RAM tier: the host keeps more experts than the GPU, docs/gpu.md), or 0 with `slots` 0
  // (every expert resident). 0 on the CPU.
  int gpu_slots = 0;
  int moe_layers = 0;
  uint64_t expert_stride = 0;      // bytes of one expert (the largest stride)
  uint64_t core_bytes = 0;         // weights.bin: mapped once, every page touched each token
  uint64_t kv_bytes = 0;           // KV cache for `context` positions
  uint64_t expert_bytes = 0;       // slots (streaming) or every expert file (resident)
  uint64_t work_bytes = 0;         // activations, logits, threads and the process itself
  uint64_t all_experts_bytes = 0;  // every expert file, for comparison (not part of the total)
  uint64_t memory_budget = 0;      // the budget planned for; 0: none
  // Why the budget cannot hold the model (even at one slot per layer); empty when it fits.
  std::string over_budget;
  // A GPU backend: its device memory, ESTIMATED as the weights, the experts in its slots (or
  // all), the KV cache and the activations (work_bytes without the process allowance). 0 on the
  // CPU.
  uint64_t device_bytes = 0;
  uint64_t device_expert_bytes = 0;  // of device_bytes: `gpu_slots` experts per layer (or all)
  uint64_t vram_budget = 0;          // the GPU memory budget planned for; 0: none
  uint64_t total() const;            // host bytes; throws SizeOverflow when the sum does not fit
  std::string to_json() const;
};

// The settings a plan depends on (a subset of EngineOptions; the defaults are the engine's).
struct PlanSettings {
  int64_t context = defaults::kContext;
  int expert_cache_slots = defaults::kEngineExpertCacheSlots;  // 0: resident, or budget-picked
  uint64_t memory_budget = defaults::kMemoryBudget;            // 0: none
  KvDType kv_dtype = defaults::kKvDtype;
  int64_t chunk = 0;  // 0: defaults::prefill_chunk (by the budgets); the plan says which
  int64_t ring_slack = defaults::kPrefixSlack;
  bool mmap_experts = false;  // mapped experts: a budget does not pick slots
  bool gpu = false;           // plan the device memory too
  // GPU memory (a GPU backend only; ignored on the CPU; 0: none): core + KV cache + work + the
  // experts must fit. Every expert resident when they do, else the most GPU slots per layer that
  // fit (streamed experts, docs/gpu.md "Expert streaming on the GPU").
  uint64_t vram_budget = 0;
  // The GPU's expert slots per layer (a GPU backend only; 0: picked by vram_budget, else as many
  // as the host's). The host's slots are expert_cache_slots, or memory_budget's pick, or, when
  // the GPU streams and neither is set, every expert (the RAM tier); the GPU never has more.
  int gpu_expert_slots = 0;
};

// The plan for `settings`: on an MoE model with no slots asked for and a budget, the slot count
// comes from slots_for_budget (over_budget says why when even one slot per layer does not fit).
MemoryPlan plan_memory(const ModelDir& dir, const PlanSettings& settings);

// The expected memory of running `dir` with `slots` expert slots per layer (0: resident).
MemoryPlan plan_memory(const ModelDir& dir, int64_t context, int slots, KvDType kv_dtype,
                       int64_t chunk, int64_t ring_slack = 0);

// Even the core, the KV cache and the working memory plus one slot per layer exceed the budget.
struct BudgetTooSmall : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The most expert slots per layer (at most defaults::kMaxBudgetSlots, at most the expert count)
// whose plan fits `budget` bytes. Throws BudgetTooSmall with the numbers when one slot per layer
// does not fit, std::runtime_error when the model has no experts.
int slots_for_budget(const ModelDir& dir, uint64_t budget, int64_t context, KvDType kv_dtype,
                     int64_t chunk, int64_t ring_slack = 0);

// The GPU memory a plan needs (estimated): weights, experts (its GPU slots or all), KV cache and
// the activations (work_bytes without the process allowance).
uint64_t device_bytes_of(const MemoryPlan& p);

// For a GPU memory budget: 0 when every expert fits with the rest (resident), else the most
// slots per layer that fit (at most defaults::kMaxBudgetSlots and the expert count). Throws
// BudgetTooSmall with the numbers when one slot per layer does not fit.
int slots_for_vram_budget(const ModelDir& dir, uint64_t vram_budget, int64_t context,
                          KvDType kv_dtype, int64_t chunk, int64_t ring_slack = 0);

// "2.5G", "800M", "1024K" or plain bytes; throws std::invalid_argument.
uint64_t parse_byte_size(const std::string& s);

}  // namespace redwing
