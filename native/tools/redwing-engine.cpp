// redwing-engine: the native engine's command line.
//
//   redwing-engine logits --model DIR --tokens 2,17,99 [--mode prefill|decode]
//                         [--kv-dtype f16|f32] [--chunk 128] [--threads N]
//       prints {"logits": [[...vocab floats...], ...]}, one row per input position
//   redwing-engine generate --model DIR --tokens 2,17,99 --max-new N [--temperature 0.2]
//                         [--top-k 64] [--top-p 0.95] [--repetition-penalty 1.0] [--seed S]
//                         [--kv-dtype f16|f32] [--chunk 128] [--threads N]
//       prints {"tokens": [...], "stop_reason": "eos"|"length", timings}
//
// Errors go to stderr; the exit status is 2 for bad usage, 1 for any other failure.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage: redwing-engine logits --model DIR --tokens IDS [--mode prefill|decode]\n"
    "                             [--kv-dtype f16|f32] [--chunk N] [--threads N]\n"
    "       redwing-engine generate --model DIR --tokens IDS --max-new N [--temperature T]\n"
    "                             [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]\n"
    "                             [--kv-dtype f16|f32] [--chunk N] [--threads N]\n";

// --name value pairs; every name must be one the command knows.
std::map<std::string, std::string> parse_flags(int argc, char** argv, int first,
                                               const std::vector<std::string>& known) {
  std::map<std::string, std::string> out;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument \"" + a + "\"");
    std::string name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) throw UsageError("--" + name + " needs a value");
      value = argv[++i];
    }
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw UsageError("unknown option --" + name);
    out[name] = value;
  }
  return out;
}

template <typename T>
T parse_number(const std::string& s, const std::string& what) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size())
    throw UsageError("--" + what + ": \"" + s + "\" is not a valid number");
  return v;
}

std::vector<int32_t> parse_tokens(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string part = s.substr(i, j - i);
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    while (!part.empty() && part.back() == ' ') part.pop_back();
    if (part.empty()) throw UsageError("--tokens: empty token id in \"" + s + "\"");
    int32_t v = parse_number<int32_t>(part, "tokens");
    if (v < 0) throw UsageError("--tokens: negative token id " + part);
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

std::string need(const std::map<std::string, std::string>& f, const std::string& name) {
  auto it = f.find(name);
  if (it == f.end()) throw UsageError("--" + name + " is required");
  return it->second;
}

redwing::EngineOptions engine_options(const std::map<std::string, std::string>& f) {
  redwing::EngineOptions o;
  o.model_dir = need(f, "model");
  if (f.count("threads")) o.threads = parse_number<int>(f.at("threads"), "threads");
  if (f.count("chunk")) o.chunk = parse_number<int64_t>(f.at("chunk"), "chunk");
  if (o.chunk <= 0) throw UsageError("--chunk must be positive");
  if (f.count("kv-dtype")) {
    try {
      o.kv_dtype = redwing::parse_kv_dtype(f.at("kv-dtype"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--kv-dtype: ") + e.what());
    }
  }
  return o;
}

// Writes the shortest decimal form that reads back as the same float. JSON has no NaN or
// infinity: those become null (and count as an error, see cmd_logits).
bool put_float(std::string& out, float v) {
  if (!std::isfinite(v)) {
    out += "null";
    return false;
  }
  char buf[32];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, p);
  return true;
}

int cmd_logits(int argc, char** argv) {
  auto f = parse_flags(argc, argv, 2, {"model", "tokens", "mode", "kv-dtype", "chunk", "threads"});
  auto tokens = parse_tokens(need(f, "tokens"));
  std::string mode = f.count("mode") ? f.at("mode") : "prefill";
  if (mode != "prefill" && mode != "decode") throw UsageError("--mode must be prefill or decode");
  redwing::Engine engine(engine_options(f));
  const auto logits = engine.all_logits(tokens, mode == "decode");
  const size_t vocab = static_cast<size_t>(engine.arch().vocab_size);
  std::string out;
  out.reserve(logits.size() * 12 + 64);
  size_t non_finite = 0;
  out += "{\"logits\": [";
  for (size_t t = 0; t < tokens.size(); ++t) {
    out += t ? ",\n[" : "\n[";
    for (size_t i = 0; i < vocab; ++i) {
      if (i) out += ',';
      if (!put_float(out, logits[t * vocab + i])) ++non_finite;
    }
    out += ']';
  }
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (non_finite > 0) {
    std::fprintf(stderr, "redwing-engine: %zu logits are NaN or infinite (written as null)\n",
                 non_finite);
    return 1;
  }
  return 0;
}

int cmd_generate(int argc, char** argv) {
  auto f = parse_flags(argc, argv, 2,
                       {"model", "tokens", "max-new", "temperature", "top-k", "top-p",
                        "repetition-penalty", "seed", "kv-dtype", "chunk", "threads"});
  auto tokens = parse_tokens(need(f, "tokens"));
  const int max_new = parse_number<int>(need(f, "max-new"), "max-new");
  if (max_new < 0) throw UsageError("--max-new must be >= 0");
  redwing::SamplerConfig s;
  if (f.count("temperature"))
    s.temperature = parse_number<float>(f.at("temperature"), "temperature");
  if (f.count("top-k")) s.top_k = parse_number<int>(f.at("top-k"), "top-k");
  if (f.count("top-p")) s.top_p = parse_number<float>(f.at("top-p"), "top-p");
  if (f.count("repetition-penalty"))
    s.repetition_penalty = parse_number<float>(f.at("repetition-penalty"), "repetition-penalty");
  s.seed = f.count("seed") ? parse_number<uint64_t>(f.at("seed"), "seed") : std::random_device{}();
  try {
    redwing::Sampler check(s);  // reject bad settings before loading the model
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  redwing::Engine engine(engine_options(f));
  auto r = engine.generate(tokens, max_new, s);
  std::string out = "{\"tokens\": [";
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(r.tokens[i]);
  }
  out += "], \"stop_reason\": \"" + r.stop_reason + "\"";
  char buf[256];
  const double decode_tps = r.decode_seconds > 0 && r.tokens.size() > 1
                                ? static_cast<double>(r.tokens.size() - 1) / r.decode_seconds
                                : 0.0;
  std::snprintf(buf, sizeof(buf),
                ", \"prompt_tokens\": %zu, \"prefill_seconds\": %.6f, \"decode_seconds\": %.6f, "
                "\"decode_tokens_per_second\": %.3f, \"seed\": %llu}\n",
                tokens.size(), r.prefill_seconds, r.decode_seconds, decode_tps,
                static_cast<unsigned long long>(s.seed));
  out += buf;
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
      std::fputs(kUsage, argc < 2 ? stderr : stdout);
      return argc < 2 ? 2 : 0;
    }
    const std::string cmd = argv[1];
    if (cmd == "logits") return cmd_logits(argc, argv);
    if (cmd == "generate") return cmd_generate(argc, argv);
    throw UsageError("unknown command \"" + cmd + "\"");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "redwing-engine: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "redwing-engine: %s\n", e.what());
    return 1;
  }
}
