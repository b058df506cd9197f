// Backend selection shared by the tools and the service: `cpu`, `metal`, `vulkan` or `auto`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace redwing {

// A backend this machine can run, for the service's hello and `--backend` help.
struct BackendInfo {
  std::string name;           // "cpu", "metal" or "vulkan"
  std::string device;         // e.g. "NVIDIA H200"; the CPU's features for "cpu"
  uint64_t memory_bytes = 0;  // device memory (0 for the CPU)
  bool software = false;      // a CPU implementation of a GPU API (lavapipe)
  bool discrete = false;
};

// Whether this build has the Vulkan backend.
bool vulkan_built();
// Whether this build has the Metal backend (a native macOS build).
bool metal_built();

// The CPU, then every Metal device (macOS), then every Vulkan device (when built with Vulkan and a
// driver answers).
std::vector<BackendInfo> available_backends();

// cpu: the CPU backend with `threads` threads. vulkan: the first discrete GPU, else the first
// hardware GPU, else a software device (lavapipe); REDWING_VULKAN_DEVICE=<index> picks one.
// metal: Metal device REDWING_METAL_DEVICE=<index>, else the system default (macOS builds only).
// auto: Metal on a Mac with an Apple GPU; else a discrete (or Apple) Vulkan GPU when there is
// one; the CPU otherwise; never a software device.
// Throws std::invalid_argument for an unknown name and std::runtime_error when the backend is
// not available here.
std::unique_ptr<Backend> make_backend(const std::string& kind, int threads);

// The name `auto` resolves to on this machine.
std::string resolve_backend(const std::string& kind);

}  // namespace redwing
