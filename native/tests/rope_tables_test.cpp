// RopeTables: the tables equal rope_cos_sin's for every row, one is computed once for the layers
// that ask for it again, and a table for other positions or another rotation is computed anew.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "backend/rope_tables.h"

using namespace redwing;

namespace {

// Row r of the table for positions pos0.. as rope_cos_sin computes it.
std::vector<float> expected_row(const RopeParams& rp, int head_dim, int64_t position) {
  const int half = head_dim / 2;
  std::vector<float> row(static_cast<size_t>(head_dim));
  rope_cos_sin(rope_inv_freq(rp, head_dim), position, row.data(), row.data() + half);
  return row;
}

bool same_bits(std::span<const float> a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("RoPE tables: rope_cos_sin's bits, computed once per chunk and kind") {
  const RopeParams sliding{10000.0, 128, 256, 1.0};
  const RopeParams global{1e6, 32, 512, 1.0};  // partial rotation: pairs past 32 stay 0 and 1
  RopeTables tables;
  const std::span<const float> a = tables.get(7, 256, sliding, 100);
  REQUIRE(a.size() == 7u * 256u);
  for (int64_t r = 0; r < 7; ++r) {
    CAPTURE(r);
    CHECK(same_bits(a.subspan(static_cast<size_t>(r) * 256, 256),
                    expected_row(sliding, 256, 100 + r)));
  }
  const std::span<const float> g = tables.get(7, 512, global, 100);
  CHECK(same_bits(g.subspan(6 * 512, 512), expected_row(global, 512, 106)));
  CHECK(g[511] == 0.0f);  // sin of the last, unrotated pair
  CHECK(g[255] == 1.0f);  // its cos

  // The other layers of the chunk get the same table back, not a new one.
  CHECK(tables.get(7, 256, sliding, 100).data() == a.data());
  CHECK(tables.get(7, 512, global, 100).data() == g.data());

  // Another position, row count or rotation is another table, with its own bits.
  const std::span<const float> next = tables.get(7, 256, sliding, 107);
  CHECK(next.data() != a.data());
  CHECK(same_bits(next.subspan(0, 256), expected_row(sliding, 256, 107)));
  const RopeParams scaled{10000.0, 128, 256, 8.0};
  CHECK(same_bits(tables.get(1, 256, scaled, 100), expected_row(scaled, 256, 100)));
  // Four tables are kept; a fifth replaces the least recently used (the global one of pos 100
  // was used after the sliding one, so the sliding one goes) and every table stays right.
  CHECK(same_bits(tables.get(3, 256, sliding, 100).subspan(512, 256),
                  expected_row(sliding, 256, 102)));
  CHECK(same_bits(tables.get(7, 512, global, 100).subspan(0, 512), expected_row(global, 512, 100)));
  CHECK(same_bits(tables.get(7, 256, sliding, 100).subspan(3 * 256, 256),
                  expected_row(sliding, 256, 103)));
}
