#include "service/service.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>

#include "backend/backend_select.h"
#include "backend/cpu/kernels.h"
#include "platform/memory.h"

namespace redwing::service {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The backends this machine has (backend/backend_select.h), looked up once: enumerating Vulkan
// devices loads drivers. hello lists the names and the devices; load accepts a name or "auto".
const std::vector<BackendInfo>& machine_backends() {
  static const std::vector<BackendInfo> all = available_backends();
  return all;
}

json backend_names() {
  json names = json::array();
  for (const auto& b : machine_backends())
    if (std::find(names.begin(), names.end(), b.name) == names.end()) names.push_back(b.name);
  return names;
}

json backend_devices() {
  json out = json::array();
  for (const auto& b : machine_backends())
    out.push_back({{"backend", b.name},
                   {"name", b.device},
                   {"memory_bytes", b.memory_bytes},
                   {"discrete", b.discrete},
                   {"software", b.software}});
  return out;
}

// A value as it appears in an error message: JSON, cut short (a request may be 64 MiB).
std::string short_dump(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 64 ? s.substr(0, 60) + "..." : s;
}

// Typed field access with protocol errors that name the field.
[[noreturn]] void bad_field(const std::string& name, const std::string& what) {
  throw ProtocolError("bad_request", "field \"" + name + "\" " + what);
}

bool boolean_field(const json& obj, const char* name, bool fallback) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad_field(name, "must be true or false");
  return it->get<bool>();
}

std::string string_field(const json& obj, const char* name, const std::string& fallback) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) bad_field(name, "must be a string");
  std::string v = it->get<std::string>();
  // A NUL would cut a path short at the system call: refuse it rather than open another file.
  if (v.find('\0') != std::string::npos) bad_field(name, "contains a NUL character");
  return v;
}

// An integer within [lo, hi]; anything else (a float, a string, a value that does not fit the
// C++ type it goes into) is a bad_request naming the field, never a silently truncated value.
int64_t integer_field(const json& obj, const std::string& name, int64_t fallback, int64_t lo,
                      int64_t hi, const char* note = "") {
  auto it = obj.find(name.substr(name.find('.') + 1));
  if (it == obj.end() || it->is_null()) return fallback;
  const bool ok = (it->is_number_unsigned() && it->get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                   static_cast<int64_t>(it->get<uint64_t>()) >= lo) ||
                  (it->is_number_integer() && !it->is_number_unsigned() &&
                   it->get<int64_t>() >= lo && it->get<int64_t>() <= hi);
  if (!ok)
    bad_field(name, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "]" + note + ", not " + short_dump(*it));
  return it->is_number_unsigned() ? static_cast<int64_t>(it->get<uint64_t>()) : it->get<int64_t>();
}

// A finite number within [lo, hi] (or (lo, hi] when lo_open), as a float.
float number_field(const json& obj, const std::string& name, float fallback, double lo, double hi,
                   bool lo_open = false) {
  auto it = obj.find(name.substr(name.find('.') + 1));
  if (it == obj.end() || it->is_null()) return fallback;
  const double v = it->is_number() ? it->get<double>() : std::nan("");
  if (!(lo_open ? v > lo : v >= lo) || !(v <= hi))
    bad_field(name, std::string("must be a number in ") + (lo_open ? "(" : "[") + json(lo).dump() +
                        ", " + json(hi).dump() + "], not " + short_dump(*it));
  return static_cast<float>(v);
}

std::vector<int32_t> token_list(const json& obj, const char* name, bool required) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) {
    if (required)
      throw ProtocolError("bad_request", std::string("field \"") + name + "\" is required");
    return {};
  }
  if (!it->is_array())
    throw ProtocolError("bad_request", std::string("field \"") + name + "\" must be an array");
  std::vector<int32_t> out;
  out.reserve(it->size());
  for (const json& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      throw ProtocolError("bad_request",
                          std::string("field \"") + name + "\" must hold non-negative token ids");
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return out;
}

uint64_t directory_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

