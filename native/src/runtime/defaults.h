// Every default of the native engine, in one place: what redwing-engine, the decode service and
// the memory plan use when a setting is not given. `redwing-engine defaults --json` prints them
// (defaults_json below), so the TypeScript side can be checked against the same values.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace redwing::defaults {

// ---- engine (load) ----
inline constexpr int64_t kContext = 4096;  // KV cache positions (prompt + generated tokens)
// Prefill chunk: tokens per batched forward call. On the 26B-A4B a chunk of 512 gives each of a
// layer's 128 experts about 32 of its tokens (8 at 128), so the blocked products reuse each
// weight panel 4x more (docs/cpu.md: 1.4-1.6x prefill on the CPU), and a streamed expert is read
// once per 512 prompt tokens instead of once per 128. Its cost is memory (about 0.22 GB more
// working memory and sliding-window rows on the 26B), so under a memory or GPU memory budget,
// where memory buys expert slots, the chunk stays at kBudgetPrefillChunk unless one is asked for.
inline constexpr int64_t kPrefillChunk = 512;
inline constexpr int64_t kBudgetPrefillChunk = 128;
// The chunk a run takes: `asked` when positive (0: not asked), else by whether a budget is set.
constexpr int64_t prefill_chunk(int64_t asked, uint64_t memory_budget, uint64_t vram_budget) {
  if (asked > 0) return asked;
  return memory_budget > 0 || vram_budget > 0 ? kBudgetPrefillChunk : kPrefillChunk;
}
inline constexpr KvDType kKvDtype = KvDType::f16;
// The quantized products' input precision per kind (docs/protocol.md): 8-bit inputs on the
// output head only, where they measured harmless (demo model held-out perplexity -0.07% with f32
// KV, -0.11% with f16), everything else exact float32.
inline constexpr ActivationPlan kActivations = ActivationPlan::int8_on({ProductKind::head});
inline constexpr const char* kBackend = "cpu";  // cpu | metal | vulkan | auto
inline constexpr int kThreads = 0;              // 0: REDWING_THREADS or one per hardware thread
// Expert slots per MoE layer when nothing is asked: 0, every expert read into RAM at load.
inline constexpr int kEngineExpertCacheSlots = 0;
// The slots the front ends (app, CLI, server) ask for on an MoE model unless told otherwise:
// streaming from SSD keeps a 26B MoE within a laptop's memory.
inline constexpr int kExpertCacheSlots = 16;
// The most slots a memory budget picks per layer (never more than the layer's experts).
inline constexpr int kMaxBudgetSlots = 128;
inline constexpr uint64_t kMemoryBudget = 0;  // 0: none
inline constexpr int64_t kPrefixSlack = 0;    // extra sliding-window ring rows for prefix reuse
inline constexpr int kExpertIoThreads = 8;    // expert reads in flight at most
// A GPU's expert misses under the RAM tier (docs/gpu.md, "Hybrid experts"): "copy" copies each
// into a GPU slot and computes it there (the streamed logits equal the resident run's bits);
// "cpu" computes them on the CPU from the host's slots, as llama.cpp's --n-cpu-moe does; "split"
// has the GPU take kGpuExpertCopies of a layer's misses per step over the link (copied from the
// host slots in place, computed there) while the CPU computes the rest. On the H200 (docs/gpu.md,
// "The misses split between the link and the CPU") split with 2 decoded 1.1-1.4x faster than
// cpu at 2 GB of GPU memory, 0.96-1.12x at 4 GB and 1.0-1.3x at 8 GB (two calls), so it is the
// default.
inline constexpr const char* kGpuMisses = "split";
// With "split": the misses per MoE layer and step the GPU copies and computes (2 balanced the
// link's 3.4 MB in ~45 us against the CPU's ~55 us per expert on the H200's 16 cores; 3-4 were
// slower at 2 and 4 GB, a little faster at 8 GB). With "cpu": copies into GPU slots at most, so
// the slots still learn the hot experts while the CPU computes every miss.
inline constexpr int kGpuExpertCopies = 2;
inline constexpr uint64_t kExpertReadPieceBytes = 1 << 20;
// Working memory the plan allows for the executable, its libraries and thread stacks.
inline constexpr uint64_t kProcessAllowanceBytes = 64ull << 20;

// ---- generation ----
inline constexpr int kMaxNewTokens = 1024;  // core/defaults.ts SAMPLING_DEFAULTS.maxNewTokens
inline constexpr int64_t kStatsIntervalMs = 1000;
inline constexpr float kTemperature = 0.2f;
inline constexpr int kTopK = 64;
inline constexpr float kTopP = 0.95f;
inline constexpr float kRepetitionPenalty = 1.0f;
inline constexpr int kRepetitionContext = 20;

// All of the above as one JSON object (snake_case keys, sizes in bytes).
std::string defaults_json();

}  // namespace redwing::defaults
