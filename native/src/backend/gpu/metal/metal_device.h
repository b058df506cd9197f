// The Metal implementation of the GPU device layer (macOS only: metal_device.mm, built when
// REDWING_HAVE_METAL is defined, see native/CMakeLists.txt and docs/macos.md).
#pragma once

#include <memory>
#include <vector>

#include "backend/gpu/device.h"

namespace redwing::gpu {

// The Metal devices this Mac has (the system default first); empty elsewhere.
std::vector<DeviceInfo> list_metal_devices();
// Opens Metal device `index` of list_metal_devices(); throws std::runtime_error.
std::unique_ptr<Device> open_metal_device(int index);

}  // namespace redwing::gpu