Request parse_request(const std::string& line) {
  Request out;
  json msg;
  try {
    msg = json::parse(line);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw ProtocolError("bad_json", std::string("the message is not valid JSON: ") + e.what());
  }
  if (!msg.is_object()) throw ProtocolError("bad_request", "a message must be a JSON object");
  if (auto it = msg.find("id"); it != msg.end()) {
    if (!it->is_string() && !it->is_number_integer())
      throw ProtocolError("bad_request", "\"id\" must be a string or an integer");
    out.id = *it;
  }
  auto type_it = msg.find("type");
  if (type_it == msg.end() || !type_it->is_string())
    throw ProtocolError("bad_request", "the message has no \"type\" string");
  out.type = type_it->get<std::string>();
  try {
    if (out.type == "load" || out.type == "plan") parse_load(msg);
    if (out.type == "generate") parse_generate(msg);
    if (out.type == "hello") integer_field(msg, "protocol", kProtocolVersion, 0, INT32_MAX);
    if (out.type == "cancel") {
      const json target = msg.contains("target") ? msg["target"] : json(nullptr);
      if (!target.is_string() && !target.is_number_integer())
        throw ProtocolError("bad_request", "cancel needs a \"target\": the id of a generate");
    }
  } catch (ProtocolError& e) {
    e.id = out.id;  // the error event answers this request
    throw;
  }
  out.message = std::move(msg);
  return out;
}

LoadRequest parse_load(const json& req) {
  LoadRequest l;
  l.model = string_field(req, "model", "");
  if (l.model.empty())
    throw ProtocolError("bad_request", "load and plan need \"model\": a model directory");
  EngineOptions& o = l.options;  // its defaults are runtime/defaults.h's
  o.backend = string_field(req, "backend", o.backend);
  l.context = integer_field(req, "context", o.context, 1, INT32_MAX);
  o.model_dir = l.model;
  o.threads = static_cast<int>(
      integer_field(req, "threads", o.threads, 0, kMaxThreads, " (0: one per hardware thread)"));
  o.chunk = integer_field(req, "chunk", o.chunk, 1, INT32_MAX);
  try {
    o.kv_dtype =
        parse_kv_dtype(string_field(req, "kv_dtype", o.kv_dtype == KvDType::f16 ? "f16" : "f32"));
  } catch (const std::invalid_argument& e) {
    throw ProtocolError("bad_request", std::string("field \"kv_dtype\": ") + e.what());
  }
  try {
    o.activations = parse_activation_plan(
        string_field(req, "activations", activation_plan_name(defaults::kActivations)));
  } catch (const std::invalid_argument& e) {
    throw ProtocolError("bad_request", std::string("field \"activations\": ") + e.what());
  }
  // SSD expert streaming: slots per MoE layer (0: every expert resident), or a memory budget in
  // bytes that the engine turns into a slot count for this context.
  o.expert_cache_slots = static_cast<int>(
      integer_field(req, "expert_cache_slots", o.expert_cache_slots, 0, INT32_MAX));
  o.memory_budget = static_cast<uint64_t>(
      integer_field(req, "memory_budget", static_cast<int64_t>(o.memory_budget), 0, INT64_MAX));
  // GPU backends: device memory for weights, KV cache and experts (resident if all fit, else
  // the slots that fit, streamed).
  o.vram_budget = static_cast<uint64_t>(
      integer_field(req, "vram_budget", static_cast<int64_t>(o.vram_budget), 0, INT64_MAX));
  // GPU backends: the GPU's expert slots per layer (0: the vram_budget pick, else the host's);
  // fewer than the host's slots make those a RAM tier (docs/gpu.md).
  o.gpu_expert_slots =
      static_cast<int>(integer_field(req, "gpu_expert_slots", o.gpu_expert_slots, 0, INT32_MAX));
  // Under the RAM tier: "copy" each GPU miss into a GPU slot, compute it on the "cpu" (hybrid
  // experts) with at most gpu_expert_copies copies per layer and step, or "split" them: the GPU
  // takes gpu_expert_copies of a layer's misses per step, the CPU the rest (docs/gpu.md).
  o.gpu_misses = string_field(req, "gpu_misses", o.gpu_misses);
  if (o.gpu_misses != "copy" && o.gpu_misses != "cpu" && o.gpu_misses != "split")
    throw ProtocolError("bad_request",
                        "field \"gpu_misses\" must be \"copy\", \"cpu\" or \"split\"");
  o.gpu_expert_copies =
      static_cast<int>(integer_field(req, "gpu_expert_copies", o.gpu_expert_copies, 0, INT32_MAX));
  o.context = l.context;
  l.prefix_slack = integer_field(req, "prefix_slack", o.prefix_slack, 0, INT32_MAX);
  o.prefix_slack = l.prefix_slack;
  return l;
}

