// libFuzzer target: the native manifest reader (ModelDir::open) on a model directory whose
// manifest.json is the fuzz input. The directory also holds the files of the corpus's good MoE
// model (fixtures/manifest-corpus/good-moe), so inputs close to a real manifest get past the file
// checks and reach the architecture, tensor, region and expert checks; a directory that opens is
// then planned (runtime/memory_plan) the way the engine does before loading it. Any exception
// other than FormatError or SizeOverflow, and any sanitizer report, is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "format/checked.h"
#include "format/model_dir.h"
#include "runtime/memory_plan.h"

namespace fs = std::filesystem;

namespace {

fs::path g_dir;

void cleanup() {
  std::error_code ec;
  if (!g_dir.empty()) fs::remove_all(g_dir.parent_path(), ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const fs::path base =
      fs::temp_directory_path() / ("redwing-fuzz-manifest-" + std::to_string(::getpid()));
  g_dir = base / "model";
  fs::remove_all(base);
  fs::create_directories(g_dir);
  const fs::path good = fs::path(REDWING_FIXTURES_DIR) / "manifest-corpus" / "good-moe";
  fs::copy(good, g_dir, fs::copy_options::recursive);
  std::atexit(cleanup);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(g_dir / "manifest.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const redwing::ModelDir dir = redwing::ModelDir::open(g_dir.string());
    (void)redwing::plan_memory(dir, 64, 0, redwing::KvDType::f16, 16);
    (void)redwing::plan_memory(dir, 4096, 1, redwing::KvDType::f32, 128);
    for (int i = 0; i < dir.arch().num_layers; ++i) (void)dir.expert_layer(i);
    if (dir.has_tensor("norm")) (void)dir.load_f32("norm");
  } catch (const redwing::FormatError&) {
  } catch (const redwing::SizeOverflow&) {
  }
  return 0;
}
