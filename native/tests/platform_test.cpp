// Tests of the platform layer's memory: aligned blocks, large ones from the system.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "platform/file.h"

using namespace redwing::platform;

namespace {

bool aligned_to(const void* p, std::size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

#if defined(__linux__)
// The flags of the mapping that holds p, from /proc/self/smaps ("VmFlags: rd wr ... hg" where
// the block asked for huge pages), or "" if no mapping holds it.
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%lx%c%lx", &lo, &dash, &hi) == 3 && dash == '-') {
      inside = at >= lo && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}
#endif

}  // namespace

TEST_CASE("allocate_aligned: small blocks from the heap, large ones 2 MiB-aligned, all usable") {
  for (std::size_t alignment : {std::size_t{64}, std::size_t{4096}, std::size_t{16384}}) {
    for (std::size_t bytes : {std::size_t{1}, std::size_t{100000}, std::size_t{(2u << 20) - 1},
                              std::size_t{2u << 20}, std::size_t{(5u << 20) + 123}}) {
      CAPTURE(alignment);
      CAPTURE(bytes);
      AlignedBytes block = allocate_aligned(bytes, alignment);
      REQUIRE(block != nullptr);
      CHECK(aligned_to(block.get(), alignment));
      // Every byte writable and kept: a pattern through the whole block, read back.
      for (std::size_t i = 0; i < bytes; ++i) block[i] = std::byte(i * 131 % 251);
      bool kept = true;
      for (std::size_t i = 0; i < bytes; ++i) kept = kept && block[i] == std::byte(i * 131 % 251);
      CHECK(kept);
#if defined(__linux__)
      if (bytes >= (2u << 20)) {
        // Straight from the system, on a huge-page boundary and marked for huge pages (whether
        // the kernel backs it with them depends on its settings and free memory).
        CHECK(aligned_to(block.get(), 2u << 20));
        CHECK(vm_flags_of(block.get()).find(" hg") != std::string::npos);
      }
#endif
    }
  }
  // Many blocks come and go without leaking mappings: each is returned when its owner goes.
  std::vector<AlignedBytes> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(allocate_aligned(3u << 20, 64));
  blocks.clear();
  AlignedBytes moved = allocate_aligned(4u << 20, 4096);
  AlignedBytes owner = std::move(moved);
  CHECK(moved == nullptr);
  CHECK(owner != nullptr);
}