GenerateRequest parse_generate(const json& req) {
  GenerateRequest g;
  SessionRequest& r = g.request;
  r.prompt = token_list(req, "tokens", true);
  if (r.prompt.empty()) throw ProtocolError("bad_request", "\"tokens\" is empty");
  r.stop_ids = token_list(req, "stop_token_ids", false);
  r.max_new = static_cast<int>(integer_field(req, "max_new_tokens", r.max_new, 0, INT32_MAX));
  r.ignore_eos = boolean_field(req, "ignore_eos", false);
  g.stream = boolean_field(req, "stream", true);
  g.stats_interval_ms =
      integer_field(req, "stats_interval_ms", defaults::kStatsIntervalMs, 0, INT32_MAX);
  json sampling = req.contains("sampling") ? req["sampling"] : json::object();
  if (sampling.is_null()) sampling = json::object();
  if (!sampling.is_object()) throw ProtocolError("bad_request", "\"sampling\" must be an object");
  SamplerConfig& c = r.sampler;
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  c.temperature = number_field(sampling, "sampling.temperature", c.temperature, 0, kFloatMax);
  c.top_k = static_cast<int>(
      integer_field(sampling, "sampling.top_k", c.top_k, 0, INT32_MAX, " (0: no top-k)"));
  c.top_p = number_field(sampling, "sampling.top_p", c.top_p, 0, 1);
  c.repetition_penalty = number_field(sampling, "sampling.repetition_penalty", c.repetition_penalty,
                                      0, kFloatMax, true);
  c.repetition_context = static_cast<int>(
      integer_field(sampling, "sampling.repetition_context", c.repetition_context, 0, INT32_MAX));
  if (auto it = sampling.find("seed"); it != sampling.end() && !it->is_null()) {
    if (!it->is_number_unsigned())
      throw ProtocolError("bad_request", "\"sampling.seed\" must be a non-negative integer");
    g.seed = it->get<uint64_t>();
  }
  return g;
}

Service::Service(std::function<void(const std::string&)> write_line)
    : write_line_(std::move(write_line)) {
  worker_ = std::thread([this] { worker_loop(); });
}

Service::~Service() { stop(); }

