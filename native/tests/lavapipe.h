// Test support: run the GPU tests through lavapipe (Mesa's software Vulkan driver, Debian's
// mesa-vulkan-drivers) where the machine has it, so they run on CI's GPU-less machine too.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace test_support {

// Points the Vulkan loader at lavapipe unless the environment already chose a driver (a real GPU
// on a developer's machine). Returns whether lavapipe's driver file exists here.
inline bool use_lavapipe() {
  for (const char* icd : {"/usr/share/vulkan/icd.d/lvp_icd.x86_64.json",
                          "/usr/share/vulkan/icd.d/lvp_icd.aarch64.json"}) {
    if (std::filesystem::exists(icd)) {
      setenv("VK_DRIVER_FILES", icd, 0);
      setenv("VK_ICD_FILENAMES", icd, 0);
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
