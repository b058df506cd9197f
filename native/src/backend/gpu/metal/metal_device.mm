// The Metal implementation of the GPU device layer (device.h), Objective-C++ with ARC. Everything
// else the Metal backend does is the shared GPU backend (gpu_backend.cpp) that the Vulkan tests
// exercise; this file only maps the layer onto Metal (docs/macos.md):
//
// - Kernels: the MSL in metal-kernels/ (SPIRV-Cross's translation of gpu-kernels/), compiled at
//   build time into one metallib that is embedded in the binary (REDWING_METALLIB_HEADER). Each
//   kernel is a function named after it; its push constants are [[buffer(0)]] and Vulkan
//   binding b is [[buffer(b + 1)]] (scripts/metal-kernels.mjs). MSL does not declare the
//   workgroup size, so the host passes it from metal-kernels/workgroup_sizes.inc.
// - Memory: every buffer is MTLResourceStorageModeShared: on Apple silicon the CPU and GPU see
//   the same pages, so a write made while no command is recorded is a plain memcpy into the
//   buffer (weights at load: no staging copy), and reads need no copy back either. A write made
//   while commands are recorded must not be seen by them: it goes through a staging buffer and
//   a blit, in order, as on Vulkan.
// - Commands: one command buffer per flush; dispatches go into a concurrent compute encoder and
//   barrier() is memoryBarrierWithScope:MTLBarrierScopeBuffers (the layer's caller inserts
//   barriers exactly where a later command depends on an earlier one). Command buffers retain the
//   buffers they use, so a DeviceBuffer destroyed while recorded work may use it stays alive.
// - Timestamps: Apple GPUs sample counters only at encoder boundaries, not around a dispatch;
//   with timestamps on, every dispatch is committed in its own command buffer and timed with
//   the command buffer's GPUStartTime/GPUEndTime (in order on the one queue; slower, as the
//   Vulkan timestamps are).
#if !__has_feature(objc_arc)
#error "metal_device.mm needs ARC (-fobjc-arc)"
#endif

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/gpu/metal/metal_device.h"
#include REDWING_METALLIB_HEADER  // const unsigned char kRedwingMetallib[]; size_t ...Size

namespace redwing::gpu {
namespace {

struct WorkgroupSize {
  const char* name;
  uint32_t x, y, z;
};
const WorkgroupSize kWorkgroupSizes[] = {
#include "workgroup_sizes.inc"
};

WorkgroupSize workgroup_size(Kernel k) {
  for (const auto& w : kWorkgroupSizes)
    if (std::strcmp(w.name, kernel_source_name(k)) == 0) return w;
  throw std::logic_error(std::string("metal: no workgroup size for kernel ") +
                         kernel_source_name(k));
}

std::string describe_error(NSError* error) {
  return error ? std::string(error.localizedDescription.UTF8String) : std::string("unknown error");
}

// The Metal devices, the system default first (the GPU a Mac's display uses).
NSArray<id<MTLDevice>>* all_devices() {
  NSMutableArray<id<MTLDevice>>* out = [NSMutableArray array];
  id<MTLDevice> preferred = MTLCreateSystemDefaultDevice();
  if (preferred) [out addObject:preferred];
  for (id<MTLDevice> d in MTLCopyAllDevices())
    if (d.registryID != preferred.registryID) [out addObject:d];
  return out;
}

DeviceInfo describe(id<MTLDevice> device) {
  DeviceInfo info;
  info.api = "metal";
  info.name = device.name.UTF8String;
  // Apple silicon (Apple7 = M1 and later; MSL 3.0 needs it): integrated but with its own fast
  // unified memory, counted with the discrete GPUs (as the Vulkan layer counts an Apple GPU
  // through MoltenVK). An Intel Mac's low-power integrated GPU is not preferred.
  info.discrete = [device supportsFamily:MTLGPUFamilyApple7] || !device.isLowPower;
  info.software = false;
  info.memory_bytes = device.recommendedMaxWorkingSetSize;
  // The kernels index words with 32-bit integers: keep a binding under 4 GiB.
  info.max_binding_bytes = std::min<uint64_t>(device.maxBufferLength, 0xffffffffull);
  // The strictest offset rule Metal has for buffer arguments (constant buffers on macOS).
  info.binding_alignment = 256;
  // Decode attention's splits merged by a second dispatch: the one-dispatch merge relies on one
  // workgroup seeing another's device-memory writes within a dispatch, which this device has not
  // been measured or tested on (docs/gpu.md, "Eleventh round").
  info.attention.merge_in_last_workgroup = false;
  info.workgroups_see_writes = false;  // likewise the router's routing epilogue
  return info;
}

class MetalBuffer final : public DeviceBuffer {
 public:
  MetalBuffer(id<MTLBuffer> buffer, size_t bytes, uint64_t* allocated)
      : buffer_(buffer), bytes_(bytes), allocated_(allocated) {
    *allocated_ += bytes_;
  }
  // Releases this reference; command buffers that use it hold their own until they complete.
  ~MetalBuffer() override { *allocated_ -= bytes_; }
  size_t size_bytes() const override { return bytes_; }
  id<MTLBuffer> buffer() const { return buffer_; }
  // The buffer's memory, shared with the GPU (for zero-copy reads into it, docs/macos.md).
  std::byte* contents() const { return static_cast<std::byte*>(buffer_.contents); }

