#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "format/checked.h"
#include "models/kv_cache.h"
#include "platform/file.h"

namespace redwing {
namespace {

// The experts `slots` per MoE layer hold (0: every expert file).
uint64_t experts_bytes_at(const ModelDir& dir, int slots) {
  uint64_t bytes = 0;
  for (int i = 0; i < dir.arch().num_layers; ++i) {
    const ExpertLayerInfo* info = dir.expert_layer(i);
    if (info == nullptr) continue;
    const auto n = slots > 0 ? static_cast<uint64_t>(slots) : static_cast<uint64_t>(info->count);
    bytes = checked::add(bytes, checked::mul(n, info->stride, "expert bytes"), "expert bytes");
  }
  return bytes;
}

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

MemoryPlan plan_memory(const ModelDir& dir, int64_t context, int slots, KvDType kv_dtype,
                       int64_t chunk, int64_t ring_slack) {
  if (context <= 0) throw std::invalid_argument("context size must be positive");
  if (chunk <= 0) throw std::invalid_argument("chunk size must be positive");
  if (ring_slack < 0) throw std::invalid_argument("prefix slack must be >= 0");
  if (slots < 0) throw std::invalid_argument("expert cache slots must be >= 0");
  const Architecture& arch = dir.arch();
  MemoryPlan p;
  p.context = context;
  p.chunk = chunk;
  p.ring_slack = ring_slack;
  p.kv_dtype = kv_dtype;
  p.slots = arch.moe ? slots : 0;
  slots = p.slots;
  p.core_bytes = platform::file_size(dir.file_path("weights.bin"));

  KvCacheOptions kv;
  kv.context = context;
  kv.max_chunk = chunk;
  kv.ring_slack = ring_slack;
  const uint64_t elem = kv_dtype == KvDType::f16 ? 2 : 4;
  // Every size below comes from the manifest or the request: computed with checked
  // arithmetic, so a size that does not fit is an error naming it, never a wrapped value.
  using checked::add;
  using checked::mul;
  int64_t max_q = 0, max_kv = 0;
  for (const LayerConfig& l : arch.layers) {
    const uint64_t per_row = mul(mul(static_cast<uint64_t>(l.num_kv_heads),
                                     static_cast<uint64_t>(l.head_dim), "KV cache row"),
                                 elem, "KV cache row");
    p.kv_bytes = add(
        p.kv_bytes,
        mul(2 * checked::size(kv_rows_needed(l, kv), "KV cache rows"), per_row, "KV cache bytes"),
        "KV cache bytes");
    max_q = std::max<int64_t>(max_q, int64_t{arch.num_attention_heads} * l.head_dim);
    max_kv = std::max<int64_t>(max_kv, int64_t{l.num_kv_heads} * l.head_dim);
  }

  for (int i = 0; i < arch.num_layers; ++i) {
    const ExpertLayerInfo* info = dir.expert_layer(i);
    if (info == nullptr) continue;
    ++p.moe_layers;
    p.expert_stride = std::max(p.expert_stride, info->stride);
  }
  p.all_experts_bytes = experts_bytes_at(dir, 0);
  p.expert_bytes = experts_bytes_at(dir, slots);
  p.gpu_slots = slots;  // a GPU mirroring the host's slots; plan_memory(settings) says otherwise
  p.device_expert_bytes = p.expert_bytes;

  // Scratch activations (float32) of one prefill chunk: the residual and its norms, attention
  // projections, MLP intermediates, the router and every routed row; then the logits of one
  // row, and a fixed allowance for the executable, libraries and thread stacks.
  const uint64_t hidden = checked::size(arch.hidden_size, "hidden_size");
  const uint64_t top_k = arch.moe ? static_cast<uint64_t>(arch.moe->top_k) : 0;
  const uint64_t moe_inter =
      arch.moe ? checked::size(arch.moe->intermediate_size, "moe.intermediate_size") : 0;
  const uint64_t experts = arch.moe ? static_cast<uint64_t>(arch.moe->num_experts) : 0;
  const uint64_t inter =
      std::max(checked::size(arch.intermediate_size, "intermediate_size"), moe_inter);
  const char* what = "working memory per row";
  uint64_t per_row = mul(hidden, add(8, mul(2, top_k, what), what), what);
  per_row = add(per_row, mul(2, checked::size(max_q, what), what), what);
  per_row = add(per_row, mul(2, checked::size(max_kv, what), what), what);
  per_row = add(per_row, add(mul(2, inter, what), experts, what), what);
  const uint64_t logits = mul(checked::size(arch.vocab_size, "vocab_size"), 8, "logits bytes");
  p.work_bytes = add(
      add(mul(mul(checked::size(chunk, "chunk"), per_row, "working memory"), 4, "working memory"),
          logits, "working memory"),
      defaults::kProcessAllowanceBytes, "working memory");
  return p;
}

MemoryPlan plan_memory(const ModelDir& dir, const PlanSettings& s) {
  const bool moe = dir.arch().moe.has_value();
  if (s.gpu_expert_slots < 0) throw std::invalid_argument("GPU expert slots must be >= 0");
  int slots = moe ? s.expert_cache_slots : 0;
  int gpu_slots = moe && s.gpu ? s.gpu_expert_slots : 0;  // 0: not asked for
  if (gpu_slots > 0 && s.mmap_experts)
    throw std::invalid_argument("mapped experts and GPU expert slots exclude each other");
  if (gpu_slots > 0 && slots > 0 && gpu_slots > slots)
    throw std::invalid_argument("GPU expert slots (" + std::to_string(gpu_slots) +
                                ") cannot outnumber the expert cache slots (" +
                                std::to_string(slots) + "): the GPU's are filled from the host's");
  if (s.chunk < 0) throw std::invalid_argument("chunk size must be positive");
  const int64_t chunk =
      defaults::prefill_chunk(s.chunk, s.memory_budget, s.gpu ? s.vram_budget : 0);
  std::string over_budget;
  const bool pick = moe && slots == 0 && !s.mmap_experts;
  if (s.memory_budget > 0 && pick) {
    try {
      slots = slots_for_budget(dir, s.memory_budget, s.context, s.kv_dtype, chunk, s.ring_slack);
    } catch (const BudgetTooSmall& e) {
      slots = 1;  // the plan then shows what the smallest cache would take
      over_budget = e.what();
    }
  }
  const bool vram = s.gpu && s.vram_budget > 0;
  if (vram && moe && !s.mmap_experts && gpu_slots == 0 && over_budget.empty()) {
    try {
      // 0: every expert fits the GPU.
      gpu_slots =
          slots_for_vram_budget(dir, s.vram_budget, s.context, s.kv_dtype, chunk, s.ring_slack);
    } catch (const BudgetTooSmall& e) {
      gpu_slots = 1;
      over_budget = e.what();
    }
  }
  // The GPU streams and nothing limits the host: every expert stays in RAM once read (the RAM
  // tier); a host with fewer slots than the GPU's pick bounds the GPU's (it is filled from them).
  if (gpu_slots > 0 && slots == 0 && !s.mmap_experts) slots = dir.arch().moe->num_experts;
  if (s.gpu && slots > 0 && (gpu_slots == 0 || gpu_slots > slots)) gpu_slots = slots;
  MemoryPlan p = plan_memory(dir, s.context, slots, s.kv_dtype, chunk, s.ring_slack);
  p.memory_budget = s.memory_budget;
  if (over_budget.empty() && s.memory_budget > 0 && p.total() > s.memory_budget)
    over_budget = "memory budget of " + mib(s.memory_budget) + " cannot hold the model: it needs " +
                  mib(p.total());
  p.gpu_slots = s.gpu ? gpu_slots : 0;
  p.device_expert_bytes = s.gpu ? experts_bytes_at(dir, gpu_slots) : 0;
  if (s.gpu) p.device_bytes = device_bytes_of(p);
  if (vram) {
    p.vram_budget = s.vram_budget;
    if (over_budget.empty() && p.device_bytes > s.vram_budget)
      over_budget = "GPU memory budget of " + mib(s.vram_budget) +
                    " cannot hold the model: it needs " + mib(p.device_bytes);
  }
  p.over_budget = over_budget;
  return p;
}

uint64_t device_bytes_of(const MemoryPlan& p) {
  return checked::add(
      checked::add(checked::add(p.core_bytes, p.device_expert_bytes, "device memory"), p.kv_bytes,
                   "device memory"),
      p.work_bytes - defaults::kProcessAllowanceBytes, "device memory");
}

int slots_for_vram_budget(const ModelDir& dir, uint64_t vram_budget, int64_t context,
                          KvDType kv_dtype, int64_t chunk, int64_t ring_slack) {
  if (device_bytes_of(plan_memory(dir, context, 0, kv_dtype, chunk, ring_slack)) <= vram_budget)
    return 0;
  const MemoryPlan base = plan_memory(dir, context, 1, kv_dtype, chunk, ring_slack);
  const uint64_t need = device_bytes_of(base);
  if (base.moe_layers == 0 || need > vram_budget)
    throw BudgetTooSmall("GPU memory budget " + mib(vram_budget) + " cannot hold the model: core " +
                         mib(base.core_bytes) + " + KV cache " + mib(base.kv_bytes) +
                         " at context " + std::to_string(context) + " + activations " +
                         mib(base.work_bytes - defaults::kProcessAllowanceBytes) +
                         " + one expert slot per layer " + mib(base.expert_bytes) + " = " +
                         mib(need));
  const uint64_t per_slot = base.expert_bytes;  // one slot in every MoE layer
  const int max_slots = std::min(defaults::kMaxBudgetSlots, dir.arch().moe->num_experts);
  return static_cast<int>(std::clamp<uint64_t>(1 + (vram_budget - need) / per_slot, 1,
                                               static_cast<uint64_t>(max_slots)));
}

int slots_for_budget(const ModelDir& dir, uint64_t budget, int64_t context, KvDType kv_dtype,
                     int64_t chunk, int64_t ring_slack) {
  const MemoryPlan base = plan_memory(dir, context, 1, kv_dtype, chunk, ring_slack);
  if (base.moe_layers == 0)
    throw std::runtime_error(dir.path() +
                             " has no expert files: a memory budget needs an MoE model");
  if (base.total() > budget)
    throw BudgetTooSmall("memory budget " + mib(budget) + " cannot hold the model: core " +
                         mib(base.core_bytes) + " + KV cache " + mib(base.kv_bytes) +
                         " at context " + std::to_string(context) + " + working memory " +
                         mib(base.work_bytes) + " + one expert slot per layer " +
                         mib(base.expert_bytes) + " = " + mib(base.total()));
  const uint64_t per_slot = base.expert_bytes;  // one slot in every MoE layer
  const uint64_t spare = budget - (base.total() - per_slot);
  const int max_slots =
      std::min(defaults::kMaxBudgetSlots,
               dir.arch().moe ? dir.arch().moe->num_experts : defaults::kMaxBudgetSlots);
  return static_cast<int>(
      std::clamp<uint64_t>(spare / per_slot, 1, static_cast<uint64_t>(max_slots)));
}

uint64_t parse_byte_size(const std::string& s) {
  if (s.empty()) throw std::invalid_argument("empty size");
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("\"" + s + "\" is not a size (e.g. 2G, 1500M)");
  }
  std::string unit = s.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && (unit.back() == 'i')) unit.pop_back();
  double mult = 1;
  if (unit.empty())
    mult = 1;
  else if (unit == "K" || unit == "k")
    mult = 1024.0;
  else if (unit == "M" || unit == "m")
    mult = 1024.0 * 1024.0;
  else if (unit == "G" || unit == "g")
    mult = 1024.0 * 1024.0 * 1024.0;
  else
    throw std::invalid_argument("\"" + s + "\" is not a size (e.g. 2G, 1500M)");
  if (!(v > 0)) throw std::invalid_argument("size must be positive: \"" + s + "\"");
  return static_cast<uint64_t>(v * mult);
}

