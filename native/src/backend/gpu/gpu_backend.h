// The GPU backend: every op of backend.h implemented once over the device layer (device.h).
// Also the backend selection shared by the tools and the service (cpu | vulkan | auto).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/gpu/device.h"

namespace redwing {

// A backend over an open device.
std::unique_ptr<Backend> make_gpu_backend(std::unique_ptr<gpu::Device> device);

// The device of a GPU backend (nullptr for other backends): tests and benchmarks read its
// counters (submissions, per-kernel times).
gpu::Device* gpu_device_of(Backend& backend);

// Dependent dispatches recorded without barriers (REDWING_GPU_CHAIN, gpu-kernels/chain.glsl),
// after a flush: the waits that gave up, and whether every counter holds the number of
// workgroups the host recorded on it. nullopt for a backend that is not a GPU one.
struct ChainCheck {
  uint32_t failures = 0;
  bool counts_match = false;
};
std::optional<ChainCheck> gpu_chain_check(Backend& backend);

}  // namespace redwing
