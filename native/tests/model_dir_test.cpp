// Model directory checks: what a broken or foreign directory is rejected with.
#include <doctest/doctest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "format/model_dir.h"
#include "models/expert_source.h"
#include "models/model.h"
#include "synthetic_model.h"

namespace fs = std::filesystem;
using namespace redwing;
using nlohmann::json;

namespace {

struct Fixture {
  fs::path dir;
  Fixture() {
    dir = fs::temp_directory_path() / ("redwing-modeldir-test-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    synth::Writer w(synth::gemma4_moe_spec());
    w.build();
    w.write(dir);
  }
  ~Fixture() { fs::remove_all(dir); }

  json manifest() const {
    std::ifstream f(dir / "manifest.json");
    return json::parse(f);
  }
  void write_manifest(const json& m) const { std::ofstream(dir / "manifest.json") << m.dump(); }
};

std::string open_error(const fs::path& dir) {
  try {
    ModelDir::open(dir.string());
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a valid directory opens with its architecture and tensors") {
  Fixture fx;
  ModelDir d = ModelDir::open(fx.dir.string());
  CHECK(d.arch().family == "gemma4");
  CHECK(d.arch().num_layers == 4);
  CHECK(d.arch().layers[2].k_eq_v);
  CHECK(d.arch().layers[2].rope.rotary_pairs == 4);
  CHECK(d.arch().final_logit_softcap.value() == 30.0f);
  CHECK(d.arch().moe->top_k == 2);
  CHECK(d.arch().eos_token_ids == std::vector<int32_t>{1, 106});
  CHECK(d.load_f32("norm", 64).size() == 64);
  HostQuantMatrix q = d.quant("layers.0.router.proj", 8, 64);
  CHECK(q.bits == 8);
  CHECK(d.expert_layer(1) != nullptr);
  CHECK_THROWS_WITH_AS(d.load_f32("no.such.tensor"), doctest::Contains("no.such.tensor"),
                       FormatError);
  CHECK_THROWS_WITH_AS(d.quant("norm"), doctest::Contains("is plain"), FormatError);
  CHECK_THROWS_WITH_AS(d.quant("embed_tokens", 301, 64), doctest::Contains("expected [301, 64]"),
                       FormatError);
}

TEST_CASE("missing manifest, foreign format, unknown version") {
  Fixture fx;
  json m = fx.manifest();
  fs::rename(fx.dir / "manifest.json", fx.dir / "manifest.bak");
  CHECK(open_error(fx.dir).find("no manifest.json") != std::string::npos);
  fs::rename(fx.dir / "manifest.bak", fx.dir / "manifest.json");

  json bad = m;
  bad["format"] = "gguf";
  fx.write_manifest(bad);
  CHECK(open_error(fx.dir).find("redwing-model") != std::string::npos);

  bad = m;
  bad["format_version"] = 2;
  fx.write_manifest(bad);
  const std::string e = open_error(fx.dir);
  CHECK(e.find("version 2") != std::string::npos);
  CHECK(e.find("version 1") != std::string::npos);

  std::ofstream(fx.dir / "manifest.json") << "{ not json";
  CHECK(open_error(fx.dir).find("invalid JSON") != std::string::npos);
  CHECK(open_error(fx.dir / "nowhere").find("not found") != std::string::npos);

  // A writer's unfinished directory is never a model, even with a manifest inside.
  fx.write_manifest(m);
  const fs::path partial =
      fx.dir.parent_path() / (".model.partial-1-abc" + std::to_string(::getpid()));
  fs::rename(fx.dir, partial);
  CHECK(open_error(partial).find("partial directory") != std::string::npos);
  fs::rename(partial, fx.dir);
  CHECK(open_error(fx.dir).empty());
}

TEST_CASE("files: sizes, missing files, symbolic links, paths outside the directory") {
  Fixture fx;
  const json m = fx.manifest();
  {
    std::ofstream(fx.dir / "weights.bin", std::ios::app) << 'x';
    const std::string e = open_error(fx.dir);
    CHECK(e.find("weights.bin") != std::string::npos);
    CHECK(e.find("size") != std::string::npos);
    fs::resize_file(fx.dir / "weights.bin", fs::file_size(fx.dir / "weights.bin") - 1);
    CHECK(open_error(fx.dir).empty());
  }
  {
    fs::rename(fx.dir / "experts/layer_001.bin", fx.dir / "elsewhere.bin");
    CHECK(open_error(fx.dir).find("experts/layer_001.bin: listed in the manifest but missing") !=
          std::string::npos);
    fs::create_symlink(fx.dir / "elsewhere.bin", fx.dir / "experts/layer_001.bin");
    CHECK(open_error(fx.dir).find("symbolic links are not allowed") != std::string::npos);
    fs::remove(fx.dir / "experts/layer_001.bin");
    fs::rename(fx.dir / "elsewhere.bin", fx.dir / "experts/layer_001.bin");
    CHECK(open_error(fx.dir).empty());
  }
  for (const char* path :
       {"../weights.bin", "/etc/passwd", "experts/../weights.bin", "./weights.bin"}) {
    json bad = m;
    bad["files"].push_back({{"path", path}, {"size", 1}, {"sha256", std::string(64, '0')}});
    fx.write_manifest(bad);
    CHECK(open_error(fx.dir).find("not a plain relative path") != std::string::npos);
  }
  {
    json bad = m;
    bad["tensors"]["norm"]["offset"] = fs::file_size(fx.dir / "weights.bin");
    fx.write_manifest(bad);
    const std::string e = open_error(fx.dir);
    CHECK(e.find("\"norm\"") != std::string::npos);
    CHECK(e.find("lies outside weights.bin") != std::string::npos);
  }
  {
    json bad = m;
    bad["tensors"]["norm"]["offset"] = 32;  // not 64-aligned
    fx.write_manifest(bad);
    CHECK(open_error(fx.dir).find("multiple of 64") != std::string::npos);
  }
  {
    json bad = m;
    bad["tensors"]["embed_tokens"]["weight"]["nbytes"] = 4;
    fx.write_manifest(bad);
    CHECK(open_error(fx.dir).find("embed_tokens") != std::string::npos);
  }
}

TEST_CASE("a missing or unexpected tensor is named when the directory is opened") {
  Fixture fx;
  json m = fx.manifest();
  json bad = m;
  bad["tensors"].erase("layers.2.self_attn.k_norm");
  fx.write_manifest(bad);
  CHECK(open_error(fx.dir).find("\"layers.2.self_attn.k_norm\" is missing") != std::string::npos);
  bad = m;
  bad["tensors"]["layers.9.extra"] = m["tensors"]["norm"];
  fx.write_manifest(bad);
  // It shares norm's bytes, which is refused first or as an unexpected name: either names it.
  CHECK(open_error(fx.dir).find("layers.9.extra") != std::string::npos);
}

// Expert parts [2^62, 64] and [64, 2^62] with 4-bit weights and bf16 scales: every byte count
// (rows * cols * 4 / 8, rows * cols / 32 * 2) is a multiple of 2^64 and wraps to 0 in 64-bit
// arithmetic, so zero-byte regions "match" the shapes. Unchecked, the memory plan and the
// scratch buffers then overflow too and a kernel writes past a 1-byte buffer.
json wrapped_expert_manifest(json m) {
  const int64_t huge = int64_t{1} << 62;
  m["architecture"]["moe"]["intermediate_size"] = huge;
  for (auto& [key, layer] : m["experts"]["layers"].items())
    for (auto& [name, part] : layer["parts"].items()) {
      part["shape"] = name == "down_proj" ? json::array({64, huge}) : json::array({huge, 64});
      part["group_size"] = 32;
      part["scale_dtype"] = "bf16";
      for (const char* r : {"weight", "scales", "biases"}) part[r] = {{"offset", 0}, {"nbytes", 0}};
    }
  return m;
}

TEST_CASE("sizes that wrap around 64 bits are refused, naming the field") {
  Fixture fx;
  const json good = fx.manifest();
  fx.write_manifest(wrapped_expert_manifest(good));
  CHECK(open_error(fx.dir).find("architecture.moe.intermediate_size must be an integer") !=
        std::string::npos);
  // Within every field's range, the product still does not fit: checked arithmetic names it.
  json m = good;
  const int64_t big = 2147483616;  // a multiple of 32 below 2^31
  m["experts"]["layers"]["0"]["parts"]["gate_proj"]["shape"] = json::array({big, big});
  m["experts"]["layers"]["0"]["parts"]["gate_proj"]["bits"] = 8;
  fx.write_manifest(m);
  const std::string e = open_error(fx.dir);
  INFO(e);
  CHECK(e.find("experts.layers[\"0\"].parts.gate_proj.weight bytes overflows") !=
        std::string::npos);
}

TEST_CASE("numbers are range-checked, not truncated to the C++ type") {
  Fixture fx;
  const json m = fx.manifest();
  const auto with = [&](const std::function<void(json&)>& edit) {
    json bad = m;
    edit(bad);
    fx.write_manifest(bad);
    return open_error(fx.dir);
  };
  // 2^32 + 1 truncated to int is 1.
  CHECK(with([](json& j) {
          j["format_version"] = (uint64_t{1} << 32) + 1;
        }).find("format_version 4294967297 is not supported") != std::string::npos);
  CHECK(with([](json& j) {
          j["architecture"]["num_layers"] = (uint64_t{1} << 32) + 4;
        }).find("architecture.num_layers must be an integer") != std::string::npos);
  CHECK(with([](json& j) {
          j["architecture"]["embed_scale"] = 1e30;
        }).find("architecture.embed_scale must be a number in") != std::string::npos);
  CHECK(with([](json& j) {
          j["architecture"]["rms_norm_eps"] = 0;
        }).find("architecture.rms_norm_eps") != std::string::npos);
  CHECK(with([](json& j) {
          j["architecture"]["layers"][0]["rope"]["theta"] = 1e300;
        }).find("rope.theta") != std::string::npos);
  CHECK(with([](json& j) {
          j["tensors"]["norm"]["offset"] = -64;
        }).find("\"norm\".offset must be an integer") != std::string::npos);
}

TEST_CASE("a byte order mark, overlapping regions and unlisted files are refused") {
  Fixture fx;
  const json m = fx.manifest();
  std::ofstream(fx.dir / "manifest.json") << "\xEF\xBB\xBF" << m.dump();
  CHECK(open_error(fx.dir).find("byte order mark") != std::string::npos);

  json bad = m;
  bad["tensors"]["layers.0.input_layernorm"]["offset"] = m["tensors"]["norm"]["offset"];
  fx.write_manifest(bad);
  CHECK(open_error(fx.dir).find("overlap") != std::string::npos);

  fx.write_manifest(m);
  std::ofstream(fx.dir / "notes.txt") << "hello";
  CHECK(open_error(fx.dir).find("notes.txt: not listed in the manifest") != std::string::npos);
  fs::remove(fx.dir / "notes.txt");
  CHECK(open_error(fx.dir) == "");
}