 private:
  id<MTLBuffer> buffer_;
  size_t bytes_;
  uint64_t* allocated_;  // the device's counter; the device outlives its buffers
};

class MetalDevice final : public Device {
 public:
  explicit MetalDevice(int index);
  ~MetalDevice() override;

  const DeviceInfo& info() const override { return info_; }
  std::unique_ptr<DeviceBuffer> create_buffer(size_t bytes) override;
  uint64_t allocated_bytes() const override { return allocated_; }
  void write(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) override;
  void read(const DeviceBuffer& src, size_t offset, void* dst, size_t bytes) override;
  void dispatch(Kernel kernel, std::span<const Binding> bindings, const void* push,
                size_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) override;
  void barrier() override;
  void flush() override;
  uint64_t submissions() const override { return submissions_; }
  void enable_timestamps(bool on) override { timestamps_ = on; }
  std::vector<KernelTime> kernel_times() const override { return times_; }

 private:
  id<MTLBuffer> new_shared_buffer(size_t bytes);
  id<MTLComputePipelineState> pipeline(Kernel k);
  id<MTLCommandBuffer> commands();
  id<MTLComputeCommandEncoder> compute_encoder();
  void end_encoder();
  void submit(bool wait);

  DeviceInfo info_;
  id<MTLDevice> device_;
  id<MTLCommandQueue> queue_;
  id<MTLLibrary> library_;
  std::array<id<MTLComputePipelineState>, static_cast<size_t>(Kernel::count)> pipelines_{};
  id<MTLBuffer> dummy_;  // bound to binding slots an op leaves empty

  id<MTLCommandBuffer> cmd_;  // nil when nothing is recorded
  id<MTLComputeCommandEncoder> compute_;
  id<MTLBlitCommandEncoder> blit_;
  bool barrier_pending_ = false;

  // Staging for writes made while commands are recorded: an arena reset at every flush, and
  // dedicated buffers for large writes (released with the command buffer that copies them).
  static constexpr size_t kArenaBytes = 8u << 20;
  id<MTLBuffer> arena_;
  size_t arena_used_ = 0;

