// Model directory checks: what a broken or foreign directory is rejected with.
#include <doctest/doctest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "format/model_dir.h"
#include "models/model.h"
#include "runtime/expert_source.h"
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
    CHECK(e.find("outside the file") != std::string::npos);
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

TEST_CASE("a missing tensor is named when the model is built") {
  Fixture fx;
  json m = fx.manifest();
  m["tensors"].erase("layers.2.self_attn.k_norm");
  fx.write_manifest(m);
  ModelDir d = ModelDir::open(fx.dir.string());
  auto backend = make_cpu_backend(1);
  ResidentExpertSource experts(d);
  CHECK_THROWS_WITH_AS(load_model(d, *backend, &experts),
                       doctest::Contains("layers.2.self_attn.k_norm"), FormatError);
}
