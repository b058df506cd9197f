// redwing-engine: the native engine's command line.
//
//   redwing-engine logits --model DIR --tokens 2,17,99 [--mode prefill|decode]
//                         [--kv-dtype f16|f32] [--chunk 128] [--threads N]
//       prints {"logits": [[...vocab floats...], ...]}, one row per input position
//   redwing-engine generate --model DIR --tokens 2,17,99 --max-new N [--temperature 0.2]
//                         [--top-k 64] [--top-p 0.95] [--repetition-penalty 1.0] [--seed S]
//                         [--kv-dtype f16|f32] [--chunk 128] [--threads N]
//       prints {"tokens": [...], "stop_reason": "eos"|"length", timings, expert statistics}
//   redwing-engine perplexity --model DIR (--tokens IDS | --tokens-file FILE) [--window 512]
//                         [--stride 256] [--kv-dtype f16|f32] [--chunk 128] [--threads N]
//       prints {"perplexity", "nll_per_token", "tokens", "windows", ...}; log-probabilities are
//       computed in the engine (Engine::score_tokens), no logits leave it
//       [--routing-prediction 4,8,16]: measurement only (runtime/routing_prediction.h): adds
//       "routing_prediction", how well each MoE layer's experts are predicted from earlier
//       residuals and what prefetching them would do to caches of these slots per layer
//   redwing-engine memory --model DIR [--context N] [--expert-cache-slots N] [--kv-dtype ...]
//                         [--memory-budget SIZE] [--chunk N] [--prefix-slack N] [--backend B]
//       prints the memory plan (JSON, runtime/memory_plan.h) before loading anything big: the
//       same figures as the service's plan request for the same settings
//   redwing-engine defaults --json
//       prints every native default (runtime/defaults.h)
//   redwing-engine diskbench --model DIR [--megabytes 1024] [--io-threads 8]
//                         [--read-piece-kib 1024] [--direct-io on|off]
//       cold read throughput of random experts through the expert store's I/O path (benchmarks)
//   logits, generate and perplexity also take the expert streaming flags (kStreamUsage).
//
// Errors go to stderr; the exit status is 2 for bad usage, 1 for any other failure.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "platform/file.h"
#include "platform/memory.h"
#include "runtime/engine.h"
#include "runtime/routing_prediction.h"

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage: redwing-engine logits --model DIR --tokens IDS [--mode prefill|decode]\n"
    "                             [--kv-dtype f16|f32] [--chunk N] [--threads N]\n"
    "       redwing-engine generate --model DIR --tokens IDS --max-new N [--temperature T]\n"
    "                             [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]\n"
    "                             [--kv-dtype f16|f32] [--chunk N] [--threads N]\n"
    "       redwing-engine perplexity --model DIR (--tokens IDS | --tokens-file FILE)\n"
    "                             [--window N] [--stride N] [--kv-dtype f16|f32] [--chunk N]\n"
    "                             [--threads N] [--routing-prediction SLOTS,...]\n"
    "       redwing-engine memory --model DIR [--context N] [--expert-cache-slots N]\n"
    "                             [--memory-budget SIZE] [--vram-budget SIZE]\n"
    "                             [--gpu-expert-slots N]\n"
    "                             [--kv-dtype f16|f32] [--chunk N] [--prefix-slack N]\n"
    "                             [--backend B]\n"
    "       redwing-engine defaults --json\n"
    "       redwing-engine diskbench --model DIR [--megabytes N] [--io-threads N]\n"
    "                             [--read-piece-kib N] [--direct-io on|off]\n"
    "expert streaming (MoE models; logits, generate, perplexity):\n"
    "  --expert-cache-slots N   stream experts from SSD through N slots per layer (0: all in RAM)\n"
    "  --memory-budget SIZE     e.g. 2.5G: pick the slot count that fits (with --context)\n"
    "  --vram-budget SIZE       GPU backends, e.g. 4G: GPU memory for weights, KV cache and\n"
    "                              experts; every expert resident if they fit, else the\n"
    "                              slots per layer that fit, streamed (docs/gpu.md); the\n"
    "                              host keeps every expert it reads (the RAM tier) unless\n"
    "                              --memory-budget or --expert-cache-slots bound it\n"
    "  --gpu-expert-slots N     GPU backends: N expert slots per layer on the GPU, fed from\n"
    "                              the host's slots (fewer: the RAM tier; default: the\n"
    "                              --vram-budget pick, else as many as the host's)\n"
    "  --gpu-misses split|cpu|copy  under the RAM tier: split (the default): N of a layer's\n"
    "                              misses per step copied into GPU slots and computed there,\n"
    "                              the rest on the CPU from the host's slots at the same time;\n"
    "                              cpu: every miss on the CPU; copy: every miss on the GPU\n"
    "  --gpu-expert-copies N    with split: the N of a layer's misses per step the GPU takes;\n"
    "                              with cpu: at most N also copied into GPU slots (default 2)\n"
    "  --context N              context the budget plans for (default 4096)\n"
    "  --expert-cache-policy lrfu|lfu|lru (default lrfu)   --io-threads N (default 8)\n"
    "  --direct-io on|off\n"
    "  --read-piece-kib N       read experts in pieces of N KiB (default 1024; 0: whole)\n"
    "  --backend cpu|metal|vulkan|auto  where the model runs (default cpu; auto: a GPU if\n"
    "                              present; metal: macOS builds only)\n"
    "  --activations exact|int8|KINDS  input precision of the quantized products (default\n"
    "                              exact): int8 quantizes it per 32 values for integer dot\n"
    "                              products (faster on the CPU, approximate; GPU backends stay\n"
    "                              exact); KINDS: int8 only on these, comma-separated, of\n"
    "                              attention, mlp, router, experts, head\n"
    "benchmark only (these change the model's output):\n"
    "  --routing-trace synthetic:reuse=R,seed=S | file:PATH   replace the router's choice\n"
    "  --record-routing FILE    write the routing used, one line per layer and row\n"
    "  --expert-mmap on         map the expert files (page-cache baseline) instead\n";

