// The engine end to end on tiny random models, against the independent double-precision
// reference in synthetic_model.h: every prefill chunk size and the decode path, f32 and f16 KV
// caches, sliding windows shorter than the prompt (so the ring buffer wraps), greedy generation.
#include <doctest/doctest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <string>

#include "runtime/engine.h"
#include "synthetic_model.h"

namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() /
           ("redwing-engine-test-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

struct Diff {
  double max_abs = 0;
  double argmax_agree = 0;  // fraction of positions
};

Diff compare(const std::vector<float>& got, const std::vector<synth::Vec>& ref) {
  Diff d;
  const size_t vocab = ref[0].size();
  REQUIRE(got.size() == ref.size() * vocab);
  size_t agree = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    size_t a = 0, b = 0;
    for (size_t i = 0; i < vocab; ++i) {
      d.max_abs = std::max(d.max_abs, std::abs(got[t * vocab + i] - ref[t][i]));
      if (got[t * vocab + i] > got[t * vocab + a]) a = i;
      if (ref[t][i] > ref[t][b]) b = i;
    }
    agree += a == b;
  }
  d.argmax_agree = static_cast<double>(agree) / ref.size();
  return d;
}

std::vector<int32_t> prompt_tokens(int n, int vocab) {
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return ids;
}

void check_model(const synth::Spec& spec, const std::string& tag) {
  TempDir dir(tag);
  synth::Writer w(spec);
  w.build();
  w.write(dir.path);
  const auto ids = prompt_tokens(13, spec.vocab);
  const auto ref = w.reference_logits(ids);

  for (int64_t chunk : {1, 3, 7, 128}) {
    redwing::EngineOptions o;
    o.model_dir = dir.path.string();
    o.kv_dtype = redwing::KvDType::f32;
    // The exact products: the default plan's 8-bit head is approximate (tests/engine-accuracy).
    o.activations = redwing::ActivationPlan::exact();
    o.chunk = chunk;
    o.threads = 2;
    redwing::Engine engine(o);
    CAPTURE(chunk);
    Diff prefill = compare(engine.all_logits(ids, false), ref);
    CHECK(prefill.max_abs < 2e-4);
    CHECK(prefill.argmax_agree == 1.0);
    if (chunk == 128) {
      Diff decode = compare(engine.all_logits(ids, true), ref);
      CHECK(decode.max_abs < 2e-4);
    }
  }

  // f16 KV: close, not exact.
  redwing::EngineOptions o;
  o.model_dir = dir.path.string();
  o.kv_dtype = redwing::KvDType::f16;
  o.activations = redwing::ActivationPlan::exact();
  o.chunk = 4;
  redwing::Engine engine(o);
  Diff f16 = compare(engine.all_logits(ids, false), ref);
  CHECK(f16.max_abs < 5e-2);
  CHECK(f16.max_abs > 0.0);  // the cache really is f16

  // Greedy generation follows the reference's argmax, token by token.
  std::vector<int32_t> seq(ids.begin(), ids.begin() + 6);
  std::vector<int32_t> expect;
  for (int k = 0; k < 6; ++k) {
    auto r = w.reference_logits(seq);
    const auto& last = r.back();
    int32_t best = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    expect.push_back(best);
    seq.push_back(best);
  }
  redwing::SamplerConfig greedy;
  greedy.temperature = 0;
  redwing::EngineOptions go;
  go.model_dir = dir.path.string();
  go.kv_dtype = redwing::KvDType::f32;
  go.activations = redwing::ActivationPlan::exact();
  go.chunk = 4;
  redwing::Engine gen(go);
  auto result =
      redwing::generate_once(gen, std::vector<int32_t>(ids.begin(), ids.begin() + 6), 6, greedy);
  // Generation stops early only at an end-of-sequence id.
  std::vector<int32_t> want = expect;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] == 1 || want[i] == 106) {
      want.resize(i + 1);
      break;
    }
  CHECK(result.tokens == want);
}

}  // namespace

TEST_CASE("gemma4 MoE engine matches the reference forward pass") {
  check_model(synth::gemma4_moe_spec(), "g4");
}

TEST_CASE("gemma3 engine matches the reference forward pass") {
  check_model(synth::gemma3_spec(), "g3");
}

TEST_CASE("gemma4 dense layers (no MoE) match the reference") {
  synth::Spec s = synth::gemma4_moe_spec();
  s.experts = 0;
  s.top_k = 0;
  for (auto& l : s.layers) l.moe = false;
  check_model(s, "g4dense");
}