void Service::stop() {
  {
    std::lock_guard lock(jobs_mutex_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    cancel_running_ = true;
  }
  jobs_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Service::emit(const json& event) {
  // Invalid UTF-8 in a message (e.g. a path) is replaced rather than throwing.
  const std::string line = event.dump(-1, ' ', false, json::error_handler_t::replace);
  std::lock_guard lock(out_mutex_);
  write_line_(line);
}

void Service::error(const json& id, const std::string& code, const std::string& message) {
  std::fprintf(stderr, "redwing-service: error %s: %s\n", code.c_str(), message.c_str());
  emit({{"type", "error"}, {"id", id}, {"code", code}, {"message", message}});
}

json Service::stats_event(const json& id) {
  json e = {{"type", "stats"}, {"id", id}};
  {
    std::lock_guard lock(stats_mutex_);
    e["model"] = has_model_ ? json(model_dir_) : json(nullptr);
    e["generating"] = stats_.generating;
    e["generations"] = stats_.generations;
    e["prompt_tokens"] = stats_.prompt_tokens;
    e["cached_tokens"] = stats_.cached_tokens;
    e["prefill_tokens"] = stats_.prefill_tokens;
    e["generated_tokens"] = stats_.generated_tokens;
    e["prefill_tokens_per_second"] = stats_.prefill_tokens_per_second;
    e["decode_tokens_per_second"] = stats_.decode_tokens_per_second;
    e["ttft_seconds"] = stats_.ttft_seconds;
  }
  e["memory"] = {{"rss_bytes", platform::current_rss_bytes()},
                 {"peak_rss_bytes", platform::peak_rss_bytes()},
                 {"kv_bytes", kv_bytes_.load()}};
  {
    // Over the last (or running) generation; null when experts are resident (nothing measured).
    std::lock_guard lock(stats_mutex_);
    const bool measured = stats_.expert_slots > 0 && stats_.expert_requests > 0;
    const auto of_uses = [&](uint64_t n) {
      return measured ? json(static_cast<double>(n) / static_cast<double>(stats_.expert_requests))
                      : json(nullptr);
    };
    const auto per_token = [&](double v) {
      return measured && stats_.expert_tokens > 0
                 ? json(v / static_cast<double>(stats_.expert_tokens))
                 : json(nullptr);
    };
    e["expert_cache"] = {
        {"slots", stats_.expert_slots},
        {"hit_rate", of_uses(stats_.expert_hits)},
        // The tiers on a GPU backend (0 and the host's figures on the CPU): GPU slots, then the
        // host's slots (RAM), then the expert files; what went to the GPU per token.
        {"gpu_slots", stats_.expert_gpu_slots},
        {"gpu_hit_rate", of_uses(stats_.expert_gpu_hits)},
        {"ram_hit_rate", of_uses(stats_.expert_hits - stats_.expert_gpu_hits)},
        {"gpu_copy_bytes_per_token", per_token(static_cast<double>(stats_.expert_gpu_bytes))},
        // Hybrid experts (gpu_misses "cpu" or "split"): the GPU's misses computed on the CPU.
        {"cpu_experts_per_token", per_token(static_cast<double>(stats_.expert_cpu_uses))},
        {"cpu_expert_ms_per_token", per_token(stats_.expert_cpu_ms)},
        {"read_bytes_per_token", measured && stats_.expert_tokens > 0
                                     ? json(static_cast<double>(stats_.expert_bytes_read) /
                                            static_cast<double>(stats_.expert_tokens))
                                     : json(nullptr)},
        // Time the model thread waited on expert reads with nothing else to compute.
        {"io_wait_ms_per_token", measured && stats_.expert_tokens > 0
                                     ? json(1000.0 * stats_.expert_io_wait_seconds /
                                            static_cast<double>(stats_.expert_tokens))
                                     : json(nullptr)}};
  }
  return e;
}

json Service::plan_event(const json& id, const LoadRequest& request) {
  // Answered by the reader at once: only the manifest and file sizes are read, nothing loaded.
  // A backend not on this machine is refused as load refuses it.
  const EngineOptions& o = request.options;
  const json names = backend_names();
  if (o.backend != "auto" && std::find(names.begin(), names.end(), o.backend) == names.end())
    throw ProtocolError("unsupported_backend", "backend \"" + o.backend + "\" is not available (" +
                                                   names.dump() + ", auto)");
  MemoryPlan plan;
  try {
    plan = plan_memory(ModelDir::open(request.model), plan_settings(o));
  } catch (const std::exception& e) {
    throw ProtocolError("plan_failed", e.what());
  }
  json e = json::parse(plan.to_json());
  e["type"] = "plan";
  e["id"] = id;
  e["model"] = request.model;
  e["backend"] = o.backend == "auto" ? resolve_backend("auto") : o.backend;
  return e;
}

bool Service::handle_line(const std::string& line) {
  json id = nullptr;
  try {
    if (line.find_first_not_of(" \t\r") == std::string::npos) return true;  // blank: ignored
    // Every field is checked here, on arrival: a bad load or generate is answered at once and
    // never reaches the worker.
    Request parsed = parse_request(line);
    id = parsed.id;
    json& msg = parsed.message;
    const std::string& type = parsed.type;
    if (type == "hello") {
      const int64_t want = msg.contains("protocol") && !msg["protocol"].is_null()
                               ? msg["protocol"].get<int64_t>()
                               : kProtocolVersion;
      if (want != kProtocolVersion)
        throw ProtocolError("unsupported_version", "this service speaks protocol version " +
                                                       std::to_string(kProtocolVersion) +
                                                       ", the client asked for " +
                                                       std::to_string(want));
      emit({{"type", "hello"},
            {"id", id},
            {"protocol", kProtocolVersion},
            {"service_version", kServiceVersion},
            {"backends", backend_names()},
            {"devices", backend_devices()},
            {"cpu_features", split_words(cpu::cpu_features())},
            {"hardware_threads", std::thread::hardware_concurrency()},
            {"pid", platform::current_pid()}});
      return true;
    }
    if (type == "stats") {
      emit(stats_event(id));
      return true;
    }
    if (type == "plan") {
      emit(plan_event(id, parse_load(msg)));
      return true;
    }
    if (type == "cancel") {
      json target = msg.contains("target") ? msg["target"] : json(nullptr);
      if (!target.is_string() && !target.is_number_integer())
        throw ProtocolError("bad_request", "cancel needs a \"target\": the id of a generate");
      const std::string key = target.dump();
      std::optional<Job> dropped;
      {
        std::lock_guard lock(jobs_mutex_);
        if (running_id_ == key) cancel_running_ = true;
        for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
          if (it->id == key && it->type == "generate") {
            dropped = std::move(*it);
            jobs_.erase(it);
            break;
          }
      }
      if (dropped)
        emit({{"type", "finished"},
              {"id", target},
              {"reason", "cancelled"},
              {"tokens", json::array()},
              {"prompt_tokens", 0},
              {"cached_tokens", 0},
              {"prefill_tokens", 0}});
      return true;
    }
    if (type == "shutdown") {
      stop();
      emit({{"type", "bye"}, {"id", id}});
      return false;
    }
    if (type != "load" && type != "generate" && type != "unload")
      throw ProtocolError("unknown_type", "unknown message type \"" + type + "\"");
    if (id.is_null()) throw ProtocolError("bad_request", type + " needs an \"id\"");
    {
      std::lock_guard lock(jobs_mutex_);
      jobs_.push_back(Job{id.dump(), type, std::move(msg)});
    }
    jobs_cv_.notify_one();
  } catch (const ProtocolError& e) {
    error(e.id.is_null() ? id : e.id, e.code, e.what());
  } catch (const std::exception& e) {
    error(id, "internal", e.what());
  }
  return true;
}

void Service::worker_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(jobs_mutex_);
      jobs_cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (stopping_) break;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      running_id_ = job.id;
      cancel_running_ = false;
    }
    run_job(job);
    std::lock_guard lock(jobs_mutex_);
    running_id_.clear();
  }
  // Drop the engine (and release the model lock) on this thread, before the service exits.
  loaded_.reset();
}