// Flags every engine-loading command accepts, besides its own.
const std::vector<std::string> kStreamFlags = {
    "expert-cache-slots", "expert-cache-policy", "io-threads",     "direct-io",
    "memory-budget",      "vram-budget",         "context",        "routing-trace",
    "record-routing",     "expert-mmap",         "read-piece-kib", "backend",
    "activations",        "gpu-expert-slots",    "gpu-misses",     "gpu-expert-copies"};
std::vector<std::string> with_stream_flags(std::vector<std::string> names) {
  names.insert(names.end(), kStreamFlags.begin(), kStreamFlags.end());
  return names;
}

// --name value pairs; every name must be one the command knows.
std::map<std::string, std::string> parse_flags(int argc, char** argv, int first,
                                               const std::vector<std::string>& known) {
  std::map<std::string, std::string> out;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument \"" + a + "\"");
    std::string name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) throw UsageError("--" + name + " needs a value");
      value = argv[++i];
    }
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw UsageError("unknown option --" + name);
    out[name] = value;
  }
  return out;
}

template <typename T>
T parse_number(const std::string& s, const std::string& what) {
  const auto invalid = [&] {
    return UsageError("--" + what + ": \"" + s + "\" is not a valid number");
  };
  T v{};
  if constexpr (std::is_floating_point_v<T>) {
    // Not std::from_chars: Apple's libc++ has no floating-point from_chars (the macOS cross
    // build, scripts/macos-cross.mjs, fails on it). strtod in the default "C" locale; what
    // from_chars would reject (leading space or '+', hex) is rejected here too.
    if (s.empty() || s.front() == ' ' || s.front() == '+' ||
        s.find_first_of("xX") != std::string::npos)
      throw invalid();
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(s.c_str(), &end);
    if (errno == ERANGE || end != s.c_str() + s.size()) throw invalid();
    v = static_cast<T>(d);
  } else {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size()) throw invalid();
  }
  return v;
}

