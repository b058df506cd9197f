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
#include "models/expert_source.h"
#include "models/kv_cache.h"
#include "models/model.h"
#include "runtime/defaults.h"
#include "runtime/expert_store.h"
#include "runtime/memory_plan.h"
#include "runtime/routing_trace.h"
#include "runtime/sampler.h"

namespace redwing {

// The most compute threads an engine starts (a request for more is an error, not an abort).
inline constexpr int kMaxThreads = 1024;

struct EngineOptions {
  std::string model_dir;
  int threads = defaults::kThreads;          // 0: REDWING_THREADS or the hardware thread count
  std::string backend = defaults::kBackend;  // cpu | metal | vulkan | auto (backend_select.h)
  KvDType kv_dtype = defaults::kKvDtype;
  // The input precision of the quantized products, per kind (backend/backend.h). int8 is
  // approximate and faster on the CPU; backends without an 8-bit path stay exact.
  ActivationPlan activations = defaults::kActivations;
  // Prefill chunk: tokens per batched forward call; 0 lets the plan pick defaults::prefill_chunk
  // (by whether a budget is set), and the engine's options() hold the chunk it took.
  int64_t chunk = 0;
  // Expert streaming (MoE models). 0 slots and no budget: every expert is read into RAM at
  // start. Otherwise experts are streamed from SSD through `expert_cache_slots` slots per layer
  // (runtime/expert_store.h); a memory_budget (bytes) picks the slot count that fits with the KV
  // cache for `context` positions, and the engine refuses to start if even the core does not.
  int expert_cache_slots = defaults::kEngineExpertCacheSlots;
  EvictionPolicy expert_cache_policy = EvictionPolicy::lrfu;
  int expert_io_threads = defaults::kExpertIoThreads;
  uint64_t expert_read_piece_bytes = defaults::kExpertReadPieceBytes;  // ExpertStoreOptions
  bool direct_io = true;      // bypass the page cache for expert reads
  bool mmap_experts = false;  // map the expert files instead (benchmark baseline)
  uint64_t memory_budget = defaults::kMemoryBudget;
  // GPU memory (a GPU backend; 0: none): every expert resident when core, KV cache, activations
  // and all experts fit, else experts streamed through the slots that fit (PlanSettings).
  uint64_t vram_budget = 0;
  // The GPU's own expert slots per layer (a GPU backend; 0: vram_budget's pick, else as many as
  // the host's); fewer than the host's make the host slots a RAM tier (PlanSettings).
  int gpu_expert_slots = 0;
  // Under the RAM tier on a GPU: "copy" (each GPU miss copied into a GPU slot and computed there),
  // "cpu" (hybrid experts: the GPU's misses computed on the CPU from the host's slots with
  // `threads` threads, at most gpu_expert_copies of them per layer and step also copied into GPU
  // slots) or "split" (hybrid experts where the GPU copies and computes gpu_expert_copies of a
  // layer's misses per step and the CPU the rest, at the same time; runtime/expert_store.h,
  // docs/gpu.md). Ignored without the RAM tier.
  std::string gpu_misses = defaults::kGpuMisses;
  int gpu_expert_copies = defaults::kGpuExpertCopies;
  int64_t context = defaults::kContext;           // the context size the memory budget plans for
  int64_t prefix_slack = defaults::kPrefixSlack;  // the session's ring slack, for the plan
  // BENCHMARK ONLY (runtime/routing_trace.h): replace the router's choice of experts with a
  // synthetic or recorded trace, and/or record the routing used. Changes the output.
  std::string routing_trace;
  std::string record_routing;
};

struct TokenScores {
  double nll_sum = 0;     // sum of -log p(token | tokens before it in its window), natural log
  int64_t scored = 0;     // tokens scored (tokens.size() - 1)
  int64_t windows = 0;    // forward passes over a window
  int64_t positions = 0;  // positions run through the model (scored ones plus window overlap)
  double seconds = 0;
};

class Engine {
 public:
  // Opens and checks the model directory, reads the experts and builds the model.
  explicit Engine(const EngineOptions& options);
  ~Engine();

  const Architecture& arch() const { return dir_.arch(); }
  const EngineOptions& options() const { return options_; }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  Model& model() { return *model_; }
  // Expert cache counters since the engine started (all zero when experts are resident); safe
  // to call from another thread while a generation runs.
  ExpertStats expert_stats() const { return experts_ ? experts_->stats() : ExpertStats{}; }
  int expert_cache_slots() const { return store_ ? store_->options().slots : 0; }
  // A GPU backend's expert slots per layer (the plan's gpu_slots): 0 on the CPU or with every
  // expert resident; fewer than expert_cache_slots() under the RAM tier.
  int gpu_expert_slots() const { return plan_.gpu_slots; }
  // Whether a GPU's expert misses are computed on the CPU, all or some (hybrid experts:
  // gpu_misses "cpu" or "split" under the RAM tier).
  bool hybrid_experts() const { return host_backend_ != nullptr; }
  // Where the GPU's misses go: "cpu" or "split" with hybrid experts, else "copy".
  std::string gpu_misses() const { return hybrid_experts() ? options_.gpu_misses : "copy"; }
  // Whether the GPU copies experts into its slots straight from the host slots (mapped, no
  // staging copy on the host: Backend::map_host_memory).
  bool expert_slots_mapped() const { return !host_mappings_.empty(); }
  bool direct_io() const { return store_ && store_->direct_io(); }
  // The expected memory at options().context, computed before loading (the engine refuses to
  // start when a memory budget cannot hold it).
  const MemoryPlan& memory_plan() const { return plan_; }

