// The CPU backend: buffers in RAM, the kernels of kernels.h, loops split over a thread pool.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace redwing {

// threads <= 0: ThreadPool::default_thread_count() (REDWING_THREADS or the hardware count).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

}  // namespace redwing
