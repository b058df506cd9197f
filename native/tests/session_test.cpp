// KvCache truncation (the sliding-window ring rule) and Engine sessions (prefix reuse, stop
// tokens, cancellation) on a tiny random model: every reused state must give what a fresh run
// over the same tokens gives.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "runtime/engine.h"
#include "synthetic_model.h"

namespace fs = std::filesystem;

namespace {

struct ModelFixture {
  fs::path path;
  ModelFixture() {
    path = fs::temp_directory_path() / ("redwing-session-test-" + std::to_string(::getpid()));
    fs::remove_all(path);
    synth::Writer w(synth::gemma4_moe_spec());  // sliding window 5
    w.build();
    w.write(path);
  }
  ~ModelFixture() { fs::remove_all(path); }
  redwing::EngineOptions options(int64_t chunk) const {
    redwing::EngineOptions o;
    o.model_dir = path.string();
    o.kv_dtype = redwing::KvDType::f32;
    o.chunk = chunk;
    o.threads = 2;
    return o;
  }
};

std::vector<int32_t> sequence(size_t n, int salt) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(static_cast<int32_t>(3 + (i * 37 + salt * 11) % 290));
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

}  // namespace

TEST_CASE("KvCache::truncate keeps exactly what a continuation needs") {
  ModelFixture fx;
  redwing::Engine engine(fx.options(2));  // sliding rings of window 5 + chunk 2 = 7 rows
  const int64_t vocab = engine.arch().vocab_size;
  const auto held = sequence(20, 1);
  int allowed = 0, refused = 0;
  for (int64_t n = 0; n <= 20; ++n) {
    CAPTURE(n);
    redwing::KvCache cache = engine.new_cache(32);
    std::vector<float> logits;
    for (int32_t t : held) engine.model().forward({&t, 1}, cache, redwing::LogitsFor::none, logits);
    // The rule, stated independently: continuing at n needs positions n-4 .. n-1 of the
    // window-5 layers, and a 7-row ring after 20 positions holds positions 13..19.
    const bool expected = n == 0 || n == 20 || std::max<int64_t>(0, n - 4) >= 13;
    REQUIRE(cache.can_truncate(n) == expected);
    if (!expected) {
      CHECK_THROWS_AS(cache.truncate(n), std::invalid_argument);
      ++refused;
      continue;
    }
    ++allowed;
    cache.truncate(n);
    CHECK(cache.length() == n);
    std::vector<int32_t> next = {41, 42};
    engine.model().forward(next, cache, redwing::LogitsFor::all, logits);
    std::vector<int32_t> fresh(held.begin(), held.begin() + n);
    fresh.insert(fresh.end(), next.begin(), next.end());
    auto all = engine.all_logits(fresh, false);
    std::vector<float> want(all.end() - 2 * vocab, all.end());
    CHECK(max_diff(logits, want) < 2e-4);
  }
  CHECK(allowed > 2);
  CHECK(refused > 2);
}

TEST_CASE("Session reuses prefixes and matches cold generation") {
  ModelFixture fx;
  redwing::Engine engine(fx.options(3));
  redwing::Session session(engine, 64);
  redwing::SessionRequest req;
  req.sampler.temperature = 0;
  req.max_new = 6;
  req.ignore_eos = true;
  req.prompt = sequence(9, 2);

  auto first = session.generate(req);
  CHECK(first.cached_tokens == 0);
  CHECK(first.prefill_tokens == 9);
  REQUIRE(first.tokens.size() == 6);
  // The cache holds the prompt and the generated tokens but the last one.
  CHECK(session.tokens().size() == 9 + 5);
  // A cold run (a fresh session) that stops at EOS: the same tokens up to there.
  auto cold = redwing::generate_once(engine, req.prompt, 6, req.sampler);
  const size_t n = cold.tokens.size();
  CHECK(std::vector<int32_t>(first.tokens.begin(), first.tokens.begin() + n) == cold.tokens);

  // Continue: prompt + output + two more tokens reuses everything the cache holds.
  req.prompt.insert(req.prompt.end(), first.tokens.begin(), first.tokens.end());
  req.prompt.push_back(7);
  req.prompt.push_back(8);
  req.ignore_eos = false;
  auto warm = session.generate(req);
  CHECK(warm.cached_tokens == 14);
  CHECK(warm.prefill_tokens == static_cast<int64_t>(req.prompt.size()) - 14);
  CHECK(warm.tokens == redwing::generate_once(engine, req.prompt, 6, req.sampler).tokens);

  // Stop tokens end generation with "stop" (the token is included).
  req.stop_ids = {warm.tokens.front()};
  auto stopped = session.generate(req);
  CHECK(stopped.stop_reason == "stop");
  CHECK(stopped.tokens == std::vector<int32_t>{warm.tokens.front()});

  // Cancellation before the first token: nothing generated, the cache stays usable.
  req.stop_ids.clear();
  int polls = 0;
  redwing::SessionCallbacks cb;
  cb.cancelled = [&] { return ++polls > 1; };
  req.prompt.push_back(9);
  auto cancelled = session.generate(req, cb);
  CHECK(cancelled.stop_reason == "cancelled");
  auto after = session.generate(req);
  CHECK(after.tokens == redwing::generate_once(engine, req.prompt, 6, req.sampler).tokens);

  // A prompt longer than the context is refused.
  req.prompt = sequence(65, 3);
  CHECK_THROWS_AS(session.generate(req), redwing::ContextOverflow);
}
