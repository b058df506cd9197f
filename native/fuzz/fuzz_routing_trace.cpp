// libFuzzer target: the routing trace file reader (redwing-engine --routing-trace file:PATH, a
// benchmark input) and the replay of its rows into a router's output. Only the errors it
// documents (std::runtime_error, std::invalid_argument) may escape.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/routing_trace.h"

namespace {

const std::string& trace_path() {
  static const std::string path = (std::filesystem::temp_directory_path() /
                                   ("redwing-fuzz-trace-" + std::to_string(::getpid())))
                                      .string();
  return path;
}

void cleanup() {
  std::error_code ec;
  std::filesystem::remove(trace_path(), ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The path first, the exit handler second: handlers run in reverse order, so cleanup() runs
  // while the path still exists (the other order is a use after free, which ASan reported).
  (void)trace_path();
  std::atexit(cleanup);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = trace_path();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    redwing::RoutingTrace trace("file:" + path, "");
    std::vector<int32_t> idx(3 * 2);
    for (int layer = 0; layer < 4; ++layer) trace.apply(layer, 3, 2, 8, idx.data());
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
