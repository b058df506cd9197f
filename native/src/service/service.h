// The decode service: a loaded engine driven by newline-delimited JSON messages (docs/protocol.md).
//
// Threads: the caller's thread reads requests (run()); a worker thread runs load, generate and
// unload one at a time, in arrival order; hello, stats, cancel and shutdown are answered by the
// reader at once, so a cancel reaches a running generation (checked between prefill chunks and
// between tokens). Events are written whole, one line each, under a mutex.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "platform/process.h"
#include "runtime/engine.h"

namespace redwing::service {

inline constexpr int kProtocolVersion = 1;
inline constexpr const char* kServiceVersion = "0.1.0";
// Longest accepted request line; longer ones are discarded with a message_too_large error.
inline constexpr size_t kMaxLineBytes = 64u << 20;

// A request that breaks the protocol; `code` goes into the error event.
struct ProtocolError : std::runtime_error {
  ProtocolError(std::string code, const std::string& message)
      : std::runtime_error(message), code(std::move(code)) {}
  std::string code;
  nlohmann::json id;  // the request's id once it is known (null before)
};

// One request line, parsed and checked. For load and generate every field is checked too
// (parse_load, parse_generate), so a bad request is refused on arrival.
struct Request {
  nlohmann::json id;  // null when absent
  std::string type;
  nlohmann::json message;
};
// Throws ProtocolError (bad_json, bad_request) naming the field at fault.
Request parse_request(const std::string& line);

struct LoadRequest {
  std::string model;
  int64_t context = 0;
  int64_t prefix_slack = 0;
  EngineOptions options;
};
LoadRequest parse_load(const nlohmann::json& request);

struct GenerateRequest {
  SessionRequest request;
  std::optional<uint64_t> seed;  // none: a random seed
  bool stream = true;
  int64_t stats_interval_ms = 1000;
};
GenerateRequest parse_generate(const nlohmann::json& request);

class Service {
 public:
  // `write_line` receives each event as one line of JSON without the newline; it is called under
  // the service's output mutex.
  explicit Service(std::function<void(const std::string&)> write_line);
  ~Service();

  // Handles one request line. Returns false once the service should stop reading (shutdown).
  bool handle_line(const std::string& line);
  // Stops the worker after the current job (cancelling a running generation) and drops the
  // engine. Idempotent.
  void stop();
  // An error event not tied to a request (e.g. an over-long line).
  void report_error(const std::string& code, const std::string& message) {
    error(nullptr, code, message);
  }

 private:
  struct Job {
    std::string id;
    std::string type;
    nlohmann::json request;
  };
  struct Loaded {
    std::string model_dir;
    platform::FileLock lock;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Session> session;
  };
  struct Stats {  // the latest figures, for stats requests and periodic events
    int64_t generations = 0;
    int64_t prompt_tokens = 0, cached_tokens = 0, prefill_tokens = 0, generated_tokens = 0;
    double prefill_tokens_per_second = 0, decode_tokens_per_second = 0, ttft_seconds = 0;
    bool generating = false;
    // Expert cache over the last (or running) generation: counter deltas since it started.
    int expert_slots = 0;
    uint64_t expert_requests = 0, expert_hits = 0, expert_bytes_read = 0;
    int expert_gpu_slots = 0;  // a GPU backend's slots per layer (the RAM tier: fewer)
    uint64_t expert_gpu_hits = 0, expert_gpu_bytes = 0;  // in GPU slots already; copied there
    // Hybrid experts: uses computed on the CPU instead of the GPU, and the CPU's time on them.
    uint64_t expert_cpu_uses = 0;
    double expert_cpu_ms = 0;
    int64_t expert_tokens = 0;
    double expert_io_wait_seconds = 0;
  };

  void emit(const nlohmann::json& event);
  void error(const nlohmann::json& id, const std::string& code, const std::string& message);
  nlohmann::json stats_event(const nlohmann::json& id);
  nlohmann::json plan_event(const nlohmann::json& id, const LoadRequest& request);
  void worker_loop();
  void run_job(const Job& job);
  void do_load(const Job& job);
  void do_generate(const Job& job);
  void do_unload(const Job& job);

  std::function<void(const std::string&)> write_line_;
  std::mutex out_mutex_;

  std::mutex jobs_mutex_;
  std::condition_variable jobs_cv_;
  std::deque<Job> jobs_;
  std::string running_id_;  // the job the worker is running ("" when idle)
  std::atomic<bool> cancel_running_{false};
  bool stopping_ = false;

  std::mutex stats_mutex_;
  Stats stats_;
  std::optional<Loaded> loaded_;  // touched by the worker only
  std::atomic<uint64_t> kv_bytes_{0};
  std::atomic<bool> has_model_{false};
  std::string model_dir_;  // guarded by stats_mutex_

  std::thread worker_;
};

// Runs the service over stdin/stdout until shutdown or end of input; returns the exit status.
int serve_stdio();

}  // namespace redwing::service
