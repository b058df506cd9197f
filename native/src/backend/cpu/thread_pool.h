// A fixed pool of worker threads for data-parallel loops (the decode path splits each matrix
// product over rows, about ten times per layer, so dispatch has to be cheap).
//
// Workers spin briefly after each job, so a loop that follows within the spin window starts
// without a system call, then block on a futex-backed std::atomic wait. The calling thread takes
// part in every loop, so a pool of size N runs N - 1 workers.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace redwing {

class ThreadPool {
 public:
  // n_threads <= 0: default_thread_count(). The pool uses n_threads - 1 worker threads plus the
  // caller of parallel_for.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();  // stops and joins the workers
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads taking part in a loop, the caller included.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // REDWING_THREADS if set to a positive integer, else std::thread::hardware_concurrency().
  static int default_thread_count();

  // How long an idle worker (and a waiting caller) spins before blocking, in microseconds.
  void set_spin_us(int us) { spin_us_.store(us, std::memory_order_relaxed); }

  // Calls fn(begin, end) over disjoint chunks that cover [0, n) exactly once, in parallel, and
  // returns when all are done. Chunk boundaries are multiples of grain (the last chunk may be
  // shorter); chunks are handed out dynamically and shrink towards the end of the loop (guided
  // scheduling), so a slow thread does not hold up the loop and the threads finish together. The
  // first exception thrown by fn is rethrown here after every running chunk has finished; chunks
  // not yet started are skipped. A parallel_for called from inside fn runs serially on the calling
  // thread. Calls from different threads are serialized.
  template <typename F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, grain, const_cast<void*>(static_cast<const void*>(&fn)),
        [](void* ctx, int64_t begin, int64_t end) { (*static_cast<Fn*>(ctx))(begin, end); });
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);

  void run(int64_t n, int64_t grain, void* ctx, Trampoline call);
  void worker_main();
  void work_on_current_job();  // grabs chunks until none are left

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel_for at a time

  // The current job; written by the caller before it publishes a new generation.
  void* ctx_ = nullptr;
  Trampoline call_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  int64_t divisor_ = 1;                 // a chunk is 1 / divisor_ of the rows left
  std::atomic<int64_t> next_begin_{0};  // the first row not yet handed out
  std::atomic<bool> failed_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;

  std::atomic<uint64_t> generation_{0};  // bumped once per job; idle workers wait on it
  std::atomic<int> sleeping_workers_{0};
  // Admission to the current job: (generation << 32) | kOpen | number of workers inside. A
  // worker joins only while the job is open, with a compare-exchange, so once the caller closes
  // the job it waits for exactly the workers that joined; a worker that was descheduled (the
  // cores are shared) never holds up a loop that the other threads already finished.
  static constexpr uint64_t kOpen = uint64_t{1} << 31;
  std::atomic<uint64_t> job_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int> spin_us_{50};
};

}  // namespace redwing