  uint64_t allocated_ = 0;
  uint64_t submissions_ = 0;
  bool timestamps_ = false;
  std::vector<std::pair<id<MTLCommandBuffer>, Kernel>> timed_;  // committed, not yet read
  std::vector<KernelTime> times_;
};

MetalDevice::MetalDevice(int index) {
  @autoreleasepool {
    NSArray<id<MTLDevice>>* devices = all_devices();
    if (index < 0 || index >= static_cast<int>(devices.count))
      throw std::runtime_error("metal: no device " + std::to_string(index));
    device_ = devices[static_cast<NSUInteger>(index)];
    info_ = describe(device_);
    queue_ = [device_ newCommandQueue];
    if (!queue_) throw std::runtime_error("metal: " + info_.name + ": no command queue");
    // The embedded metallib (the default destructor makes Metal keep its own copy; it is small).
    dispatch_data_t data = dispatch_data_create(kRedwingMetallib, kRedwingMetallibSize, nullptr,
                                                DISPATCH_DATA_DESTRUCTOR_DEFAULT);
    NSError* error = nil;
    library_ = [device_ newLibraryWithData:data error:&error];
    if (!library_) throw std::runtime_error("metal: loading the kernels: " + describe_error(error));
    dummy_ = new_shared_buffer(256);
    arena_ = new_shared_buffer(kArenaBytes);
    times_.resize(static_cast<size_t>(Kernel::count));
  }
}

MetalDevice::~MetalDevice() {
  try {
    flush();
  } catch (...) {
    // A failed last batch has nothing left to report to.
  }
}

id<MTLBuffer> MetalDevice::new_shared_buffer(size_t bytes) {
  id<MTLBuffer> b = [device_ newBufferWithLength:std::max<size_t>(bytes, 16)
                                         options:MTLResourceStorageModeShared];
  if (!b)
    throw std::runtime_error("metal: out of memory allocating " + std::to_string(bytes) +
                             " bytes on " + info_.name);
  // Zeroed by the CPU: no command can use a buffer that does not exist yet.
  std::memset(b.contents, 0, b.length);
  return b;
}

std::unique_ptr<DeviceBuffer> MetalDevice::create_buffer(size_t bytes) {
  @autoreleasepool {
    return std::make_unique<MetalBuffer>(new_shared_buffer(bytes), bytes, &allocated_);
  }
}

id<MTLComputePipelineState> MetalDevice::pipeline(Kernel k) {
  id<MTLComputePipelineState>& p = pipelines_[static_cast<size_t>(k)];
  if (p) return p;
  NSString* name = [NSString stringWithUTF8String:kernel_source_name(k)];
  id<MTLFunction> function = [library_ newFunctionWithName:name];
  if (!function)
    throw std::runtime_error(std::string("metal: no function ") + kernel_source_name(k) +
                             " in the embedded metallib");
  NSError* error = nil;
  p = [device_ newComputePipelineStateWithFunction:function error:&error];
  if (!p)
    throw std::runtime_error(std::string("metal: pipeline ") + kernel_name(k) + ": " +
                             describe_error(error));
  const WorkgroupSize w = workgroup_size(k);
  if (w.x * w.y * w.z > p.maxTotalThreadsPerThreadgroup)
    throw std::runtime_error(std::string("metal: ") + kernel_name(k) + " needs " +
                             std::to_string(w.x * w.y * w.z) + " threads per threadgroup, " +
                             info_.name + " allows " +
                             std::to_string(p.maxTotalThreadsPerThreadgroup));
  return p;
}

id<MTLCommandBuffer> MetalDevice::commands() {
  if (!cmd_) {
    cmd_ = [queue_ commandBuffer];
    if (!cmd_) throw std::runtime_error("metal: no command buffer");
  }
  return cmd_;
}

void MetalDevice::end_encoder() {
  if (compute_) [compute_ endEncoding];
  if (blit_) [blit_ endEncoding];
  compute_ = nil;
  blit_ = nil;
  // Encoders of one command buffer are ordered for the (hazard-tracked) buffers they share, so a
  // barrier pending at the end of an encoder is already honoured.
  barrier_pending_ = false;
}

id<MTLComputeCommandEncoder> MetalDevice::compute_encoder() {
  if (!compute_) {
    end_encoder();
    compute_ = [commands() computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    if (!compute_) throw std::runtime_error("metal: no compute encoder");
  }
  if (barrier_pending_) {
    [compute_ memoryBarrierWithScope:MTLBarrierScopeBuffers];
    barrier_pending_ = false;
  }
  return compute_;
}

void MetalDevice::write(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  auto& d = static_cast<MetalBuffer&>(dst);
  if (offset + bytes > d.size_bytes()) throw std::logic_error("gpu write outside the buffer");
  if (!cmd_ && timed_.empty()) {
    // Nothing recorded and nothing in flight (flush waits): the GPU cannot see this early.
    std::memcpy(d.contents() + offset, src, bytes);
    return;
  }
  @autoreleasepool {
    id<MTLBuffer> from;
    size_t from_offset = 0;
    if (bytes <= kArenaBytes / 4) {
      if (arena_used_ + bytes > kArenaBytes) {
        flush();
        std::memcpy(d.contents() + offset, src, bytes);
        return;
      }
      from = arena_;
      from_offset = arena_used_;
      arena_used_ = (arena_used_ + bytes + 15) / 16 * 16;
    } else {
      from = new_shared_buffer(bytes);
    }
    std::memcpy(static_cast<std::byte*>(from.contents) + from_offset, src, bytes);
    if (!blit_) {
      end_encoder();
      blit_ = [commands() blitCommandEncoder];
      if (!blit_) throw std::runtime_error("metal: no blit encoder");
    }
    [blit_ copyFromBuffer:from
             sourceOffset:from_offset
                 toBuffer:d.buffer()
        destinationOffset:offset
                     size:bytes];
  }
}

void MetalDevice::read(const DeviceBuffer& src, size_t offset, void* dst, size_t bytes) {
  if (bytes == 0) return;
  const auto& s = static_cast<const MetalBuffer&>(src);
  if (offset + bytes > s.size_bytes()) throw std::logic_error("gpu read outside the buffer");
  flush();  // waits: the GPU's writes to shared memory are visible to the CPU after completion
  std::memcpy(dst, s.contents() + offset, bytes);
}

void MetalDevice::dispatch(Kernel kernel, std::span<const Binding> bindings, const void* push,
                           size_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
  if (gx == 0 || gy == 0 || gz == 0) return;
  if (bindings.size() > kMaxBindings || push_bytes > kMaxPushBytes)
    throw std::logic_error("gpu dispatch: too many bindings or push constants");
  @autoreleasepool {
    id<MTLComputePipelineState> p = pipeline(kernel);
    id<MTLComputeCommandEncoder> enc = compute_encoder();
    [enc setComputePipelineState:p];
    // The push-constant block, padded to its full size as on Vulkan ([[buffer(0)]]).
    std::array<std::byte, kMaxPushBytes> block{};
    if (push_bytes) std::memcpy(block.data(), push, push_bytes);
    [enc setBytes:block.data() length:kMaxPushBytes atIndex:0];
    for (size_t i = 0; i < static_cast<size_t>(kMaxBindings); ++i) {
      const NSUInteger index = i + 1;  // Vulkan binding i (scripts/metal-kernels.mjs)
      if (i < bindings.size() && bindings[i].buffer) {
        const auto* b = static_cast<const MetalBuffer*>(bindings[i].buffer);
        [enc setBuffer:b->buffer() offset:bindings[i].offset atIndex:index];
      } else {
        [enc setBuffer:dummy_ offset:0 atIndex:index];
      }
    }
    const WorkgroupSize w = workgroup_size(kernel);
    [enc dispatchThreadgroups:MTLSizeMake(gx, gy, gz)
        threadsPerThreadgroup:MTLSizeMake(w.x, w.y, w.z)];
    if (timestamps_) {
      timed_.emplace_back(cmd_, kernel);
      submit(false);  // this dispatch alone in its command buffer, timed at flush
    }
  }
}

void MetalDevice::barrier() { barrier_pending_ = compute_ != nil; }

void MetalDevice::submit(bool wait) {
  if (!cmd_) return;
  end_encoder();
  id<MTLCommandBuffer> cmd = cmd_;
  cmd_ = nil;
  [cmd commit];
  if (!wait) return;
  [cmd waitUntilCompleted];
  if (cmd.status == MTLCommandBufferStatusError)
    throw std::runtime_error("metal: command buffer failed: " + describe_error(cmd.error));
}

void MetalDevice::flush() {
  @autoreleasepool {
    const bool recorded = cmd_ != nil || !timed_.empty();
    submit(true);  // the queue runs command buffers in order: the last one waits for them all
    for (auto& [cmd, kernel] : timed_) {
      [cmd waitUntilCompleted];
      auto& t = times_[static_cast<size_t>(kernel)];
      t.dispatches += 1;
      t.ms += (cmd.GPUEndTime - cmd.GPUStartTime) * 1e3;
    }
    timed_.clear();
    if (recorded) ++submissions_;
    arena_used_ = 0;
  }
}

}  // namespace

std::vector<DeviceInfo> list_metal_devices() {
  std::vector<DeviceInfo> out;
  @autoreleasepool {
    for (id<MTLDevice> d in all_devices()) out.push_back(describe(d));
  }
  return out;
}

std::unique_ptr<Device> open_metal_device(int index) {
  return std::make_unique<MetalDevice>(index);
}

}  // namespace redwing::gpu
