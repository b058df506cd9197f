// Test support: run the GPU tests through lavapipe (Mesa's software Vulkan driver, Debian's
// mesa-vulkan-drivers) where the machine has it, so they run on CI's GPU-less machine too.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace test_support {

// Keeps the driver library a driver file names loaded until the process ends. The Vulkan loader
// unloads it with the last instance, and with it the driver's globals that still point at blocks
// it allocated; LeakSanitizer, which scans at exit, then reported those blocks as leaks of an
// unknown module (seen with Mesa 22.3.6 on an AMD EPYC host). Kept loaded, they stay reachable.
inline void pin_driver_library(const char* icd) {
  std::ifstream in(icd);
  const nlohmann::json file = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!file.is_object() || !file.contains("ICD")) return;
  const std::string library = file["ICD"].value("library_path", "");
  if (!library.empty()) dlopen(library.c_str(), RTLD_NOW | RTLD_NODELETE);
}

// Points the Vulkan loader at lavapipe unless the environment already chose a driver (a real GPU
// on a developer's machine). Returns whether lavapipe's driver file exists here.
inline bool use_lavapipe() {
  for (const char* icd : {"/usr/share/vulkan/icd.d/lvp_icd.x86_64.json",
                          "/usr/share/vulkan/icd.d/lvp_icd.aarch64.json"}) {
    if (std::filesystem::exists(icd)) {
      setenv("VK_DRIVER_FILES", icd, 0);
      setenv("VK_ICD_FILENAMES", icd, 0);
      static const bool pinned = (pin_driver_library(icd), true);
      (void)pinned;
      return true;
    }
  }
  return false;
}

// The backends an engine test runs on: the CPU, and Vulkan through lavapipe where this build has
// it (streamed experts then go through the GPU's expert slots).
inline std::vector<std::string> engine_backends() {
#if defined(REDWING_HAVE_VULKAN)
  if (use_lavapipe()) return {"cpu", "vulkan"};
#endif
  return {"cpu"};
}

}  // namespace test_support
