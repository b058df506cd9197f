// Checked size arithmetic for every size computed from untrusted numbers (a manifest, a request):
// a product or sum that does not fit is an error naming the size being computed, never a
// wrapped value that later sizes a buffer too small.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

namespace redwing {

// A size that does not fit its type. The message names the field or size at fault.
class SizeOverflow : public std::overflow_error {
 public:
  using std::overflow_error::overflow_error;
};

namespace checked {

[[noreturn]] inline void overflow(std::string_view what, const char* op, uint64_t a, uint64_t b) {
  throw SizeOverflow(std::string(what) + " overflows (" + std::to_string(a) + " " + op + " " +
                     std::to_string(b) + " does not fit in 64 bits)");
}

inline uint64_t mul(uint64_t a, uint64_t b, std::string_view what) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) overflow(what, "*", a, b);
  return a * b;
}

inline uint64_t add(uint64_t a, uint64_t b, std::string_view what) {
  if (b > std::numeric_limits<uint64_t>::max() - a) overflow(what, "+", a, b);
  return a + b;
}

// A non-negative signed count as an unsigned size; a negative one is an error.
inline uint64_t size(int64_t v, std::string_view what) {
  if (v < 0) throw SizeOverflow(std::string(what) + " is negative (" + std::to_string(v) + ")");
  return static_cast<uint64_t>(v);
}

// Signed products and sums of non-negative counts that must stay within int64_t (element counts
// and row offsets the kernels index with).
inline int64_t mul_i64(int64_t a, int64_t b, std::string_view what) {
  const uint64_t p = mul(size(a, what), size(b, what), what);
  if (p > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    overflow(what, "*", static_cast<uint64_t>(a), static_cast<uint64_t>(b));
  return static_cast<int64_t>(p);
}

inline int64_t add_i64(int64_t a, int64_t b, std::string_view what) {
  const uint64_t s = add(size(a, what), size(b, what), what);
  if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    overflow(what, "+", static_cast<uint64_t>(a), static_cast<uint64_t>(b));
  return static_cast<int64_t>(s);
}

// A byte count that must be addressable on this machine (size_t may be 32 bits).
inline size_t to_size_t(uint64_t v, std::string_view what) {
  if (v > std::numeric_limits<size_t>::max())
    throw SizeOverflow(std::string(what) + " (" + std::to_string(v) +
                       " bytes) is too large for this machine");
  return static_cast<size_t>(v);
}

}  // namespace checked
}  // namespace redwing