std::vector<int32_t> parse_tokens(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string part = s.substr(i, j - i);
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    while (!part.empty() && part.back() == ' ') part.pop_back();
    if (part.empty()) throw UsageError("--tokens: empty token id in \"" + s + "\"");
    int32_t v = parse_number<int32_t>(part, "tokens");
    if (v < 0) throw UsageError("--tokens: negative token id " + part);
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

std::string need(const std::map<std::string, std::string>& f, const std::string& name) {
  auto it = f.find(name);
  if (it == f.end()) throw UsageError("--" + name + " is required");
  return it->second;
}

redwing::EngineOptions engine_options(const std::map<std::string, std::string>& f) {
  redwing::EngineOptions o;
  o.model_dir = need(f, "model");
  if (f.count("threads")) o.threads = parse_number<int>(f.at("threads"), "threads");
  if (f.count("backend")) {
    o.backend = f.at("backend");
    if (o.backend != "cpu" && o.backend != "metal" && o.backend != "vulkan" && o.backend != "auto")
      throw UsageError("--backend must be cpu, metal, vulkan or auto");
  }
  if (f.count("chunk")) {
    o.chunk = parse_number<int64_t>(f.at("chunk"), "chunk");
    if (o.chunk <= 0) throw UsageError("--chunk must be positive");
  }
  if (f.count("kv-dtype")) {
    try {
      o.kv_dtype = redwing::parse_kv_dtype(f.at("kv-dtype"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--kv-dtype: ") + e.what());
    }
  }
  if (f.count("activations")) {
    try {
      o.activations = redwing::parse_activation_plan(f.at("activations"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--activations: ") + e.what());
    }
  }
  if (f.count("expert-cache-slots")) {
    o.expert_cache_slots = parse_number<int>(f.at("expert-cache-slots"), "expert-cache-slots");
    if (o.expert_cache_slots < 0) throw UsageError("--expert-cache-slots must be >= 0");
  }
  if (f.count("gpu-expert-slots")) {
    o.gpu_expert_slots = parse_number<int>(f.at("gpu-expert-slots"), "gpu-expert-slots");
    if (o.gpu_expert_slots < 0) throw UsageError("--gpu-expert-slots must be >= 0");
  }
  if (f.count("gpu-misses")) {
    o.gpu_misses = f.at("gpu-misses");
    if (o.gpu_misses != "copy" && o.gpu_misses != "cpu" && o.gpu_misses != "split")
      throw UsageError("--gpu-misses must be copy, cpu or split");
  }
  if (f.count("gpu-expert-copies")) {
    o.gpu_expert_copies = parse_number<int>(f.at("gpu-expert-copies"), "gpu-expert-copies");
    if (o.gpu_expert_copies < 0) throw UsageError("--gpu-expert-copies must be >= 0");
  }
  if (f.count("expert-cache-policy")) {
    try {
      o.expert_cache_policy = redwing::parse_eviction_policy(f.at("expert-cache-policy"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--expert-cache-policy: ") + e.what());
    }
  }
  if (f.count("read-piece-kib"))
    o.expert_read_piece_bytes =
        parse_number<uint64_t>(f.at("read-piece-kib"), "read-piece-kib") * 1024;
  if (f.count("io-threads")) {
    o.expert_io_threads = parse_number<int>(f.at("io-threads"), "io-threads");
    if (o.expert_io_threads < 1) throw UsageError("--io-threads must be >= 1");
  }
  if (f.count("direct-io")) {
    const std::string& v = f.at("direct-io");
    if (v != "on" && v != "off") throw UsageError("--direct-io must be on or off");
    o.direct_io = v == "on";
  }
  if (f.count("memory-budget")) {
    try {
      o.memory_budget = redwing::parse_byte_size(f.at("memory-budget"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--memory-budget: ") + e.what());
    }
  }
  if (f.count("vram-budget")) {
    try {
      o.vram_budget = redwing::parse_byte_size(f.at("vram-budget"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--vram-budget: ") + e.what());
    }
  }
  if (f.count("expert-mmap")) {
    const std::string& v = f.at("expert-mmap");
    if (v != "on" && v != "off") throw UsageError("--expert-mmap must be on or off");
    o.mmap_experts = v == "on";
  }
  if (f.count("routing-trace")) o.routing_trace = f.at("routing-trace");
  if (f.count("record-routing")) o.record_routing = f.at("record-routing");
  if (f.count("context")) {
    o.context = parse_number<int64_t>(f.at("context"), "context");
    if (o.context <= 0) throw UsageError("--context must be positive");
  }
  if (f.count("prefix-slack")) {
    o.prefix_slack = parse_number<int64_t>(f.at("prefix-slack"), "prefix-slack");
    if (o.prefix_slack < 0) throw UsageError("--prefix-slack must be >= 0");
  }
  return o;
}

// Writes the shortest decimal form that reads back as the same float. JSON has no NaN or
// infinity: those become null (and count as an error, see cmd_logits).
bool put_float(std::string& out, float v) {
  if (!std::isfinite(v)) {
    out += "null";
    return false;
  }
  char buf[32];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, p);
  return true;
}

int cmd_logits(int argc, char** argv) {
  auto f =
      parse_flags(argc, argv, 2,
                  with_stream_flags({"model", "tokens", "mode", "kv-dtype", "chunk", "threads"}));
  auto tokens = parse_tokens(need(f, "tokens"));
  std::string mode = f.count("mode") ? f.at("mode") : "prefill";
  if (mode != "prefill" && mode != "decode") throw UsageError("--mode must be prefill or decode");
  redwing::Engine engine(engine_options(f));
  const auto logits = engine.all_logits(tokens, mode == "decode");
  const size_t vocab = static_cast<size_t>(engine.arch().vocab_size);
  std::string out;
  out.reserve(logits.size() * 12 + 64);
  size_t non_finite = 0;
  out += "{\"logits\": [";
  for (size_t t = 0; t < tokens.size(); ++t) {
    out += t ? ",\n[" : "\n[";
    for (size_t i = 0; i < vocab; ++i) {
      if (i) out += ',';
      if (!put_float(out, logits[t * vocab + i])) ++non_finite;
    }
    out += ']';
  }
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (non_finite > 0) {
    std::fprintf(stderr, "redwing-engine: %zu logits are NaN or infinite (written as null)\n",
                 non_finite);
    return 1;
  }
  return 0;
}

// Token ids from a file: decimal ids separated by commas and/or whitespace.
std::vector<int32_t> read_tokens_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[65536];
  size_t got = 0;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, got);
  std::fclose(f);
  for (char& c : text)
    if (c == '\n' || c == '\r' || c == '\t' || c == ' ') c = ',';
  std::string joined;
  for (size_t i = 0; i < text.size(); ++i)  // collapse runs of separators
    if (text[i] != ',' || (!joined.empty() && joined.back() != ',')) joined += text[i];
  while (!joined.empty() && joined.back() == ',') joined.pop_back();
  if (joined.empty()) throw UsageError("--tokens-file: " + path + " holds no token ids");
  return parse_tokens(joined);
}

int cmd_perplexity(int argc, char** argv) {
  auto f = parse_flags(argc, argv, 2,
                       with_stream_flags({"model", "tokens", "tokens-file", "window", "stride",
                                          "kv-dtype", "chunk", "threads", "routing-prediction"}));
  if (f.count("tokens") == f.count("tokens-file"))
    throw UsageError("give exactly one of --tokens and --tokens-file");
  const auto tokens =
      f.count("tokens") ? parse_tokens(f.at("tokens")) : read_tokens_file(f.at("tokens-file"));
  if (tokens.size() < 2) throw UsageError("perplexity needs at least two tokens");
  const int64_t window = f.count("window") ? parse_number<int64_t>(f.at("window"), "window") : 512;
  const int64_t stride =
      f.count("stride") ? parse_number<int64_t>(f.at("stride"), "stride") : window / 2;
  if (window < 2) throw UsageError("--window must be at least 2");
  if (stride < 1 || stride >= window)
    throw UsageError("--stride must be at least 1 and less than --window");
  std::unique_ptr<redwing::RoutingPredictionReport> prediction;
  if (f.count("routing-prediction")) {
    redwing::RoutingPredictionOptions po;
    po.cache_slots.clear();
    for (int32_t slots : parse_tokens(f.at("routing-prediction"))) {
      if (slots < 1) throw UsageError("--routing-prediction: slot counts must be positive");
      po.cache_slots.push_back(slots);
    }
    if (f.count("expert-cache-policy"))
      po.policy = redwing::parse_eviction_policy(f.at("expert-cache-policy"));
    prediction = std::make_unique<redwing::RoutingPredictionReport>(po);
  }
  redwing::Engine engine(engine_options(f));
  if (prediction) {
    if (!engine.arch().moe) throw UsageError("--routing-prediction needs a MoE model");
    engine.model().set_routing_observer(prediction.get());
  }
  const redwing::TokenScores s = engine.score_tokens(tokens, window, stride);
  const double nll = s.nll_sum / static_cast<double>(s.scored);
  std::printf(
      "{\"perplexity\": %.17g, \"nll_per_token\": %.17g, \"tokens\": %lld, \"windows\": %lld, "
      "\"positions\": %lld, \"window\": %lld, \"stride\": %lld, \"kv_dtype\": \"%s\", "
      "\"activations\": \"%s\", \"seconds\": %.3f, \"tokens_per_second\": %.1f%s}\n",
      std::exp(nll), nll, static_cast<long long>(s.scored), static_cast<long long>(s.windows),
      static_cast<long long>(s.positions), static_cast<long long>(window),
      static_cast<long long>(stride),
      engine.options().kv_dtype == redwing::KvDType::f32 ? "f32" : "f16",
      redwing::activation_plan_name(engine.backend().activations()).c_str(), s.seconds,
      s.seconds > 0 ? static_cast<double>(s.positions) / s.seconds : 0.0,
      prediction ? (", \"routing_prediction\": " + prediction->to_json()).c_str() : "");
  return 0;
}

// What one generated token cost (decode steps; the first entry is the prefill).
struct TokenStats {
  uint64_t expert_hits = 0, expert_misses = 0, bytes_read = 0;
  // Of the hits, those in a GPU slot already; bytes copied into GPU slots (ExpertStats).
  uint64_t gpu_hits = 0, gpu_copy_bytes = 0;
  // Hybrid experts: of the expert uses, those computed on the CPU (ExpertStats::host_computed).
  uint64_t cpu_experts = 0;
  double io_wait_ms = 0;        // waiting for expert reads with nothing else to do
  double compute_ms = 0;        // the rest of the forward pass
  redwing::ForwardParts parts;  // wall time per part (experts include io_wait_ms)
  // A GPU backend's command submissions and kernel dispatches (zero on the CPU).
  uint64_t submissions = 0, dispatches = 0, barriers = 0;
  // The GPU device layer's host time: recording commands, submitting them, waiting for the GPU.
  double record_ms = 0, submit_ms = 0, wait_ms = 0;

  TokenStats& operator+=(const TokenStats& o) {
    expert_hits += o.expert_hits;
    expert_misses += o.expert_misses;
    bytes_read += o.bytes_read;
    gpu_hits += o.gpu_hits;
    gpu_copy_bytes += o.gpu_copy_bytes;
    cpu_experts += o.cpu_experts;
    io_wait_ms += o.io_wait_ms;
    compute_ms += o.compute_ms;
    submissions += o.submissions;
    dispatches += o.dispatches;
    barriers += o.barriers;
    record_ms += o.record_ms;
    submit_ms += o.submit_ms;
    wait_ms += o.wait_ms;
    parts.embed_ms += o.parts.embed_ms;
    parts.attention_ms += o.parts.attention_ms;
    parts.router_ms += o.parts.router_ms;
    parts.dense_mlp_ms += o.parts.dense_mlp_ms;
    parts.experts_ms += o.parts.experts_ms;
    parts.head_ms += o.parts.head_ms;
    parts.host_experts_ms += o.parts.host_experts_ms;
    return *this;
  }
};

// Per forward pass of a generation: expert counters and time, split into I/O wait and the rest,
// measured through the session's on_forward callback. The prefill's chunks add up to entry 0.
class ForwardRecorder {
 public:
  explicit ForwardRecorder(redwing::Engine& engine)
      : engine_(engine),
        experts_before_(engine.expert_stats()),
        parts_before_(engine.model().forward_parts()),
        work_before_(engine.backend().work_counters()) {}

  void record(double seconds, bool prefill) {
    const redwing::ExpertStats now = engine_.expert_stats();
    const redwing::ForwardParts& p = engine_.model().forward_parts();
    const redwing::ForwardParts& b = parts_before_;
    TokenStats s;
    s.parts = {p.embed_ms - b.embed_ms,
               p.attention_ms - b.attention_ms,
               p.router_ms - b.router_ms,
               p.dense_mlp_ms - b.dense_mlp_ms,
               p.experts_ms - b.experts_ms,
               p.head_ms - b.head_ms,
               p.host_experts_ms - b.host_experts_ms};
    s.expert_hits = now.hits - experts_before_.hits;
    s.expert_misses = now.misses - experts_before_.misses;
    s.bytes_read = now.bytes_read - experts_before_.bytes_read;
    s.gpu_hits = now.device_hits - experts_before_.device_hits;
    s.gpu_copy_bytes = now.device_bytes - experts_before_.device_bytes;
    s.cpu_experts = now.host_computed - experts_before_.host_computed;
    s.io_wait_ms = (now.io_wait_seconds - experts_before_.io_wait_seconds) * 1e3;
    s.compute_ms = seconds * 1e3 - s.io_wait_ms;
    const redwing::Backend::WorkCounters work = engine_.backend().work_counters();
    s.submissions = work.submissions - work_before_.submissions;
    s.dispatches = work.dispatches - work_before_.dispatches;
    s.barriers = work.barriers - work_before_.barriers;
    s.record_ms = work.record_ms - work_before_.record_ms;
    s.submit_ms = work.submit_ms - work_before_.submit_ms;
    s.wait_ms = work.wait_ms - work_before_.wait_ms;
    work_before_ = work;
    parts_before_ = p;
    experts_before_ = now;
    if (prefill && !stats_.empty()) {  // another chunk of the prompt
      stats_.back() += s;
    } else {
      stats_.push_back(s);
    }
  }
  const std::vector<TokenStats>& stats() const { return stats_; }

 private:
  redwing::Engine& engine_;
  redwing::ExpertStats experts_before_;
  redwing::ForwardParts parts_before_;
  redwing::Backend::WorkCounters work_before_;
  std::vector<TokenStats> stats_;  // [0] the prefill, then one per decode forward pass
};

// s as the inside of a JSON string (device names are plain text; control characters dropped).
std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

// Expert streaming statistics of a generation: the run's totals, the decode steps' averages
// (the prefill is token_stats[0]) and one entry per forward pass.
std::string expert_stats_json(const redwing::Engine& engine,
                              const std::vector<TokenStats>& token_stats) {
  const redwing::ExpertStats run = engine.expert_stats();
  TokenStats decode;
  size_t steps = 0;
  for (size_t i = 1; i < token_stats.size(); ++i, ++steps) decode += token_stats[i];
  const double n = steps ? static_cast<double>(steps) : 1.0;
  const uint64_t uses = decode.expert_hits + decode.expert_misses;
  const auto share = [](uint64_t part, uint64_t whole) {
    return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  };
  char buf[768];
  std::snprintf(buf, sizeof(buf),
                ", \"expert_cache_slots\": %d, \"gpu_expert_slots\": %d, \"direct_io\": %s, "
                "\"peak_rss_bytes\": %llu, \"device_memory_bytes\": %llu, \"expected_memory\": ",
                engine.expert_cache_slots(), engine.gpu_expert_slots(),
                engine.direct_io() ? "true" : "false",
                static_cast<unsigned long long>(redwing::platform::peak_rss_bytes()),
                static_cast<unsigned long long>(engine.backend().device_memory_bytes()));
  std::string out = buf;
  out += engine.memory_plan().to_json();
  // The tiers (docs/gpu.md): a use is a GPU hit (in a GPU slot), a RAM hit (in a host slot: one
  // copy to the GPU on a GPU backend) or a miss (read from the file, then copied).
  std::snprintf(
      buf, sizeof(buf),
      ", \"hit_rate\": %.4f, \"gpu_hit_rate\": %.4f, \"ram_hit_rate\": %.4f, "
      "\"bytes_read\": %llu, \"gpu_copy_bytes\": %llu, "
      "\"io_wait_ms\": %.3f, \"read_ms\": %.3f, \"decode_hit_rate\": %.4f, "
      "\"decode_gpu_hit_rate\": %.4f, \"decode_ram_hit_rate\": %.4f, "
      "\"decode_bytes_read_per_token\": %.1f, \"decode_gpu_copy_bytes_per_token\": %.1f, "
      "\"decode_io_wait_ms_per_token\": %.3f, \"decode_compute_ms_per_token\": %.3f",
      run.hit_rate(), share(run.device_hits, run.requests), share(run.ram_hits(), run.requests),
      static_cast<unsigned long long>(run.bytes_read),
      static_cast<unsigned long long>(run.device_bytes), run.io_wait_seconds * 1e3,
      run.read_seconds * 1e3, share(decode.expert_hits, uses), share(decode.gpu_hits, uses),
      share(decode.expert_hits - decode.gpu_hits, uses), static_cast<double>(decode.bytes_read) / n,
      static_cast<double>(decode.gpu_copy_bytes) / n, decode.io_wait_ms / n, decode.compute_ms / n);
  out += buf;
  // Hybrid experts (--gpu-misses cpu): the GPU's misses computed on the CPU, and its time.
  std::snprintf(buf, sizeof(buf),
                ", \"gpu_misses\": \"%s\", \"gpu_expert_copies\": %d, \"expert_slots_mapped\": %s, "
                "\"decode_cpu_experts_per_token\": %.3f, \"decode_cpu_expert_ms_per_token\": %.3f",
                engine.gpu_misses().c_str(),
                engine.hybrid_experts() ? engine.options().gpu_expert_copies : -1,
                engine.expert_slots_mapped() ? "true" : "false",
                static_cast<double>(decode.cpu_experts) / n, decode.parts.host_experts_ms / n);
  out += buf;
  // Where a decode step's time goes; experts_ms includes the wait for reads, so the routed
  // experts' compute is experts_ms - io_wait_ms; "other" is norms, residual adds and sampling.
  const auto& p = decode.parts;
  const double other =
      (decode.compute_ms + decode.io_wait_ms) -
      (p.embed_ms + p.attention_ms + p.router_ms + p.dense_mlp_ms + p.experts_ms + p.head_ms);
  std::snprintf(buf, sizeof(buf),
                ", \"decode_parts_ms_per_token\": {\"embed\": %.3f, \"attention\": %.3f, "
                "\"router\": %.3f, \"dense_mlp\": %.3f, \"experts\": %.3f, "
                "\"experts_io_wait\": %.3f, \"experts_cpu\": %.3f, \"head\": %.3f, "
                "\"other\": %.3f}",
                p.embed_ms / n, p.attention_ms / n, p.router_ms / n, p.dense_mlp_ms / n,
                p.experts_ms / n, decode.io_wait_ms / n, p.host_experts_ms / n, p.head_ms / n,
                other / n);
  out += buf;
  out += ", \"token_stats\": [";
  for (size_t i = 0; i < token_stats.size(); ++i) {
    const auto& t = token_stats[i];
    std::snprintf(buf, sizeof(buf),
                  "%s{\"hits\": %llu, \"gpu_hits\": %llu, \"misses\": %llu, "
                  "\"bytes_read\": %llu, \"gpu_copy_bytes\": %llu, \"cpu_experts\": %llu, "
                  "\"cpu_expert_ms\": %.3f, \"io_wait_ms\": %.3f, \"compute_ms\": %.3f}",
                  i ? ", " : "", static_cast<unsigned long long>(t.expert_hits),
                  static_cast<unsigned long long>(t.gpu_hits),
                  static_cast<unsigned long long>(t.expert_misses),
                  static_cast<unsigned long long>(t.bytes_read),
                  static_cast<unsigned long long>(t.gpu_copy_bytes),
                  static_cast<unsigned long long>(t.cpu_experts), t.parts.host_experts_ms,
                  t.io_wait_ms, t.compute_ms);
    out += buf;
  }
  out += "]";
  // A GPU backend's work per step (a submission is a host wait) and, with
  // REDWING_GPU_PROFILE=1, device time per kernel over the whole run.
  const TokenStats none;
  const TokenStats& prefill = token_stats.empty() ? none : token_stats[0];
  std::snprintf(
      buf, sizeof(buf),
      ", \"backend\": \"%s\", \"prefill_submissions\": %llu, "
      "\"prefill_dispatches\": %llu, \"decode_submissions_per_token\": %.3f, "
      "\"decode_dispatches_per_token\": %.3f, \"decode_barriers_per_token\": %.3f, "
      "\"decode_host_ms_per_token\": {\"record\": %.3f, \"submit\": %.3f, \"wait\": %.3f}",
      engine.backend().name().c_str(), static_cast<unsigned long long>(prefill.submissions),
      static_cast<unsigned long long>(prefill.dispatches),
      static_cast<double>(decode.submissions) / n, static_cast<double>(decode.dispatches) / n,
      static_cast<double>(decode.barriers) / n, decode.record_ms / n, decode.submit_ms / n,
      decode.wait_ms / n);
  out += buf;
  // The whole prompt's: the device layer's host time (recording, submitting, waiting for the GPU)
  // and the model's parts as the host timed them (on a GPU: recording, and the waits inside).
  const auto& pp = prefill.parts;
  std::snprintf(buf, sizeof(buf),
                ", \"prefill_host_ms\": {\"record\": %.3f, \"submit\": %.3f, \"wait\": %.3f}"
                ", \"prefill_parts_ms\": {\"embed\": %.3f, \"attention\": %.3f, "
                "\"router\": %.3f, \"dense_mlp\": %.3f, \"experts\": %.3f, \"head\": %.3f}",
                prefill.record_ms, prefill.submit_ms, prefill.wait_ms, pp.embed_ms, pp.attention_ms,
                pp.router_ms, pp.dense_mlp_ms, pp.experts_ms, pp.head_ms);
  out += buf;
  out += ", \"device\": \"" + json_escape(engine.backend().describe()) + "\"";
  out += ", \"kernel_times\": [";
  const auto timings = engine.backend().kernel_timings();
  for (size_t i = 0; i < timings.size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%s{\"kernel\": \"%s\", \"dispatches\": %llu, \"ms\": %.3f}",
                  i ? ", " : "", timings[i].kernel.c_str(),
                  static_cast<unsigned long long>(timings[i].dispatches), timings[i].ms);
    out += buf;
  }
  out += "]";
  return out;
}

int cmd_memory(int argc, char** argv) {
  auto f = parse_flags(argc, argv, 2,
                       {"model", "context", "expert-cache-slots", "memory-budget", "vram-budget",
                        "gpu-expert-slots", "kv-dtype", "chunk", "prefix-slack", "backend"});
  const redwing::EngineOptions o = engine_options(f);
  const auto plan =
      redwing::plan_memory(redwing::ModelDir::open(o.model_dir), redwing::plan_settings(o));
  std::string out = plan.to_json();
  out += "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int cmd_defaults(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[2], "--json") != 0)
    throw UsageError("defaults takes exactly --json");
  const std::string out = redwing::defaults::defaults_json() + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

// Cold read throughput of random whole experts through the engine's own I/O path (the same
// uncached open, piece size and number of reads in flight as the expert store), so that the
// streaming benchmark's disk bound is measured like for like.
int cmd_diskbench(int argc, char** argv) {
  auto f = parse_flags(argc, argv, 2,
                       {"model", "megabytes", "io-threads", "read-piece-kib", "direct-io", "seed"});
  const redwing::ModelDir dir = redwing::ModelDir::open(need(f, "model"));
  const uint64_t total =
      (f.count("megabytes") ? parse_number<uint64_t>(f.at("megabytes"), "megabytes") : 1024) << 20;
  const int threads =
      f.count("io-threads") ? parse_number<int>(f.at("io-threads"), "io-threads") : 8;
  uint64_t piece =
      (f.count("read-piece-kib") ? parse_number<uint64_t>(f.at("read-piece-kib"), "read-piece-kib")
                                 : 1024) *
      1024;
  const bool direct = !f.count("direct-io") || f.at("direct-io") == "on";
  if (threads < 1) throw UsageError("--io-threads must be >= 1");

  struct Layer {
    redwing::platform::ReadFile file;
    uint64_t stride;
    int count;
  };
  std::vector<Layer> layers;
  for (int l = 0; l < dir.arch().num_layers; ++l) {
    const redwing::ExpertLayerInfo* info = dir.expert_layer(l);
    if (info == nullptr) continue;
    const std::string path = dir.file_path(info->file);
    layers.push_back({direct ? redwing::platform::ReadFile::open_uncached(path)
                             : redwing::platform::ReadFile::open(path),
                      info->stride, info->count});
  }
  if (layers.empty()) throw std::runtime_error("the model has no expert files");
  const uint64_t stride = layers.front().stride;
  if (piece == 0 || piece > stride) piece = stride;
  const uint64_t experts = std::max<uint64_t>(1, total / stride);

  std::atomic<uint64_t> next{0};
  std::vector<std::thread> workers;
  const uint64_t seed = f.count("seed") ? parse_number<uint64_t>(f.at("seed"), "seed") : 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto buffer = redwing::platform::allocate_aligned(
          stride, redwing::platform::ReadFile::kDirectIoAlignment);
      std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(t));
      while (next.fetch_add(1) < experts) {
        const Layer& layer = layers[rng() % layers.size()];
        const uint64_t base = (rng() % static_cast<uint64_t>(layer.count)) * layer.stride;
        for (uint64_t at = 0; at < layer.stride; at += piece)
          layer.file.read_exact(buffer.get() + at, std::min(piece, layer.stride - at), base + at);
      }
    });
  }
  for (auto& w : workers) w.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "{\"bytes_per_second\": %.1f, \"experts_read\": %llu, \"expert_bytes\": %llu, "
      "\"io_threads\": %d, \"read_piece_bytes\": %llu, \"direct_io\": %s}\n",
      static_cast<double>(experts * stride) / seconds, static_cast<unsigned long long>(experts),
      static_cast<unsigned long long>(stride), threads, static_cast<unsigned long long>(piece),
      layers.front().file.direct() ? "true" : "false");
  return 0;
}

int cmd_generate(int argc, char** argv) {
  auto f = parse_flags(
      argc, argv, 2,
      with_stream_flags({"model", "tokens", "max-new", "temperature", "top-k", "top-p",
                         "repetition-penalty", "seed", "kv-dtype", "chunk", "threads"}));
  auto tokens = parse_tokens(need(f, "tokens"));
  const int max_new = parse_number<int>(need(f, "max-new"), "max-new");
  if (max_new < 0) throw UsageError("--max-new must be >= 0");
  redwing::SamplerConfig s;
  if (f.count("temperature"))
    s.temperature = parse_number<float>(f.at("temperature"), "temperature");
  if (f.count("top-k")) s.top_k = parse_number<int>(f.at("top-k"), "top-k");
  if (f.count("top-p")) s.top_p = parse_number<float>(f.at("top-p"), "top-p");
  if (f.count("repetition-penalty"))
    s.repetition_penalty = parse_number<float>(f.at("repetition-penalty"), "repetition-penalty");
  s.seed = f.count("seed") ? parse_number<uint64_t>(f.at("seed"), "seed") : std::random_device{}();
  try {
    redwing::Sampler check(s);  // reject bad settings before loading the model
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  redwing::Engine engine(engine_options(f));
  // The decode service's loop (runtime/engine.h Session), in a fresh session for this prompt.
  ForwardRecorder recorder(engine);
  redwing::SessionCallbacks callbacks;
  bool prefilling = true;
  callbacks.on_forward = [&](int64_t, double seconds) { recorder.record(seconds, prefilling); };
  callbacks.on_prefill = [&](int64_t done, int64_t total) { prefilling = done < total; };
  const redwing::SessionResult r = redwing::generate_once(engine, tokens, max_new, s, callbacks);
  std::string out = "{\"tokens\": [";
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(r.tokens[i]);
  }
  out += "], \"stop_reason\": \"" + r.stop_reason + "\"";
  char buf[256];
  const double decode_tps = r.decode_seconds > 0 && r.tokens.size() > 1
                                ? static_cast<double>(r.tokens.size() - 1) / r.decode_seconds
                                : 0.0;
  std::snprintf(buf, sizeof(buf),
                ", \"prompt_tokens\": %zu, \"prefill_seconds\": %.6f, \"decode_seconds\": %.6f, "
                "\"decode_tokens_per_second\": %.3f, \"seed\": %llu",
                tokens.size(), r.prefill_seconds, r.decode_seconds, decode_tps,
                static_cast<unsigned long long>(s.seed));
  out += buf;
  out += expert_stats_json(engine, recorder.stats());
  out += "}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
      std::fputs(kUsage, argc < 2 ? stderr : stdout);
      return argc < 2 ? 2 : 0;
    }
    const std::string cmd = argv[1];
    if (cmd == "logits") return cmd_logits(argc, argv);
    if (cmd == "generate") return cmd_generate(argc, argv);
    if (cmd == "perplexity") return cmd_perplexity(argc, argv);
    if (cmd == "memory") return cmd_memory(argc, argv);
    if (cmd == "defaults") return cmd_defaults(argc, argv);
    if (cmd == "diskbench") return cmd_diskbench(argc, argv);
    throw UsageError("unknown command \"" + cmd + "\"");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "redwing-engine: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "redwing-engine: %s\n", e.what());
    return 1;
  }
}