TEST_CASE("running past the context is an error, not a truncation") {
  TempDir dir("ctx");
  synth::Writer w(synth::gemma3_spec());
  w.build();
  w.write(dir.path);
  redwing::EngineOptions o;
  o.model_dir = dir.path.string();
  o.chunk = 4;
  redwing::Engine engine(o);
  CHECK(engine.options().chunk == 4);
  redwing::EngineOptions unasked;
  unasked.model_dir = o.model_dir;
  CHECK(redwing::Engine(unasked).options().chunk == redwing::defaults::kPrefillChunk);
  redwing::KvCache cache = engine.new_cache(6);
  std::vector<float> logits;
  std::vector<int32_t> four = {2, 5, 6, 7};
  engine.model().forward(four, cache, redwing::LogitsFor::none, logits);
  CHECK(cache.length() == 4);
  CHECK_THROWS_AS(engine.model().forward(four, cache, redwing::LogitsFor::last, logits),
                  redwing::ContextOverflow);
  CHECK(cache.length() == 4);
  CHECK(logits.empty());
  std::vector<int32_t> two = {8, 9};
  engine.model().forward(two, cache, redwing::LogitsFor::last, logits);
  CHECK(logits.size() == static_cast<size_t>(engine.arch().vocab_size));
  // A token id outside the vocabulary is rejected with its value in the message.
  redwing::KvCache c2 = engine.new_cache(4);
  std::vector<int32_t> bad = {2, 100000};
  CHECK_THROWS_WITH_AS(engine.model().forward(bad, c2, redwing::LogitsFor::last, logits),
                       doctest::Contains("100000"), std::out_of_range);
}

namespace {

// -log softmax(row)[id] in double precision.
double reference_nll(const synth::Vec& row, int32_t id) {
  double top = row[0];
  for (double v : row) top = std::max(top, v);
  double sum = 0;
  for (double v : row) sum += std::exp(v - top);
  return top + std::log(sum) - row[static_cast<size_t>(id)];
}

}  // namespace

TEST_CASE("score_tokens gives the reference's log-likelihood over overlapping windows") {
  TempDir dir("score");
  const synth::Spec spec = synth::gemma4_moe_spec();
  synth::Writer w(spec);
  w.build();
  w.write(dir.path);
  const auto ids = prompt_tokens(23, spec.vocab);
  redwing::EngineOptions o;
  o.model_dir = dir.path.string();
  o.kv_dtype = redwing::KvDType::f32;
  o.activations = redwing::ActivationPlan::exact();
  o.chunk = 4;
  o.threads = 2;
  redwing::Engine engine(o);

  // The reference, written out directly: windows [begin, begin + window) every `stride` tokens;
  // token t is scored in the first window that contains it and t - 1.
  struct Case {
    int64_t window, stride;
    int64_t expect_windows;
  };
  for (const Case c :
       {Case{23, 22, 1}, Case{8, 7, 4}, Case{8, 3, 6}, Case{40, 10, 1}, Case{2, 1, 22}}) {
    CAPTURE(c.window);
    CAPTURE(c.stride);
    double want = 0;
    int64_t want_scored = 0;
    const auto n = static_cast<int64_t>(ids.size());
    int64_t scored_until = 1;
    for (int64_t begin = 0;; begin += c.stride) {
      const int64_t end = std::min(begin + c.window, n);
      std::vector<int32_t> win(ids.begin() + begin, ids.begin() + end);
      const auto logits = w.reference_logits(win);
      for (int64_t t = std::max(scored_until, begin + 1); t < end; ++t) {
        want += reference_nll(logits[static_cast<size_t>(t - begin - 1)], ids[t]);
        ++want_scored;
      }
      scored_until = end;
      if (end == n) break;
    }
    const redwing::TokenScores got = engine.score_tokens(ids, c.window, c.stride);
    CHECK(got.scored == n - 1);
    CHECK(got.scored == want_scored);
    CHECK(got.windows == c.expect_windows);
    CHECK(std::abs(got.nll_sum - want) < 1e-4 * static_cast<double>(want_scored));
  }
  // A short window really forgets: one window over everything differs from windows of 8.
  CHECK(std::abs(engine.score_tokens(ids, 23, 22).nll_sum -
                 engine.score_tokens(ids, 8, 7).nll_sum) > 1e-3);

  CHECK_THROWS_AS(engine.score_tokens(std::vector<int32_t>{2}, 8, 4), std::invalid_argument);
  CHECK_THROWS_AS(engine.score_tokens(ids, 8, 8), std::invalid_argument);
  CHECK_THROWS_AS(engine.score_tokens(ids, 1, 0), std::invalid_argument);
  CHECK_THROWS_WITH_AS(engine.score_tokens(std::vector<int32_t>{2, 100000}, 8, 4),
                       doctest::Contains("100000"), std::invalid_argument);
}
