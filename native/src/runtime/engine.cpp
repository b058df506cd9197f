#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "backend/backend_select.h"

namespace redwing {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

PlanSettings plan_settings(const EngineOptions& o) {
  PlanSettings s;
  s.context = o.context;
  s.expert_cache_slots = o.expert_cache_slots;
  s.memory_budget = o.memory_budget;
  s.vram_budget = o.vram_budget;
  s.gpu_expert_slots = o.gpu_expert_slots;
  s.kv_dtype = o.kv_dtype;
  s.chunk = o.chunk;
  s.ring_slack = o.prefix_slack;
  s.mmap_experts = o.mmap_experts;
  // "auto" is resolved as make_backend resolves it; a device name that is not there leaves
  // the CPU plan (make_backend then says why).
  try {
    s.gpu = o.backend != "cpu" && resolve_backend(o.backend) != "cpu";
  } catch (const std::exception&) {
    s.gpu = false;
  }
  return s;
}

Engine::Engine(const EngineOptions& options)
    : options_(options), dir_(ModelDir::open(options.model_dir)) {
  if (options_.threads < 0 || options_.threads > kMaxThreads)
    throw std::invalid_argument("threads must be in [0, " + std::to_string(kMaxThreads) +
                                "] (0: one per hardware thread), not " +
                                std::to_string(options_.threads));
  if (options_.expert_io_threads < 1 || options_.expert_io_threads > kMaxThreads)
    throw std::invalid_argument("expert I/O threads must be in [1, " + std::to_string(kMaxThreads) +
                                "], not " + std::to_string(options_.expert_io_threads));
  if (options_.expert_cache_slots < 0)
    throw std::invalid_argument("expert cache slots must be >= 0");
  if (options_.gpu_expert_slots < 0) throw std::invalid_argument("GPU expert slots must be >= 0");
  if (options_.gpu_misses != "copy" && options_.gpu_misses != "cpu" &&
      options_.gpu_misses != "split")
    throw std::invalid_argument("GPU misses must be copy, cpu or split, not \"" +
                                options_.gpu_misses + "\"");
  if (options_.gpu_expert_copies < 0) throw std::invalid_argument("GPU expert copies must be >= 0");
  const bool moe = dir_.arch().moe.has_value();
  if (options_.mmap_experts && options_.expert_cache_slots > 0)
    throw std::invalid_argument("mapped experts and expert cache slots exclude each other");
  // Planned before the backend starts: a budget that cannot hold the model is refused at once.
  plan_ = plan_memory(dir_, plan_settings(options_));
  if (!plan_.over_budget.empty())
    throw std::runtime_error(plan_.over_budget + " (" + plan_.to_json() + ")");
  options_.expert_cache_slots = plan_.slots;  // the budget's pick, if it made one
  options_.chunk = plan_.chunk;               // the default's pick, if none was asked for
  const int slots = plan_.slots;
  // The resident weights (all but the experts) are read at load, as the experts are: otherwise
  // the first prompt's prefill reads them page by page (1.35 GB on the 26B-A4B, from the disk
  // when the page cache has dropped them).
  dir_.load_weights();
  backend_ = make_backend(options_.backend, options_.threads);
  backend_->set_activations(options_.activations);
  if (moe && slots > 0) {
    ExpertStoreOptions so;
    so.slots = slots;
    // The GPU's slots, when fewer: the host's slots are then the RAM tier above them.
    so.device_slots = plan_.gpu_slots < slots ? plan_.gpu_slots : 0;
    so.policy = options_.expert_cache_policy;
    so.io_threads = options_.expert_io_threads;
    so.read_piece_bytes = options_.expert_read_piece_bytes;
    so.direct_io = options_.direct_io;
    // Hybrid experts: the RAM tier on a backend with expert slots, its misses on the CPU (all of
    // them, or with "split" all but the few the GPU copies and computes).
    const bool hybrid =
        options_.gpu_misses != "copy" && so.device_slots > 0 && backend_->supports_expert_slots();
    if (hybrid) {
      so.device_copies = options_.gpu_expert_copies;
      so.device_computes_copies = options_.gpu_misses == "split";
      host_backend_ = make_backend("cpu", options_.threads);
      host_backend_->set_activations(options_.activations);
    }
    auto store = std::make_unique<ExpertStore>(dir_, so);
    // Slots a GPU mirrors are filled from the host slots: mapped, the GPU copies them in place
    // (only where no request refills a host slot, ExpertStore::host_blocks).
    if (backend_->supports_expert_slots() && store->slots_hold_every_expert())
      for (std::span<const std::byte> block : store->host_blocks())
        if (auto mapping = backend_->map_host_memory(block))
          host_mappings_.push_back(std::move(mapping));
    store_ = store.get();
    experts_ = std::move(store);
  } else if (moe && options_.mmap_experts) {
    experts_ = std::make_unique<MappedExpertSource>(dir_);
  } else if (moe) {
    experts_ = std::make_unique<ResidentExpertSource>(dir_, backend_.get());
  }
  model_ = load_model(dir_, *backend_, experts_.get(), host_backend_.get());
  if (!options_.routing_trace.empty() || !options_.record_routing.empty()) {
    routing_trace_ =
        std::make_unique<RoutingTrace>(options_.routing_trace, options_.record_routing);
    model_->set_routing_hook(routing_trace_.get());
  }
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

TokenScores Engine::score_tokens(std::span<const int32_t> tokens, int64_t window, int64_t stride) {
  if (tokens.size() < 2) throw std::invalid_argument("scoring needs at least two tokens");
  if (window < 2) throw std::invalid_argument("the window must hold at least two tokens");
  if (stride < 1 || stride >= window)
    throw std::invalid_argument("the stride must be at least 1 and less than the window");
  const auto t0 = std::chrono::steady_clock::now();
  const auto n = static_cast<int64_t>(tokens.size());
  const auto vocab = static_cast<size_t>(arch().vocab_size);
  for (int32_t id : tokens)
    if (id < 0 || static_cast<size_t>(id) >= vocab)
      throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
  TokenScores result;
  std::vector<float> logits;
  int64_t scored_until = 1;  // tokens before this one are scored (token 0 never is)
  for (int64_t begin = 0;; begin += stride) {
    const int64_t end = std::min(begin + window, n);
    KvCache cache = new_cache(end - begin);
    // Run the window in chunks; a chunk's logits row r predicts the token after position r.
    for (int64_t at = begin; at < end; at += options_.chunk) {
      const int64_t len = std::min<int64_t>(options_.chunk, end - at);
      logits.clear();
      model_->forward(tokens.subspan(static_cast<size_t>(at), static_cast<size_t>(len)), cache,
                      LogitsFor::all, logits);
      for (int64_t r = 0; r < len; ++r) {
        const int64_t target = at + r + 1;
        if (target < scored_until || target >= end) continue;
        const float* row = logits.data() + static_cast<size_t>(r) * vocab;
        const auto id = static_cast<size_t>(tokens[static_cast<size_t>(target)]);
        double top = row[0];
        for (size_t i = 1; i < vocab; ++i) top = std::max(top, static_cast<double>(row[i]));
        double sum = 0;
        for (size_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - top);
        const double nll = top + std::log(sum) - static_cast<double>(row[id]);
        if (!std::isfinite(nll)) throw std::runtime_error("a log-probability is not finite");
        result.nll_sum += nll;
        ++result.scored;
      }
    }
    result.positions += end - begin;
    ++result.windows;
    scored_until = end;
    if (end == n) break;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

// ---- Session --------------------------------------------------------------------------------

namespace {
KvCacheOptions session_cache_options(const Engine& engine, int64_t context, int64_t ring_slack) {
  KvCacheOptions o;
  o.context = context;
  o.max_chunk = engine.options().chunk;
  o.dtype = engine.options().kv_dtype;
  o.ring_slack = ring_slack;
  return o;
}
}  // namespace

Session::Session(Engine& engine, int64_t context, int64_t ring_slack)
    : engine_(engine),
      cache_(engine.backend(), engine.arch(), session_cache_options(engine, context, ring_slack)) {}

void Session::reset() {
  cache_.clear();
  tokens_.clear();
}

int64_t Session::reusable_prefix(std::span<const int32_t> prompt) const {
  if (prompt.empty()) return 0;
  const size_t limit = std::min(tokens_.size(), prompt.size() - 1);
  size_t r = 0;
  while (r < limit && tokens_[r] == prompt[r]) ++r;
  const int64_t n = static_cast<int64_t>(r);
  return cache_.can_truncate(n) ? n : 0;
}

SessionResult Session::generate(const SessionRequest& request, const SessionCallbacks& cb) {
  const auto& prompt = request.prompt;
  if (prompt.empty()) throw std::invalid_argument("the prompt has no tokens");
  if (request.max_new < 0) throw std::invalid_argument("max_new_tokens must be >= 0");
  const int64_t vocab = engine_.arch().vocab_size;
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" +
                                  std::to_string(vocab) + " entries)");
  if (static_cast<int64_t>(prompt.size()) > context())
    throw ContextOverflow("the prompt has " + std::to_string(prompt.size()) +
                          " tokens, more than the context size " + std::to_string(context()));
  Sampler sampler(request.sampler);
  const auto is_cancelled = [&] { return cb.cancelled && cb.cancelled(); };

  SessionResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t reuse = reusable_prefix(prompt);
  cache_.truncate(reuse);
  tokens_.resize(static_cast<size_t>(reuse));
  result.cached_tokens = reuse;
  if (request.max_new == 0) {
    result.stop_reason = "length";
    return result;
  }

  std::vector<float> logits;
  // A GPU samples where the logits are: only the top candidates come back, not the whole row.
  const bool in_place = engine_.backend().samples_in_place();
  const LogitsFor last_logits = in_place ? LogitsFor::last_kept : LogitsFor::last;
  const size_t step = static_cast<size_t>(engine_.options().chunk);
  for (size_t i = static_cast<size_t>(reuse); i < prompt.size(); i += step) {
    if (is_cancelled()) {
      result.stop_reason = "cancelled";
      result.prefill_seconds = seconds_since(t_start);
      return result;
    }
    const size_t n = std::min(step, prompt.size() - i);
    const bool last = i + n == prompt.size();
    const auto t_forward = std::chrono::steady_clock::now();
    engine_.model().forward(std::span<const int32_t>(prompt).subspan(i, n), cache_,
                            last ? last_logits : LogitsFor::none, logits);
    if (cb.on_forward) cb.on_forward(static_cast<int64_t>(n), seconds_since(t_forward));
    tokens_.insert(tokens_.end(), prompt.begin() + static_cast<std::ptrdiff_t>(i),
                   prompt.begin() + static_cast<std::ptrdiff_t>(i + n));
    result.prefill_tokens += static_cast<int64_t>(n);
    if (cb.on_prefill) cb.on_prefill(static_cast<int64_t>(i + n), result.prompt_tokens);
  }
  result.prefill_seconds = seconds_since(t_start);

  const auto t_decode = std::chrono::steady_clock::now();
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  const auto& eos = engine_.arch().eos_token_ids;
  const auto& stop = request.stop_ids;
  result.stop_reason = "length";
  for (int k = 0; k < request.max_new; ++k) {
    if (is_cancelled()) {
      result.stop_reason = "cancelled";
      break;
    }
    const int32_t token = in_place ? sampler.sample_in_place(engine_.backend(),
                                                             engine_.model().kept_logits(), history)
                                   : sampler.sample(logits, history);
    if (k == 0) result.ttft_seconds = seconds_since(t_start);
    result.tokens.push_back(token);
    history.push_back(token);
    if (cb.on_token) cb.on_token(token);
    if (!request.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
      result.stop_reason = "eos";
      break;
    }
    if (std::find(stop.begin(), stop.end(), token) != stop.end()) {
      result.stop_reason = "stop";
      break;
    }
    // The context is full: the sampled token cannot be run, so the sequence ends here.
    if (k + 1 == request.max_new || cache_.length() >= context()) break;
    logits.clear();
    const auto t_forward = std::chrono::steady_clock::now();
    engine_.model().forward(std::span<const int32_t>(&token, 1), cache_, last_logits, logits);
    if (cb.on_forward) cb.on_forward(1, seconds_since(t_forward));
    tokens_.push_back(token);
  }
  result.decode_seconds = seconds_since(t_decode);
  return result;
}

SessionResult generate_once(Engine& engine, const SessionRequest& request,
                            const SessionCallbacks& callbacks) {
  if (request.max_new < 0) throw std::invalid_argument("max_new_tokens must be >= 0");
  const int64_t context =
      std::max<int64_t>(1, static_cast<int64_t>(request.prompt.size()) + request.max_new - 1);
  Session session(engine, context);
  return session.generate(request, callbacks);
}

SessionResult generate_once(Engine& engine, std::vector<int32_t> prompt, int max_new,
                            const SamplerConfig& sampler, const SessionCallbacks& callbacks) {
  SessionRequest request;
  request.prompt = std::move(prompt);
  request.max_new = max_new;
  request.sampler = sampler;
  return generate_once(engine, request, callbacks);
}

}  // namespace redwing
