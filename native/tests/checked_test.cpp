// Checked size arithmetic (format/checked.h) and the sizes computed with it from untrusted
// numbers: an overflow is an error naming the size, never a wrapped value.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

#include "format/checked.h"
#include "models/kv_cache.h"

using namespace redwing;

TEST_CASE("checked multiply and add refuse what does not fit, naming the size") {
  CHECK(checked::mul(uint64_t{1} << 31, uint64_t{1} << 32, "x") == uint64_t{1} << 63);
  CHECK_THROWS_WITH_AS(checked::mul(uint64_t{1} << 62, 4, "expert bytes"),
                       doctest::Contains("expert bytes overflows"), SizeOverflow);
  CHECK(checked::mul(0, std::numeric_limits<uint64_t>::max(), "x") == 0);
  CHECK_THROWS_AS(checked::add(std::numeric_limits<uint64_t>::max(), 1, "sum"), SizeOverflow);
  CHECK(checked::mul_i64(int64_t{1} << 31, int64_t{1} << 31, "x") == int64_t{1} << 62);
  CHECK_THROWS_AS(checked::mul_i64(int64_t{1} << 32, int64_t{1} << 31, "x"), SizeOverflow);
  CHECK_THROWS_WITH_AS(checked::size(-1, "rows"), doctest::Contains("rows is negative"),
                       SizeOverflow);
}

TEST_CASE("KV cache rows: window + chunk + slack does not wrap") {
  LayerConfig sliding;
  sliding.sliding = true;
  sliding.sliding_window = 1024;
  KvCacheOptions o;
  o.context = std::numeric_limits<int64_t>::max();
  o.max_chunk = std::numeric_limits<int64_t>::max() - 10;  // + 1024 would wrap negative
  CHECK_THROWS_WITH_AS(kv_rows_needed(sliding, o), doctest::Contains("KV cache rows overflows"),
                       SizeOverflow);
  o.max_chunk = 128;
  CHECK(kv_rows_needed(sliding, o) == 1024 + 128);
}
