// libFuzzer target: the decode service's message parser (one JSON line -> a checked request or
// a ProtocolError with a code). Any other exception escaping (which the service would report as
// "internal") and any sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "service/service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  try {
    redwing::service::Request r = redwing::service::parse_request(line);
    (void)r;
  } catch (const redwing::service::ProtocolError& e) {
    if (e.code.empty()) __builtin_trap();  // every refusal carries a code
  }
  return 0;
}
