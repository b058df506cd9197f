#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace redwing {
namespace {

// Set on pool workers and on a caller while it runs a loop, so nested loops run inline instead
// of waiting for threads that are busy running their parent.
thread_local bool t_inside_pool = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or spin_us microseconds have passed; true if done() became true.
template <typename Done>
bool spin_until(Done done, int spin_us) {
  if (done()) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (done()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

// Floats below 2^-126 (subnormals) cost x86 CPUs a microcode assist, often over a hundred cycles,
// for each vector instruction that reads or produces one. Attention produces them all the time:
// a softmax probability is subnormal when its score is 87 below the row's highest, and so is its
// product with every value it weights. On Gemma 4's global layers (eight query heads per value
// row) the weighted sum of values ran 8 times slower with them (docs/cpu.md, round eleven). So the
// pool's threads run with the control bits that flush subnormal results to zero (FTZ) and read
// subnormal inputs as zero (DAZ): a change of less than 2^-126 in any value, far below float's
// rounding of the sums it enters. AArch64 CPUs handle subnormals in hardware, so nothing changes
// there. The caller's own mode comes back when its loop ends.
class SubnormalsAsZero {
 public:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kFlushToZero = 0x8000;     // MXCSR.FTZ
  static constexpr unsigned kDenormalsAreZero = 0x40;  // MXCSR.DAZ
  SubnormalsAsZero() : saved_(_mm_getcsr()) {
    const unsigned want = saved_ | kFlushToZero | kDenormalsAreZero;
    if (want != saved_) _mm_setcsr(want);
  }
  ~SubnormalsAsZero() {
    if (_mm_getcsr() != saved_) _mm_setcsr(saved_);
  }

 private:
  unsigned saved_;
#endif
};

}  // namespace

int ThreadPool::default_thread_count() {
  if (const char* env = std::getenv("REDWING_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0 && v <= 1024) return static_cast<int>(v);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

ThreadPool::ThreadPool(int n_threads) {
  // REDWING_SPIN_US: how long idle threads spin before blocking (A/B runs: hybrid experts leave
  // the pool idle while the GPU runs a layer's attention, ~0.2-0.5 ms on the H200).
  if (const char* env = std::getenv("REDWING_SPIN_US"); env && *env) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || v < 0 || v > 1000000)
      throw std::invalid_argument(std::string("REDWING_SPIN_US=") + env +
                                  ": expected microseconds from 0 to 1000000");
    spin_us_.store(static_cast<int>(v));
  }
  if (n_threads <= 0) n_threads = default_thread_count();
  try {
    workers_.reserve(static_cast<size_t>(n_threads - 1));
    for (int i = 0; i + 1 < n_threads; ++i) workers_.emplace_back([this] { worker_main(); });
  } catch (const std::exception& e) {
    // The system refused a thread: stop the ones already running (destroying a joinable
    // std::thread would abort the process) and report it as an error.
    const size_t started = workers_.size();
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    throw std::runtime_error("cannot start " + std::to_string(n_threads) +
                             " threads (the system refused after " + std::to_string(started + 1) +
                             "): " + e.what());
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work_on_current_job() {
  int64_t begin = next_begin_.load(std::memory_order_relaxed);
  for (;;) {
    if (begin >= n_ || failed_.load(std::memory_order_relaxed)) return;
    // Guided: a chunk is a share of what is left, whole grains, so chunks shrink towards the end
    // and the threads finish close together (the last chunk is at most a grain, not an eighth of
    // the loop; waiting for it was about 5% of a decode step on two threads).
    const int64_t share = (n_ - begin) / divisor_;
    const int64_t size = std::max(grain_, (share + grain_ - 1) / grain_ * grain_);
    const int64_t end = std::min(n_, begin + size);
    if (!next_begin_.compare_exchange_weak(begin, end, std::memory_order_relaxed)) continue;
    try {
      call_(ctx_, begin, end);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
    begin = next_begin_.load(std::memory_order_relaxed);
  }
}

void ThreadPool::worker_main() {
  t_inside_pool = true;
  const SubnormalsAsZero flush;  // for the worker's whole life
  // Generation 0 is the pool's state at construction: a job published before this thread got
  // here must still be seen as new.
  uint64_t seen = 0;
  for (;;) {
    // Wait for a new job: spin first (the next loop usually follows within microseconds), then
    // block. sleeping_workers_ tells the caller whether it must issue a wake-up system call;
    // with seq_cst on both sides either the caller sees the count or this thread sees the new
    // generation, so no wake-up is lost.
    const int spin = spin_us_.load(std::memory_order_relaxed);
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; }, spin)) {
      sleeping_workers_.fetch_add(1);
      while (generation_.load() == seen) generation_.wait(seen);
      sleeping_workers_.fetch_sub(1);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;

    // Join the job if it is still open; otherwise the others have finished it already.
    uint64_t state = job_.load();
    bool joined = false;
    while ((state >> 32) == (seen & 0xffffffffu) && (state & kOpen)) {
      if (job_.compare_exchange_weak(state, state + 1)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;

    work_on_current_job();

    // Leave; the last one out of a closed job wakes the caller if it went to sleep.
    const uint64_t after = job_.fetch_sub(1) - 1;
    if ((after & (kOpen - 1)) == 0 && !(after & kOpen) && caller_sleeping_.load()) {
      job_.notify_all();
    }
  }
}

void ThreadPool::run(int64_t n, int64_t grain, void* ctx, Trampoline call) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const SubnormalsAsZero flush;  // the caller's share, inline or not
  if (workers_.empty() || t_inside_pool || n <= grain) {
    call(ctx, 0, n);
    return;
  }

  std::lock_guard run_lock(run_mutex_);
  // Each chunk takes 1 / (2 * threads) of the rows left (work_on_current_job): the first ones
  // are large, so per-chunk costs stay small, and a slow thread is evened out by the others.
  grain_ = grain;
  divisor_ = 2 * static_cast<int64_t>(size());
  n_ = n;
  ctx_ = ctx;
  call_ = call;
  error_ = nullptr;
  failed_.store(false, std::memory_order_relaxed);
  next_begin_.store(0, std::memory_order_relaxed);
  caller_sleeping_.store(false);

  const uint64_t gen = generation_.load() + 1;
  job_.store(((gen & 0xffffffffu) << 32) | kOpen);  // open, nobody inside yet
  generation_.store(gen);                           // publishes the job (seq_cst)
  if (sleeping_workers_.load() > 0) generation_.notify_all();

  t_inside_pool = true;
  work_on_current_job();
  t_inside_pool = false;

  // Every chunk is claimed: close the job and wait for the workers that joined it to finish
  // their last chunk.
  const uint64_t closed = job_.fetch_and(~kOpen) & ~kOpen;
  auto inside = [&] { return job_.load(std::memory_order_acquire) & (kOpen - 1); };
  if ((closed & (kOpen - 1)) != 0 &&
      !spin_until([&] { return inside() == 0; }, spin_us_.load(std::memory_order_relaxed))) {
    caller_sleeping_.store(true);
    for (uint64_t s = job_.load(); (s & (kOpen - 1)) != 0; s = job_.load()) job_.wait(s);
    caller_sleeping_.store(false);
  }

  if (error_) {
    std::exception_ptr e = std::move(error_);
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace redwing