void Service::run_job(const Job& job) {
  const json id = job.request["id"];
  try {
    if (job.type == "load") do_load(job);
    if (job.type == "generate") do_generate(job);
    if (job.type == "unload") do_unload(job);
  } catch (const ProtocolError& e) {
    error(id, e.code, e.what());
  } catch (const platform::LockHeld& e) {
    std::fprintf(stderr, "redwing-service: %s\n", e.what());
    emit({{"type", "error"},
          {"id", id},
          {"code", "model_locked"},
          {"message", e.what()},
          {"owner_pid", e.owner_pid}});
  } catch (const ContextOverflow& e) {
    error(id, "context_overflow", e.what());
  } catch (const NonFiniteLogits& e) {
    error(id, "non_finite_logits", e.what());
  } catch (const std::invalid_argument& e) {
    error(id, "bad_request", e.what());
  } catch (const std::exception& e) {
    error(id, job.type == "load" ? "load_failed" : job.type + "_failed", e.what());
  }
}

void Service::do_load(const Job& job) {
  const json& req = job.request;
  const json id = req["id"];
  if (loaded_)
    throw ProtocolError("already_loaded",
                        "a model is loaded (" + loaded_->model_dir + "); unload it first");
  const LoadRequest parsed = parse_load(req);
  const std::string& model = parsed.model;
  const int64_t context = parsed.context;
  const EngineOptions& options = parsed.options;
  const int64_t prefix_slack = parsed.prefix_slack;
  // Whether this machine has the backend is checked here, not in parse_load: the parser stays a
  // pure function of the message (the fuzzer drives it), and enumerating devices loads drivers.
  const json names = backend_names();
  if (options.backend != "auto" &&
      std::find(names.begin(), names.end(), options.backend) == names.end())
    throw ProtocolError(
        "unsupported_backend",
        "backend \"" + options.backend + "\" is not available (" + names.dump() + ", auto)");

  const auto progress = [&](const char* phase, double fraction) {
    emit({{"type", "load_progress"}, {"id", id}, {"phase", phase}, {"fraction", fraction}});
  };
  progress("lock", 0.0);
  if (platform::path_kind(model) != platform::PathKind::directory)
    throw ProtocolError("load_failed", "model directory not found: " + model);
  // A model directory before anything is created for it: no lock file for an arbitrary path.
  try {
    ModelDir::open(model);
  } catch (const std::exception& e) {
    throw ProtocolError("load_failed", e.what());
  }
  Loaded l;
  l.model_dir = model;
  l.lock = platform::FileLock::acquire(platform::model_lock_path(model));
  progress("weights", 0.1);
  l.engine = std::make_unique<Engine>(options);
  progress("kv_cache", 0.9);
  l.session = std::make_unique<Session>(*l.engine, context, prefix_slack);
  const Architecture& a = l.engine->arch();
  const uint64_t model_bytes = directory_bytes(model);
  const uint64_t kv = l.session->kv_bytes();
  json ready = {
      {"type", "ready"},
      {"id", id},
      {"model",
       {{"dir", model},
        {"family", a.family},
        {"vocab_size", a.vocab_size},
        {"layers", a.num_layers},
        {"moe", a.moe.has_value()},
        {"eos_token_ids", a.eos_token_ids},
        {"bos_token_id", a.bos_token_id}}},
      {"context", context},
      {"backend", l.engine->backend().describe()},
      {"expert_cache_slots", l.engine->expert_cache_slots()},
      {"gpu_expert_slots", l.engine->gpu_expert_slots()},
      {"gpu_misses", l.engine->gpu_misses()},
      {"memory",
       {{"model_bytes", model_bytes},
        {"kv_bytes", kv},
        // The engine's plan (runtime/memory_plan.h), the plan request's total for the same
        // settings: mapped core weights, KV cache, experts and working memory.
        {"estimate_bytes", l.engine->memory_plan().total()},
        {"rss_bytes", platform::current_rss_bytes()},
        // GPU memory (weights, KV cache, activations), apart from the host's RSS; 0 on the CPU.
        {"device_bytes", l.engine->backend().device_memory_bytes()}}}};
  loaded_ = std::move(l);
  kv_bytes_ = kv;
  {
    std::lock_guard lock(stats_mutex_);
    model_dir_ = model;
    has_model_ = true;
  }
  emit(ready);
}

