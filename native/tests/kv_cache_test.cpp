// KV cache layout: mask semantics, ring-buffer sizing, capacity errors.
#include <doctest/doctest.h>

#include <set>

#include "backend/cpu/cpu_backend.h"
#include "models/kv_cache.h"

using namespace redwing;

TEST_CASE("kv_visible: causal, and exactly W keys including the current one") {
  // Full attention: every key up to and including the query.
  CHECK(kv_visible(5, 0, 0));
  CHECK(kv_visible(5, 5, 0));
  CHECK_FALSE(kv_visible(5, 6, 0));
  // Sliding window of 4: query 10 sees 7, 8, 9, 10.
  int seen = 0;
  for (int k = 0; k < 20; ++k) seen += kv_visible(10, k, 4);
  CHECK(seen == 4);
  CHECK(kv_visible(10, 7, 4));
  CHECK_FALSE(kv_visible(10, 6, 4));
  CHECK_FALSE(kv_visible(10, 11, 4));
  // Early queries see fewer than W keys.
  seen = 0;
  for (int k = 0; k < 20; ++k) seen += kv_visible(1, k, 4);
  CHECK(seen == 2);
}

TEST_CASE("KvLayerView::first_visible agrees with kv_visible") {
  for (int64_t window : {0, 1, 3, 8}) {
    KvLayerView v;
    v.window = window;
    for (int64_t q = 0; q < 40; ++q) {
      for (int64_t k = 0; k < 45; ++k) {
        const bool in_range = k >= v.first_visible(q) && k <= q;
        CHECK(in_range == kv_visible(q, k, window));
      }
    }
  }
}

TEST_CASE("a sliding ring of window + chunk rows never overwrites a key a chunk still needs") {
  for (int window : {1, 2, 5, 16}) {
    for (int64_t chunk : {1, 3, 7, 32}) {
      LayerConfig l;
      l.sliding = true;
      l.sliding_window = window;
      KvCacheOptions o;
      o.context = 1000;
      o.max_chunk = chunk;
      KvLayerView v;
      v.capacity = kv_rows_needed(l, o);
      v.ring = true;
      v.window = window;
      // Every chunk start: the keys visible to any query of the chunk plus the keys the chunk
      // writes must map to distinct rows.
      for (int64_t p0 = 0; p0 < 200; p0 += chunk) {
        std::set<int64_t> rows;
        const int64_t first = v.first_visible(p0);
        for (int64_t k = first; k < p0 + chunk; ++k) rows.insert(v.slot(k));
        CHECK(static_cast<int64_t>(rows.size()) == p0 + chunk - first);
      }
    }
  }
}

TEST_CASE("KvCache sizes layers, refuses to overflow, and names the limits") {
  auto backend = make_cpu_backend(1);
  Architecture arch;
  arch.max_position_embeddings = 4096;
  LayerConfig s;
  s.sliding = true;
  s.sliding_window = 8;
  s.head_dim = 4;
  s.num_kv_heads = 2;
  LayerConfig f = s;
  f.sliding = false;
  f.sliding_window = 0;
  arch.layers = {s, f};
  KvCacheOptions o;
  o.context = 100;
  o.max_chunk = 16;
  o.dtype = KvDType::f16;
  KvCache cache(*backend, arch, o);
  CHECK(cache.layer(0).capacity == 24);
  CHECK(cache.layer(0).ring);
  CHECK(cache.layer(1).capacity == 100);
  CHECK_FALSE(cache.layer(1).ring);
  CHECK(cache.bytes() == 2 * (24 + 100) * 2 * 4 * 2);

  cache.advance(16);
  cache.advance(16);
  CHECK(cache.length() == 32);
  CHECK_THROWS_AS(cache.check_room(17), std::invalid_argument);  // more than a chunk
  for (int i = 0; i < 4; ++i) cache.advance(16);
  CHECK(cache.length() == 96);
  CHECK_THROWS_WITH_AS(cache.check_room(5), doctest::Contains("context size 100"), ContextOverflow);
  cache.check_room(4);
  cache.clear();
  CHECK(cache.length() == 0);

  // A short context needs no ring: the sliding layer keeps every position.
  o.context = 10;
  KvCache small(*backend, arch, o);
  CHECK(small.layer(0).capacity == 10);
  CHECK_FALSE(small.layer(0).ring);

  o.context = 5000;
  CHECK_THROWS_WITH_AS(KvCache(*backend, arch, o), doctest::Contains("max_position_embeddings"),
                       std::invalid_argument);
  CHECK(parse_kv_dtype("f32") == KvDType::f32);
  CHECK_THROWS_AS(parse_kv_dtype("bf16"), std::invalid_argument);
}
