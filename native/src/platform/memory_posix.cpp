// POSIX implementation of platform/memory.h (Linux, macOS).
#include <sys/resource.h>

#include <cstdio>
#include <cstring>

#if defined(__APPLE__)
#include <mach/mach.h>
#endif

#include "platform/memory.h"

namespace redwing::platform {
namespace {

#if defined(__linux__)
// A "Name:   123 kB" line of /proc/self/status, in bytes; 0 if absent.
uint64_t proc_status_kb(const char* name) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t value = 0;
  const size_t len = std::strlen(name);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, name, len) == 0 && line[len] == ':') {
      unsigned long long kb = 0;
      if (std::sscanf(line + len + 1, "%llu", &kb) == 1) value = kb * 1024ull;
      break;
    }
  }
  std::fclose(f);
  return value;
}
#endif

}  // namespace

uint64_t peak_rss_bytes() {
#if defined(__APPLE__)
  task_vm_info_data_t info{};
  mach_msg_type_number_t count = TASK_VM_INFO_COUNT;
  if (task_info(mach_task_self(), TASK_VM_INFO, reinterpret_cast<task_info_t>(&info), &count) ==
      KERN_SUCCESS)
    return info.ledger_phys_footprint_peak;
  return 0;
#else
#if defined(__linux__)
  if (uint64_t v = proc_status_kb("VmHWM")) return v;
#endif
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024ull;  // kilobytes on Linux and the BSDs
#endif
}

uint64_t current_rss_bytes() {
#if defined(__APPLE__)
  task_vm_info_data_t info{};
  mach_msg_type_number_t count = TASK_VM_INFO_COUNT;
  if (task_info(mach_task_self(), TASK_VM_INFO, reinterpret_cast<task_info_t>(&info), &count) ==
      KERN_SUCCESS)
    return info.phys_footprint;
  return 0;
#elif defined(__linux__)
  return proc_status_kb("VmRSS");
#else
  return 0;
#endif
}

}  // namespace redwing::platform