void Service::do_unload(const Job& job) {
  const json id = job.request["id"];
  if (!loaded_) throw ProtocolError("not_loaded", "no model is loaded");
  loaded_.reset();
  kv_bytes_ = 0;
  {
    std::lock_guard lock(stats_mutex_);
    model_dir_.clear();
    has_model_ = false;
  }
  emit({{"type", "unloaded"}, {"id", id}});
}

void Service::do_generate(const Job& job) {
  const json& req = job.request;
  const json id = req["id"];
  if (!loaded_) throw ProtocolError("not_loaded", "no model is loaded: send load first");
  GenerateRequest parsed = parse_generate(req);
  SessionRequest& r = parsed.request;
  r.sampler.seed = parsed.seed ? *parsed.seed : std::random_device{}();
  const bool stream = parsed.stream;
  const int64_t interval_ms = parsed.stats_interval_ms;

  Session& session = *loaded_->session;
  Engine& engine = *loaded_->engine;
  const ExpertStats experts_at_start = engine.expert_stats();
  const double cpu_ms_at_start = engine.model().forward_parts().host_experts_ms;
  const auto update_expert_stats = [&](int64_t tokens) {
    const ExpertStats now = engine.expert_stats();
    const double cpu_ms = engine.model().forward_parts().host_experts_ms - cpu_ms_at_start;
    std::lock_guard lock(stats_mutex_);
    stats_.expert_slots = engine.expert_cache_slots();
    stats_.expert_requests = now.requests - experts_at_start.requests;
    stats_.expert_hits = now.hits - experts_at_start.hits;
    stats_.expert_gpu_slots = engine.gpu_expert_slots();
    stats_.expert_gpu_hits = now.device_hits - experts_at_start.device_hits;
    stats_.expert_gpu_bytes = now.device_bytes - experts_at_start.device_bytes;
    stats_.expert_cpu_uses = now.host_computed - experts_at_start.host_computed;
    stats_.expert_cpu_ms = cpu_ms;
    stats_.expert_bytes_read = now.bytes_read - experts_at_start.bytes_read;
    stats_.expert_tokens = tokens;
    stats_.expert_io_wait_seconds = now.io_wait_seconds - experts_at_start.io_wait_seconds;
  };
  {
    std::lock_guard lock(stats_mutex_);
    stats_.generating = true;
  }
  update_expert_stats(0);
  auto last_stats = std::chrono::steady_clock::now();
  const auto t0 = last_stats;
  int64_t generated = 0;
  SessionCallbacks cb;
  cb.cancelled = [this] { return cancel_running_.load(); };
  cb.on_prefill = [&](int64_t done, int64_t total) {
    if (stream) emit({{"type", "prefill"}, {"id", id}, {"done", done}, {"total", total}});
  };
  cb.on_token = [&](int32_t token) {
    ++generated;
    if (stream) emit({{"type", "tokens"}, {"id", id}, {"tokens", json::array({token})}});
    update_expert_stats(generated);
    const auto now = std::chrono::steady_clock::now();
    if (interval_ms > 0 && now - last_stats >= std::chrono::milliseconds(interval_ms)) {
      last_stats = now;
      const double s = std::chrono::duration<double>(now - t0).count();
      {
        std::lock_guard lock(stats_mutex_);
        stats_.decode_tokens_per_second = s > 0 ? static_cast<double>(generated) / s : 0;
      }
      json e = stats_event(id);
      e["tokens_so_far"] = generated;
      emit(e);
    }
  };
  SessionResult res;
  try {
    res = session.generate(r, cb);
  } catch (...) {
    std::lock_guard lock(stats_mutex_);
    stats_.generating = false;
    throw;
  }
  const double decode_tps = res.decode_seconds > 0 && res.tokens.size() > 1
                                ? static_cast<double>(res.tokens.size() - 1) / res.decode_seconds
                                : 0.0;
  const double prefill_tps =
      res.prefill_seconds > 0 ? static_cast<double>(res.prefill_tokens) / res.prefill_seconds : 0;
  {
    std::lock_guard lock(stats_mutex_);
    stats_.generating = false;
    stats_.generations += 1;
    stats_.prompt_tokens = res.prompt_tokens;
    stats_.cached_tokens = res.cached_tokens;
    stats_.prefill_tokens = res.prefill_tokens;
    stats_.generated_tokens = static_cast<int64_t>(res.tokens.size());
    stats_.prefill_tokens_per_second = prefill_tps;
    stats_.decode_tokens_per_second = decode_tps;
    stats_.ttft_seconds = res.ttft_seconds;
  }
  emit({{"type", "finished"},
        {"id", id},
        {"reason", res.stop_reason},
        {"tokens", res.tokens},
        {"prompt_tokens", res.prompt_tokens},
        {"cached_tokens", res.cached_tokens},
        {"prefill_tokens", res.prefill_tokens},
        {"timings",
         {{"prefill_seconds", res.prefill_seconds},
          {"ttft_seconds", res.ttft_seconds},
          {"decode_seconds", res.decode_seconds},
          {"prefill_tokens_per_second", prefill_tps},
          {"decode_tokens_per_second", decode_tps}}}});
}

int serve_stdio() {
  // Events are written with write(2): one call per line, never interleaved with stdio buffers.
  Service service([](const std::string& line) {
    std::string out = line + "\n";
    const char* p = out.data();
    size_t left = out.size();
    while (left > 0) {
      const ssize_t n = ::write(STDOUT_FILENO, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        _exit(0);  // the reader is gone: nobody to serve
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
  });
  std::string line;
  std::string buffer;
  char chunk[65536];
  bool discarding = false;  // inside an over-long line
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of input: the client closed the pipe
    buffer.append(chunk, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (discarding) {
        discarding = false;
        continue;
      }
      if (!service.handle_line(buffer.substr(start, nl - start))) {
        service.stop();
        return 0;
      }
    }
    buffer.erase(0, start);
    if (buffer.size() > kMaxLineBytes) {
      buffer.clear();
      if (!discarding)
        service.report_error(
            "message_too_large",
            "a message exceeds " + std::to_string(kMaxLineBytes) + " bytes; it is ignored");
      discarding = true;
    }
  }
  service.stop();
  return 0;
}

}  // namespace redwing::service
