#include "service/service.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
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

// A request that breaks the protocol; `code` goes into the error event.
struct ProtocolError : std::runtime_error {
  ProtocolError(std::string code, const std::string& message)
      : std::runtime_error(message), code(std::move(code)) {}
  std::string code;
};

// Typed field access with protocol errors that name the field.
template <typename T>
T field(const json& obj, const char* name, T fallback) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return fallback;
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw ProtocolError("bad_request", "");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) throw ProtocolError("bad_request", "");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!it->is_number()) throw ProtocolError("bad_request", "");
    } else {
      if (!it->is_string()) throw ProtocolError("bad_request", "");
    }
    return it->get<T>();
  } catch (const std::exception&) {
    throw ProtocolError("bad_request", std::string("field \"") + name + "\" has the wrong type");
  }
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
    e["expert_cache"] = {
        {"slots", stats_.expert_slots},
        {"hit_rate", measured ? json(static_cast<double>(stats_.expert_hits) /
                                     static_cast<double>(stats_.expert_requests))
                              : json(nullptr)},
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

bool Service::handle_line(const std::string& line) {
  json id = nullptr;
  try {
    if (line.find_first_not_of(" \t\r") == std::string::npos) return true;  // blank: ignored
    json msg;
    try {
      msg = json::parse(line);
    } catch (const json::parse_error& e) {
      throw ProtocolError("bad_json", std::string("the message is not valid JSON: ") + e.what());
    }
    if (!msg.is_object()) throw ProtocolError("bad_request", "a message must be a JSON object");
    if (auto it = msg.find("id"); it != msg.end()) {
      if (!it->is_string() && !it->is_number_integer())
        throw ProtocolError("bad_request", "\"id\" must be a string or an integer");
      id = *it;
    }
    auto type_it = msg.find("type");
    if (type_it == msg.end() || !type_it->is_string())
      throw ProtocolError("bad_request", "the message has no \"type\" string");
    const std::string type = *type_it;
    if (type == "hello") {
      const int64_t want = field<int64_t>(msg, "protocol", kProtocolVersion);
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
    error(id, e.code, e.what());
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
  const std::string model = field<std::string>(req, "model", "");
  if (model.empty()) throw ProtocolError("bad_request", "load needs \"model\": a model directory");
  const std::string backend = field<std::string>(req, "backend", "cpu");
  const json names = backend_names();
  if (backend != "auto" && std::find(names.begin(), names.end(), backend) == names.end())
    throw ProtocolError("unsupported_backend", "backend \"" + backend + "\" is not available (" +
                                                   names.dump() + ", auto)");
  const int64_t context = field<int64_t>(req, "context", 4096);
  if (context <= 0) throw ProtocolError("bad_request", "\"context\" must be positive");
  EngineOptions options;
  options.model_dir = model;
  options.threads = static_cast<int>(field<int64_t>(req, "threads", 0));
  options.backend = backend;
  options.chunk = field<int64_t>(req, "chunk", options.chunk);
  if (options.chunk <= 0) throw ProtocolError("bad_request", "\"chunk\" must be positive");
  options.kv_dtype = parse_kv_dtype(field<std::string>(req, "kv_dtype", "f16"));
  // SSD expert streaming: slots per MoE layer (0: every expert resident), or a memory budget in
  // bytes that the engine turns into a slot count for this context.
  const int64_t slots = field<int64_t>(req, "expert_cache_slots", 0);
  const int64_t budget = field<int64_t>(req, "memory_budget", 0);
  if (slots < 0 || budget < 0)
    throw ProtocolError("bad_request", "expert_cache_slots and memory_budget must be >= 0");
  options.expert_cache_slots = static_cast<int>(slots);
  options.memory_budget = static_cast<uint64_t>(budget);
  options.context = context;
  const int64_t prefix_slack = field<int64_t>(req, "prefix_slack", 0);
  if (prefix_slack < 0) throw ProtocolError("bad_request", "\"prefix_slack\" must be >= 0");

  const auto progress = [&](const char* phase, double fraction) {
    emit({{"type", "load_progress"}, {"id", id}, {"phase", phase}, {"fraction", fraction}});
  };
  progress("lock", 0.0);
  if (platform::path_kind(model) != platform::PathKind::directory)
    throw ProtocolError("load_failed", "model directory not found: " + model);
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
      {"memory",
       {{"model_bytes", model_bytes},
        {"kv_bytes", kv},
        // The engine's plan: mapped core weights, KV cache, experts (slots or all
        // resident) and working memory.
        // (with this session's KV cache, which may carry ring slack).
        {"estimate_bytes", l.engine->memory_plan().total() - l.engine->memory_plan().kv_bytes + kv},
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
  SessionRequest r;
  r.prompt = token_list(req, "tokens", true);
  if (r.prompt.empty()) throw ProtocolError("bad_request", "\"tokens\" is empty");
  r.stop_ids = token_list(req, "stop_token_ids", false);
  r.max_new = static_cast<int>(field<int64_t>(req, "max_new_tokens", 256));
  r.ignore_eos = field<bool>(req, "ignore_eos", false);
  const bool stream = field<bool>(req, "stream", true);
  const int64_t interval_ms = field<int64_t>(req, "stats_interval_ms", 1000);
  json sampling = req.contains("sampling") ? req["sampling"] : json::object();
  if (sampling.is_null()) sampling = json::object();
  if (!sampling.is_object()) throw ProtocolError("bad_request", "\"sampling\" must be an object");
  r.sampler.temperature = field<float>(sampling, "temperature", r.sampler.temperature);
  r.sampler.top_k = static_cast<int>(field<int64_t>(sampling, "top_k", r.sampler.top_k));
  r.sampler.top_p = field<float>(sampling, "top_p", r.sampler.top_p);
  r.sampler.repetition_penalty =
      field<float>(sampling, "repetition_penalty", r.sampler.repetition_penalty);
  r.sampler.repetition_context = static_cast<int>(
      field<int64_t>(sampling, "repetition_context", r.sampler.repetition_context));
  if (auto it = sampling.find("seed"); it != sampling.end() && !it->is_null()) {
    if (!it->is_number_unsigned())
      throw ProtocolError("bad_request", "\"sampling.seed\" must be a non-negative integer");
    r.sampler.seed = it->get<uint64_t>();
  } else {
    r.sampler.seed = std::random_device{}();
  }

  Session& session = *loaded_->session;
  Engine& engine = *loaded_->engine;
  const ExpertStats experts_at_start = engine.expert_stats();
  const auto update_expert_stats = [&](int64_t tokens) {
    const ExpertStats now = engine.expert_stats();
    std::lock_guard lock(stats_mutex_);
    stats_.expert_slots = engine.expert_cache_slots();
    stats_.expert_requests = now.requests - experts_at_start.requests;
    stats_.expert_hits = now.hits - experts_at_start.hits;
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
