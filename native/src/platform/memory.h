// Process memory figures for statistics and budgets.
#pragma once

#include <cstdint>

namespace redwing::platform {

// The most physical memory the process has held so far, in bytes: VmHWM on Linux (getrusage as
// a fallback), the peak physical footprint (task_info) on macOS. 0 if unknown.
uint64_t peak_rss_bytes();
// Physical memory held now (VmRSS on Linux, the physical footprint on macOS). 0 if unknown.
uint64_t current_rss_bytes();

}  // namespace redwing::platform