  // A fresh KV cache for up to `context` positions (the engine's dtype and chunk size).
  KvCache new_cache(int64_t context);

  // Logits [tokens.size(), vocab] for every position. Prefill mode runs chunks of `chunk`
  // tokens with batched products; decode mode runs one token at a time.
  std::vector<float> all_logits(std::span<const int32_t> tokens, bool decode_mode);

  // Scores `tokens` as a language model does for perplexity: every token but the first is
  // predicted from the tokens before it within a window of at most `window` positions; windows
  // start every `stride` tokens (1 <= stride < window, so consecutive windows overlap and every
  // token but the first is scored exactly once, in the first window that holds it and the token
  // before it), with a fresh KV cache per window. Log-probabilities are
  // computed here (log-softmax in double precision), so callers get sums, not logits rows.
  TokenScores score_tokens(std::span<const int32_t> tokens, int64_t window, int64_t stride);

 private:
  EngineOptions options_;
  ModelDir dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ExpertSource> experts_;
  // The expert store's host slots as the GPU backend maps them (Backend::map_host_memory):
  // declared after the store and the backend so that they go first.
  std::vector<std::unique_ptr<Backend::HostMapping>> host_mappings_;
  ExpertStore* store_ = nullptr;  // experts_ when streaming
  MemoryPlan plan_;
  std::unique_ptr<Backend> host_backend_;  // the CPU backend of hybrid experts, else null
  std::unique_ptr<Model> model_;
  std::unique_ptr<RoutingTrace> routing_trace_;  // benchmark only
};

// The memory plan's settings for these engine options (resolving backend "auto").
PlanSettings plan_settings(const EngineOptions& options);

// ---- sessions: one sequence kept between generations ----------------------------------------

// The one generation loop (Session::generate) serves the decode service and redwing-engine.
struct SessionRequest {
  std::vector<int32_t> prompt;
  int max_new = defaults::kMaxNewTokens;
  SamplerConfig sampler;
  std::vector<int32_t> stop_ids;  // tokens that end generation (reason "stop"), besides EOS
  bool ignore_eos = false;        // EOS tokens do not end generation (benchmarks, tests)
};

struct SessionCallbacks {
  std::function<void(int32_t)> on_token;
  // Polled between prefill chunks and between tokens; true stops with reason "cancelled".
  std::function<bool()> cancelled;
  // Called after each prefill chunk: positions of the prompt prefilled so far, and the total.
  std::function<void(int64_t, int64_t)> on_prefill;
  // Called after every forward pass (prefill chunk or decode step) with the positions it ran
  // and its wall time: benchmarks attribute expert traffic and time per token with it.
  std::function<void(int64_t, double)> on_forward;
};

struct SessionResult {
  std::vector<int32_t> tokens;  // generated tokens; a final EOS or stop token is included
  std::string stop_reason;      // "eos", "stop", "length" (max_new or the context is full),
                                // "cancelled"
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;   // prompt positions reused from the previous sequence
  int64_t prefill_tokens = 0;  // prompt positions run through the model
  double prefill_seconds = 0;
  double ttft_seconds = 0;  // from the call to the first sampled token
  double decode_seconds = 0;
};

// A KV cache of fixed context size plus the tokens it holds, reused across generate() calls: a
// new prompt that shares a prefix with the held sequence prefills only the rest.
//
// Reuse rule (the simplest correct one): r = the longest common prefix of the held tokens and
// the prompt, capped at prompt.size() - 1 (the last prompt token is always run, its logits pick
// the first new token). If the cache can continue at r (KvCache::can_truncate: every sliding
// layer's ring still holds the window before r), positions >= r are dropped and prefill starts
// at r; otherwise the whole prompt is recomputed. Keys computed by decode steps are reused as
// they are: they equal what a batched prefill would compute up to float rounding.
class Session {
 public:
  // `ring_slack`: extra rows for the sliding layers' rings (KvCacheOptions::ring_slack), so a
  // prompt can back up that many more positions and still reuse its prefix.
  Session(Engine& engine, int64_t context, int64_t ring_slack = 0);

  int64_t context() const { return cache_.options().context; }
  // The tokens whose keys and values the cache holds, position by position.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  uint64_t kv_bytes() const { return cache_.bytes(); }
  // Prompt positions the next generate() would reuse.
  int64_t reusable_prefix(std::span<const int32_t> prompt) const;
  void reset();

  // Throws std::invalid_argument (empty prompt, bad settings) and ContextOverflow (the prompt
  // does not fit the context). Generation that reaches the context size stops with "length".
  SessionResult generate(const SessionRequest& request, const SessionCallbacks& callbacks = {});

 private:
  Engine& engine_;
  KvCache cache_;
  std::vector<int32_t> tokens_;
};

// One generation in a fresh session just large enough for the prompt and max_new tokens (the
// last sampled token is never run): what a one-shot tool or test wants.
SessionResult generate_once(Engine& engine, const SessionRequest& request,
                            const SessionCallbacks& callbacks = {});
// The same for a prompt, a token limit and sampling settings (EOS ends it; no stop tokens).
SessionResult generate_once(Engine& engine, std::vector<int32_t> prompt, int max_new,
                            const SamplerConfig& sampler, const SessionCallbacks& callbacks = {});

}  // namespace redwing