uint64_t MemoryPlan::total() const {
  using checked::add;
  return add(add(add(core_bytes, kv_bytes, "memory plan"), expert_bytes, "memory plan"), work_bytes,
             "memory plan");
}

std::string MemoryPlan::to_json() const {
  nlohmann::ordered_json j;
  j["context"] = context;
  j["chunk"] = chunk;
  j["prefix_slack"] = ring_slack;
  j["kv_dtype"] = kv_dtype == KvDType::f16 ? "f16" : "f32";
  j["slots"] = slots;
  j["gpu_slots"] = gpu_slots;
  j["moe_layers"] = moe_layers;
  j["expert_bytes_each"] = expert_stride;
  // The parts of the total, each listed: weights, KV cache, experts, working memory.
  j["core_bytes"] = core_bytes;
  j["kv_bytes"] = kv_bytes;
  j["expert_bytes"] = expert_bytes;
  j["work_bytes"] = work_bytes;
  j["total_bytes"] = total();
  j["all_experts_bytes"] = all_experts_bytes;
  j["memory_budget"] = memory_budget;
  j["over_budget"] =
      over_budget.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(over_budget);
  j["device_bytes"] = device_bytes;
  j["device_expert_bytes"] = device_expert_bytes;
  j["vram_budget"] = vram_budget;
  return j.dump();
}

}  // namespace redwing
