// The GPU device layer: the little that differs between GPU APIs. The GPU backend
// (gpu_backend.cpp) implements every op of backend.h once over this interface; a device only
// provides memory, the compiled kernels, ordered command recording and synchronization.
// Vulkan (vulkan/) is the first implementation; a Metal device would implement the same class
// over the same kernels translated by SPIRV-Cross (docs/gpu.md).
//
// Commands are recorded, not run: write(), fill_zero(), copy() and dispatch() append to the
// current batch in call order, and nothing runs until flush() (or read(), which flushes). The
// device does not track hazards: the caller inserts barrier() between commands where a later
// one reads or writes memory an earlier one wrote (or writes memory an earlier one read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace redwing::gpu {

// The compute kernels (gpu-kernels/<name>.comp). Every kernel uses the bindings of set 0 in
// order and one block of push constants (at most kMaxPushBytes).
enum class Kernel : int {
  qmatvec,
  qmatmul,
  embed,
  rms_norm,
  elementwise,
  rope,
  gather_rows,
  scatter_add_rows,
  kv_store,
  attention_partial,
  attention_combine,
  route,
  moe_matvec,
  moe_combine,
  penalize,
  topk_partial,
  topk_merge,
  norm_rope,
  // moe_matvec's down product: the same kernel (moe_matvec.comp), a name of its own so that the
  // per-kernel times show the experts' two products apart.
  moe_matvec_down,
  ffn_tail,
  count,
};
// The name a profile shows.
const char* kernel_name(Kernel k);
// The kernel's source, gpu-kernels/<name>.comp (the function name in the Metal library).
const char* kernel_source_name(Kernel k);
constexpr int kMaxBindings = 6;
constexpr size_t kMaxPushBytes = 128;

struct DeviceInfo {
  std::string api;            // "vulkan"
  std::string name;           // e.g. "NVIDIA H200", "llvmpipe (LLVM 15.0.6, 256 bits)"
  bool discrete = false;      // a discrete GPU, or an integrated one with its own memory (Apple)
  bool software = false;      // a CPU implementation (lavapipe): never chosen automatically
  uint64_t memory_bytes = 0;  // the largest device-local heap
  uint64_t max_binding_bytes = 0;  // the most one storage binding may cover
  uint64_t binding_alignment = 0;  // required alignment of a binding's offset
  // Threads per workgroup of the kernels whose shape is a specialization constant (constant_id
  // 0: the products, norms, attention and sampling passes; each kernel derives its loop strides
  // from it). Real GPUs take kGpuWorkgroupThreads; a CPU device (lavapipe) runs every idle lane
  // and every barrier of a workgroup on one core, so it takes kCpuWorkgroupThreads.
  uint32_t workgroup_threads = 256;
};
constexpr uint32_t kGpuWorkgroupThreads = 256;
constexpr uint32_t kCpuWorkgroupThreads = 64;
// The workgroup_threads a device of this kind uses: REDWING_GPU_WORKGROUP (64, 128 or 256)
// when set (tests and benchmarks force either shape with it), else by the device type.
uint32_t choose_workgroup_threads(bool software);
// Whether n is a shape the kernels accept (a power of two from 64 to 256: qmatmul stages a
// fixed 1,024 vec4s over at most 16 per thread; the shared arrays hold 256).
bool valid_workgroup_threads(uint32_t n);

// Device memory, zero-initialized.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual size_t size_bytes() const = 0;
};

// A storage-buffer binding: `bytes` of `buffer` from `offset` (aligned to
// DeviceInfo::binding_alignment, at most max_binding_bytes).
struct Binding {
  const DeviceBuffer* buffer = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceInfo& info() const = 0;

  virtual std::unique_ptr<DeviceBuffer> create_buffer(size_t bytes) = 0;
  // Device memory currently allocated through create_buffer (for the memory report).
  virtual uint64_t allocated_bytes() const = 0;

  // Records a copy of host data (taken now) into dst.
  virtual void write(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) = 0;
  // Flushes the recorded commands, waits for them, then copies device data to the host.
  virtual void read(const DeviceBuffer& src, size_t offset, void* dst, size_t bytes) = 0;
  // Records a dispatch of groups_x * groups_y * groups_z workgroups.
  virtual void dispatch(Kernel kernel, std::span<const Binding> bindings, const void* push,
                        size_t push_bytes, uint32_t groups_x, uint32_t groups_y,
                        uint32_t groups_z) = 0;
  // Records a full memory barrier between what was recorded before and what comes after.
  virtual void barrier() = 0;
  // Submits everything recorded and waits for it to finish.
  virtual void flush() = 0;
  // Starts what is recorded so far without waiting for it (flush() still waits for it); the
  // default leaves it for the next flush.
  virtual void submit() {}
  // Submissions since the device was created (for tests and benchmarks).
  virtual uint64_t submissions() const = 0;

  // Per-kernel GPU time, when enabled: each dispatch is bracketed by timestamps and the totals
  // accumulate at every flush.
  virtual void enable_timestamps(bool on) = 0;
  struct KernelTime {
    uint64_t dispatches = 0;
    double ms = 0;
  };
  virtual std::vector<KernelTime> kernel_times() const = 0;  // indexed by Kernel
};

// The Vulkan devices this machine has (empty when there is no Vulkan loader or driver).
std::vector<DeviceInfo> list_vulkan_devices();
// Opens Vulkan device `index` of list_vulkan_devices(); throws std::runtime_error.
// workgroup_threads 0: choose_workgroup_threads() for the device; else that shape (tests).
std::unique_ptr<Device> open_vulkan_device(int index, uint32_t workgroup_threads = 0);

// The embedded SPIR-V of a kernel (generated at build time from gpu-kernels/).
std::span<const uint32_t> kernel_spirv(Kernel k);

}  // namespace redwing::gpu
