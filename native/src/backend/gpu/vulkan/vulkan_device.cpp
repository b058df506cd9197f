// The Vulkan implementation of the GPU device layer (device.h): the only Vulkan-specific code.
//
// - Memory: device-local when the device has such memory. Buffers up to kBlockBytes / 4 are
//   placed in shared blocks of kBlockBytes (a bump pointer per block; a block is freed when its
//   last buffer goes), so a model's thousands of expert matrices use few allocations (drivers
//   may cap their count at 4096); larger buffers get their own allocation.
//   Host data goes through host-visible staging memory: a reusable arena for small writes, a
//   dedicated buffer for large ones; reads go through a host-cached readback buffer. Host
//   memory given to map_host() is imported (VK_EXT_external_memory_host) and copied from in
//   place.
// - Commands: one command buffer records everything between two flushes; each dispatch pushes
//   its bindings into the command buffer (VK_KHR_push_descriptor), or where the device lacks it
//   gets a descriptor set from a pool that is reset at every flush (the pool filling up forces a
//   flush). Recorded work is handed to the GPU in a chain of command buffers (every 64
//   dispatches by default, SubmitSchedule) so it starts while the host still records.
// - Buffers destroyed while recorded commands may still use them are kept until the next flush.
// - Pipelines are built on first use from the embedded SPIR-V, all with one layout: set 0 holds
//   kMaxBindings storage buffers, and one push-constant block of kMaxPushBytes.
#include <vulkan/vulkan.h>

// Vulkan structs are written as `VkFoo x{VK_STRUCTURE_TYPE_FOO}`: the sType first, the rest
// zero, which is what the API expects; -Wextra would warn about every one of them.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "backend/gpu/device.h"

namespace redwing::gpu {
namespace {

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS)
    throw std::runtime_error(std::string("vulkan: ") + what + " failed (VkResult " +
                             std::to_string(static_cast<int>(r)) + ")");
}

// Adds the wall time of its scope to a total in ms (the device's host-time profile).
class HostTimer {
 public:
  explicit HostTimer(double& total_ms) : total_(total_ms), start_(Clock::now()) {}
  ~HostTimer() {
    total_ += std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
  }
  HostTimer(const HostTimer&) = delete;
  HostTimer& operator=(const HostTimer&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  double& total_;
  Clock::time_point start_;
};

// When recorded work goes to the GPU: after the first `first` dispatches of a batch (the work
// recorded after a flush), then after twice as many more each time up to `most`, so the GPU
// starts early in a batch while later submissions stay few. REDWING_GPU_SUBMIT = "N" (every N
// dispatches) or "first,most"; unset: 64 (every 64 dispatches).
struct SubmitSchedule {
  uint32_t first = 64, most = 64;
};
SubmitSchedule submit_schedule() {
  SubmitSchedule s;
  const char* v = std::getenv("REDWING_GPU_SUBMIT");
  if (v == nullptr || *v == 0) return s;
  const std::string text = v;
  const size_t comma = text.find(',');
  try {
    size_t used = 0;
    s.first = static_cast<uint32_t>(std::stoul(text.substr(0, comma), &used));
    if (used != (comma == std::string::npos ? text.size() : comma)) throw std::invalid_argument("");
    s.most = s.first;
    if (comma != std::string::npos) {
      s.most = static_cast<uint32_t>(std::stoul(text.substr(comma + 1), &used));
      if (used != text.size() - comma - 1) throw std::invalid_argument("");
    }
  } catch (const std::exception&) {
    s.first = 0;
  }
  if (s.first == 0 || s.most < s.first || s.most > 4096)
    throw std::invalid_argument(
        "REDWING_GPU_SUBMIT=" + text +
        ": expected N or first,most dispatches (1 <= first <= most <= 4096)");
  return s;
}

// How the host waits for the GPU (REDWING_GPU_WAIT): "spin" polls the fence for up to kSpinMs,
// then blocks; "block" blocks at once (vkWaitForFences). Unset: spin on a GPU, block on a CPU
// device (lavapipe), whose own threads need the cores a spinning host would take. On the H200,
// hybrid experts wait for the GPU once per layer (~0.25 ms of kernels); the blocking wait added
// ~0.1 ms to each (docs/gpu.md, "Where a hybrid token's waits go").
enum class WaitMode { automatic, block, spin };
WaitMode wait_mode() {
  const char* v = std::getenv("REDWING_GPU_WAIT");
  if (v == nullptr || *v == 0) return WaitMode::automatic;
  if (std::string(v) == "block") return WaitMode::block;
  if (std::string(v) == "spin") return WaitMode::spin;
  throw std::invalid_argument(std::string("REDWING_GPU_WAIT=") + v + ": expected block or spin");
}
constexpr double kSpinMs = 2.0;

// An on/off setting that is on unless set to "0"; any other value than 0 or 1 is refused.
bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0 || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  throw std::invalid_argument(std::string(name) + "=" + v + ": expected 0 or 1");
}

bool has_device_extension(VkPhysicalDevice pd, const char* name) {
  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> props(n);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, props.data());
  for (const auto& e : props)
    if (std::strcmp(e.extensionName, name) == 0) return true;
  return false;
}

// A new instance, with the portability flag MoltenVK needs.
VkInstance create_instance() {
  uint32_t n = 0;
  if (vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr) != VK_SUCCESS)
    throw std::runtime_error("vulkan: no loader");
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data());
  std::vector<const char*> enabled;
  bool portability = false;
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, "VK_KHR_portability_enumeration") == 0) portability = true;
  if (portability) enabled.push_back("VK_KHR_portability_enumeration");
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "redwing";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  ci.enabledExtensionCount = static_cast<uint32_t>(enabled.size());
  ci.ppEnabledExtensionNames = enabled.data();
  if (portability) ci.flags |= 0x00000001;  // VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR
  VkInstance instance = VK_NULL_HANDLE;
  check(vkCreateInstance(&ci, nullptr, &instance), "vkCreateInstance");
  return instance;
}

// Owns a VkInstance.
struct Instance {
  VkInstance handle = VK_NULL_HANDLE;
  Instance() : handle(create_instance()) {}
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  ~Instance() { vkDestroyInstance(handle, nullptr); }
};

std::mutex instance_mutex;
int instances_created = 0;

// The process's one instance, made on first use (a failure is retried on the next call) and
// shared by enumeration and every device; each device holds a reference, so it outlives them
// all. Why one: NVIDIA's driver goes wrong after about ten vkCreateInstance/vkDestroyInstance
// cycles in one process (on the H200 the fourteenth device a test process opened found no
// device at all; others report corrupted subgroup invocation ids), and a long-running decode
// service lists devices on every hello and opens one on every load.
//
// The process's own reference is never dropped: at exit NVIDIA's driver may already be torn down,
// and destroying the instance from a static destructor then crashes (seen on the H200: every test
// passed, then a segmentation fault). A union's member is destroyed only by its own destructor,
// which here does nothing; the end of the process frees the instance.
std::shared_ptr<const Instance> process_instance() {
  union Immortal {
    std::shared_ptr<const Instance> ref;
    Immortal() : ref() {}
    ~Immortal() {}
  };
  static Immortal kept;
  const std::lock_guard lock(instance_mutex);
  if (!kept.ref) {
    kept.ref = std::make_shared<const Instance>();
    ++instances_created;
  }
  return kept.ref;
}

int compute_queue_family(VkPhysicalDevice pd) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, fams.data());
  for (uint32_t i = 0; i < n; ++i)
    if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return static_cast<int>(i);
  return -1;
}

// The physical devices that can run compute work, in the loader's order.
std::vector<VkPhysicalDevice> physical_devices(VkInstance instance) {
  uint32_t n = 0;
  check(vkEnumeratePhysicalDevices(instance, &n, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devs(n);
  check(vkEnumeratePhysicalDevices(instance, &n, devs.data()), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> out;
  for (VkPhysicalDevice d : devs)
    if (compute_queue_family(d) >= 0) out.push_back(d);
  return out;
}

DeviceInfo describe(VkPhysicalDevice pd) {
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(pd, &props);
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(pd, &mem);
  DeviceInfo info;
  info.api = "vulkan";
  info.name = props.deviceName;
  info.software = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  // Apple GPUs report themselves as integrated but have their own fast memory path: count
  // them with the discrete ones (vendor 0x106b).
  info.discrete =
      props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU ||
      (props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU && props.vendorID == 0x106b);
  for (uint32_t i = 0; i < mem.memoryHeapCount; ++i)
    if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      info.memory_bytes = std::max<uint64_t>(info.memory_bytes, mem.memoryHeaps[i].size);
  info.max_binding_bytes = props.limits.maxStorageBufferRange;
  info.binding_alignment = std::max<uint64_t>(props.limits.minStorageBufferOffsetAlignment, 4);
  info.workgroup_threads = info.software ? kCpuWorkgroupThreads : kGpuWorkgroupThreads;
  // Subgroups (Vulkan 1.1 core): the experts' down product reduces with subgroupAdd where it can.
  VkPhysicalDeviceSubgroupProperties subgroups{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props2.pNext = &subgroups;
  vkGetPhysicalDeviceProperties2(pd, &props2);
  info.subgroup_size = subgroups.subgroupSize;
  info.subgroup_arithmetic =
      (subgroups.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
      (subgroups.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) != 0 &&
      (subgroups.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0;
  return info;
}

struct VulkanBuffer;

class VulkanDevice final : public Device {
 public:
  VulkanDevice(int index, uint32_t workgroup_threads);
  ~VulkanDevice() override;

  const DeviceInfo& info() const override { return info_; }
  std::unique_ptr<DeviceBuffer> create_buffer(size_t bytes) override;
  uint64_t allocated_bytes() const override { return allocated_; }
  void write(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) override;
  bool map_host(const void* p, size_t bytes) override;
  void unmap_host(const void* p) override;
  void read(const DeviceBuffer& src, size_t offset, void* dst, size_t bytes) override;
  void dispatch(Kernel kernel, std::span<const Binding> bindings, const void* push,
                size_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) override;
  void barrier() override;
  void flush() override;
  // The host computes beside this work and records what follows once it is done, when the GPU
  // may be idle: that work goes out early again, as after a flush.
  void submit() override {
    if (recording_) submit_without_wait();
    submit_after_ = schedule_.first;
  }
  uint64_t submissions() const override { return submissions_; }
  void prepare_kernels() override;
  HostTimes host_times() const override { return host_; }
  void enable_timestamps(bool on) override { timestamps_ = on && timestamp_period_ns_ > 0; }
  std::vector<KernelTime> kernel_times() const override { return times_; }

  // ---- used by VulkanBuffer ----
  struct Raw {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;  // owned unless block >= 0
    size_t bytes = 0;
    void* mapped = nullptr;
    int block = -1;  // the shared block holding it, if any
  };
  void retire(Raw raw, bool counted) {
    if (counted) allocated_ -= raw.bytes;
    garbage_.push_back(raw);
  }

 private:
  enum class Memory { device, upload, readback };
  VkBuffer make_storage_buffer(size_t bytes);  // no memory bound yet
  Raw make_raw(size_t bytes, Memory kind);
  Raw make_pooled(size_t bytes);
  struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    size_t used = 0;
    int live = 0;
  };
  static constexpr size_t kBlockBytes = 256u << 20;
  std::vector<Block> blocks_;
  int open_block_ = -1;  // the block new buffers go to
  void destroy_raw(Raw& raw);
  uint32_t memory_type(uint32_t allowed, Memory kind) const;
  VkCommandBuffer commands();
  VkPipeline pipeline(Kernel k);
  VkPipeline build_pipeline(Kernel k) const;  // throws std::runtime_error
  void collect_timestamps();

  DeviceInfo info_;
  std::shared_ptr<const Instance> instance_;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory_props_{};
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  bool recording_ = false;
  // A batch is recorded into a chain of command buffers: after submit_after_ dispatches (by
  // schedule_) the current one is submitted without waiting, so the GPU runs the start of a
  // decode step while the host records the rest; flush() submits the last one and waits for
  // all of them.
  SubmitSchedule schedule_;
  uint32_t submit_after_ = 64;  // dispatches in the current buffer that submit it
  uint32_t dispatches_in_cmd_ = 0;
  std::vector<VkCommandBuffer> in_flight_;  // submitted since the last flush, not waited for
  std::vector<VkCommandBuffer> spare_;      // reset, ready for reuse
  void submit_without_wait();
  void wait_for_fence();
  VkFence fence_ = VK_NULL_HANDLE;
  bool spin_wait_ = false;
  // VK_KHR_push_descriptor: bindings pushed into the command buffer (no descriptor sets).
  PFN_vkCmdPushDescriptorSetKHR push_descriptors_ = nullptr;
  // VK_EXT_external_memory_host: host ranges imported by map_host(), copied from in place.
  PFN_vkGetMemoryHostPointerPropertiesEXT host_pointer_properties_ = nullptr;
  uint64_t host_import_alignment_ = 0;
  struct Imported {
    const std::byte* base = nullptr;
    size_t bytes = 0;
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
  };
  std::vector<Imported> imported_;
  HostTimes host_;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout_ = VK_NULL_HANDLE;
  VkDescriptorPool descriptor_pool_ = VK_NULL_HANDLE;
  uint32_t sets_used_ = 0;
  static constexpr uint32_t kSetsPerPool = 4096;
  std::array<VkPipeline, static_cast<size_t>(Kernel::count)> pipelines_{};
  // prepare_kernels()'s thread: it alone writes pipelines_ until pipeline() joins it.
  std::thread preparing_;
  Raw dummy_;  // bound to unused binding slots

  // Staging: a reusable arena for small writes (reset at every flush) plus dedicated buffers.
  static constexpr size_t kArenaBytes = 8u << 20;
  Raw arena_;
  size_t arena_used_ = 0;
  std::vector<Raw> staging_;  // dedicated, freed at the next flush
  Raw readback_;

  std::vector<Raw> garbage_;
  uint64_t allocated_ = 0;
  uint64_t submissions_ = 0;

  // Timestamps.
  bool timestamps_ = false;
  double timestamp_period_ns_ = 0;
  VkQueryPool query_pool_ = VK_NULL_HANDLE;
  static constexpr uint32_t kMaxQueries = 8192;
  uint32_t queries_used_ = 0;
  std::vector<Kernel> query_kernels_;
  std::vector<KernelTime> times_;
};

struct VulkanBuffer final : DeviceBuffer {
  VulkanDevice* device;  // not owned: the device outlives its buffers
  VulkanDevice::Raw raw;
  VulkanBuffer(VulkanDevice* d, VulkanDevice::Raw r) : device(d), raw(r) {}
  ~VulkanBuffer() override { device->retire(raw, true); }
  size_t size_bytes() const override { return raw.bytes; }
};

VulkanDevice::VulkanDevice(int index, uint32_t workgroup_threads)
    : schedule_(submit_schedule()), submit_after_(schedule_.first) {
  const WaitMode wait = wait_mode();
  // REDWING_GPU_PUSH_DESCRIPTORS=0: descriptor sets from a pool even where the device can push
  // them; REDWING_GPU_MAP_HOST=0: never import host memory, every write stages (A/B runs and
  // the tests of those paths).
  const bool want_push = env_switch("REDWING_GPU_PUSH_DESCRIPTORS");
  const bool want_import = env_switch("REDWING_GPU_MAP_HOST");
  instance_ = process_instance();
  auto devs = physical_devices(instance_->handle);
  if (index < 0 || index >= static_cast<int>(devs.size()))
    throw std::runtime_error("vulkan: no device " + std::to_string(index));
  physical_ = devs[static_cast<size_t>(index)];
  info_ = describe(physical_);
  if (workgroup_threads != 0 && !valid_workgroup_threads(workgroup_threads))
    throw std::invalid_argument("vulkan: unsupported workgroup size " +
                                std::to_string(workgroup_threads));
  info_.workgroup_threads =
      workgroup_threads != 0 ? workgroup_threads : choose_workgroup_threads(info_.software);
  choose_matvec_shapes(info_);
  choose_matmul_policy(info_);
  choose_knockout(info_);
  choose_attention_split(info_);
  if (info_.knockout.any())
    std::fprintf(stderr,
                 "redwing: REDWING_GPU_KNOCKOUT is set: work is dropped, results are wrong "
                 "(a timing diagnostic)\n");
  spin_wait_ = wait == WaitMode::spin || (wait == WaitMode::automatic && !info_.software);
  vkGetPhysicalDeviceMemoryProperties(physical_, &memory_props_);
  const int family = compute_queue_family(physical_);
  if (family < 0) throw std::runtime_error("vulkan: " + info_.name + " has no compute queue");
  queue_family_ = static_cast<uint32_t>(family);
  {
    // Every kernel's layout has kMaxBindings storage buffers (Vulkan promises only 4; desktop
    // GPUs, lavapipe and MoltenVK give far more).
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(physical_, &props);
    if (props.limits.maxPerStageDescriptorStorageBuffers < static_cast<uint32_t>(kMaxBindings))
      throw std::runtime_error("vulkan: " + info_.name + " binds " +
                               std::to_string(props.limits.maxPerStageDescriptorStorageBuffers) +
                               " storage buffers per kernel; Redwing's kernels need " +
                               std::to_string(kMaxBindings));
  }

  float priority = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  std::vector<const char*> exts;
  if (has_device_extension(physical_, "VK_KHR_portability_subset"))
    exts.push_back("VK_KHR_portability_subset");
  const bool can_push = want_push && has_device_extension(physical_, "VK_KHR_push_descriptor");
  if (can_push) exts.push_back("VK_KHR_push_descriptor");
  const bool can_import =
      want_import && has_device_extension(physical_, "VK_EXT_external_memory_host");
  if (can_import) {
    exts.push_back("VK_EXT_external_memory_host");
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host_props{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    props2.pNext = &host_props;
    vkGetPhysicalDeviceProperties2(physical_, &props2);
    host_import_alignment_ = host_props.minImportedHostPointerAlignment;
  }

  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  dci.ppEnabledExtensionNames = exts.data();
  check(vkCreateDevice(physical_, &dci, nullptr, &device_), "vkCreateDevice");
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  if (can_push)
    push_descriptors_ = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(
        vkGetDeviceProcAddr(device_, "vkCmdPushDescriptorSetKHR"));
  if (can_import && host_import_alignment_ > 0)
    host_pointer_properties_ = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        vkGetDeviceProcAddr(device_, "vkGetMemoryHostPointerPropertiesEXT"));

  VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = queue_family_;
  check(vkCreateCommandPool(device_, &pci, nullptr, &command_pool_), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cai.commandPool = command_pool_;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(device_, &cai, &cmd_), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(device_, &fci, nullptr, &fence_), "vkCreateFence");

  std::array<VkDescriptorSetLayoutBinding, kMaxBindings> b{};
  for (int i = 0; i < kMaxBindings; ++i) {
    b[static_cast<size_t>(i)].binding = static_cast<uint32_t>(i);
    b[static_cast<size_t>(i)].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[static_cast<size_t>(i)].descriptorCount = 1;
    b[static_cast<size_t>(i)].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo lci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  if (push_descriptors_) lci.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  lci.bindingCount = kMaxBindings;
  lci.pBindings = b.data();
  check(vkCreateDescriptorSetLayout(device_, &lci, nullptr, &set_layout_),
        "vkCreateDescriptorSetLayout");
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, kMaxPushBytes};
  VkPipelineLayoutCreateInfo plci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  plci.setLayoutCount = 1;
  plci.pSetLayouts = &set_layout_;
  plci.pushConstantRangeCount = 1;
  plci.pPushConstantRanges = &range;
  check(vkCreatePipelineLayout(device_, &plci, nullptr, &pipeline_layout_),
        "vkCreatePipelineLayout");
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBindings};
  VkDescriptorPoolCreateInfo dpci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  dpci.maxSets = kSetsPerPool;
  dpci.poolSizeCount = 1;
  dpci.pPoolSizes = &ps;
  check(vkCreateDescriptorPool(device_, &dpci, nullptr, &descriptor_pool_),
        "vkCreateDescriptorPool");

  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(physical_, &props);
  if (props.limits.timestampComputeAndGraphics) {
    timestamp_period_ns_ = props.limits.timestampPeriod;
    VkQueryPoolCreateInfo qpci{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qpci.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qpci.queryCount = kMaxQueries;
    check(vkCreateQueryPool(device_, &qpci, nullptr, &query_pool_), "vkCreateQueryPool");
  }
  times_.resize(static_cast<size_t>(Kernel::count));

  dummy_ = make_raw(256, Memory::device);
  arena_ = make_raw(kArenaBytes, Memory::upload);
}

VulkanDevice::~VulkanDevice() {
  if (preparing_.joinable()) preparing_.join();  // it uses the device and the layout
  if (recording_ || !in_flight_.empty()) {
    try {
      flush();
    } catch (...) {
    }
  }
  vkDeviceWaitIdle(device_);
  for (const Imported& im : imported_) {
    vkDestroyBuffer(device_, im.buffer, nullptr);
    vkFreeMemory(device_, im.memory, nullptr);
  }
  for (auto& r : garbage_) destroy_raw(r);
  for (auto& r : staging_) destroy_raw(r);
  destroy_raw(dummy_);
  destroy_raw(arena_);
  destroy_raw(readback_);
  for (Block& b : blocks_)
    if (b.memory) vkFreeMemory(device_, b.memory, nullptr);
  for (VkPipeline p : pipelines_)
    if (p) vkDestroyPipeline(device_, p, nullptr);
  if (query_pool_) vkDestroyQueryPool(device_, query_pool_, nullptr);
  vkDestroyDescriptorPool(device_, descriptor_pool_, nullptr);
  vkDestroyPipelineLayout(device_, pipeline_layout_, nullptr);
  vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
  vkDestroyFence(device_, fence_, nullptr);
  vkDestroyCommandPool(device_, command_pool_, nullptr);
  vkDestroyDevice(device_, nullptr);
}

uint32_t VulkanDevice::memory_type(uint32_t allowed, Memory kind) const {
  const VkMemoryPropertyFlags host =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  // Preferences in order; the first allowed type with all the wanted flags wins.
  std::vector<VkMemoryPropertyFlags> wanted;
  if (kind == Memory::device) {
    wanted = {VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0};
  } else if (kind == Memory::upload) {
    wanted = {host};
  } else {
    wanted = {host | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, host};
  }
  for (VkMemoryPropertyFlags w : wanted)
    for (uint32_t i = 0; i < memory_props_.memoryTypeCount; ++i)
      if ((allowed & (1u << i)) && (memory_props_.memoryTypes[i].propertyFlags & w) == w) return i;
  throw std::runtime_error("vulkan: no suitable memory type");
}

VkBuffer VulkanDevice::make_storage_buffer(size_t bytes) {
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = std::max<size_t>(bytes, 4);
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
              VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  check(vkCreateBuffer(device_, &bci, nullptr, &buffer), "vkCreateBuffer");
  return buffer;
}

VulkanDevice::Raw VulkanDevice::make_raw(size_t bytes, Memory kind) {
  Raw raw;
  raw.bytes = bytes;
  raw.buffer = make_storage_buffer(bytes);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, raw.buffer, &req);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = memory_type(req.memoryTypeBits, kind);
  VkResult r = vkAllocateMemory(device_, &ai, nullptr, &raw.memory);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(device_, raw.buffer, nullptr);
    throw std::runtime_error("vulkan: out of device memory allocating " + std::to_string(bytes) +
                             " bytes (VkResult " + std::to_string(static_cast<int>(r)) + ")");
  }
  check(vkBindBufferMemory(device_, raw.buffer, raw.memory, 0), "vkBindBufferMemory");
  if (kind != Memory::device)
    check(vkMapMemory(device_, raw.memory, 0, VK_WHOLE_SIZE, 0, &raw.mapped), "vkMapMemory");
  return raw;
}

void VulkanDevice::destroy_raw(Raw& raw) {
  if (raw.buffer) vkDestroyBuffer(device_, raw.buffer, nullptr);
  if (raw.block >= 0) {
    Block& b = blocks_[static_cast<size_t>(raw.block)];
    if (--b.live == 0) {
      vkFreeMemory(device_, b.memory, nullptr);
      b = Block{};
      if (open_block_ == raw.block) open_block_ = -1;
    }
  } else if (raw.memory) {
    vkFreeMemory(device_, raw.memory, nullptr);
  }
  raw = Raw{};
}

VkCommandBuffer VulkanDevice::commands() {
  if (!recording_) {
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
    recording_ = true;
    if (in_flight_.empty()) {
      if (timestamps_) vkCmdResetQueryPool(cmd_, query_pool_, 0, kMaxQueries);
    } else {
      // The hazard tracking above the device knows nothing of the chain: order this buffer
      // after everything submitted before it.
      barrier();
    }
  }
  return cmd_;
}

void VulkanDevice::submit_without_wait() {
  HostTimer timer(host_.submit_ms);
  check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
  recording_ = false;
  dispatches_in_cmd_ = 0;
  submit_after_ = std::min(submit_after_ * 2, schedule_.most);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  check(vkQueueSubmit(queue_, 1, &si, VK_NULL_HANDLE), "vkQueueSubmit");
  in_flight_.push_back(cmd_);
  if (spare_.empty()) {
    VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = command_pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(device_, &cai, &cmd_), "vkAllocateCommandBuffers");
  } else {
    cmd_ = spare_.back();
    spare_.pop_back();
  }
}

VulkanDevice::Raw VulkanDevice::make_pooled(size_t bytes) {
  Raw raw;
  raw.bytes = bytes;
  raw.buffer = make_storage_buffer(bytes);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, raw.buffer, &req);
  const uint32_t type = memory_type(req.memoryTypeBits, Memory::device);
  auto fits = [&](const Block& b) {
    return (b.used + req.alignment - 1) / req.alignment * req.alignment + req.size <= kBlockBytes;
  };
  if (open_block_ < 0 || !fits(blocks_[static_cast<size_t>(open_block_)])) {
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = kBlockBytes;
    ai.memoryTypeIndex = type;
    Block b;
    VkResult r = vkAllocateMemory(device_, &ai, nullptr, &b.memory);
    if (r != VK_SUCCESS) {
      vkDestroyBuffer(device_, raw.buffer, nullptr);
      throw std::runtime_error("vulkan: out of device memory allocating a " +
                               std::to_string(kBlockBytes >> 20) + " MiB block (VkResult " +
                               std::to_string(static_cast<int>(r)) + ")");
    }
    // Reuse the slot of a freed block, if any.
    open_block_ = -1;
    for (size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].memory == VK_NULL_HANDLE) open_block_ = static_cast<int>(i);
    if (open_block_ < 0) {
      blocks_.push_back(b);
      open_block_ = static_cast<int>(blocks_.size() - 1);
    } else {
      blocks_[static_cast<size_t>(open_block_)] = b;
    }
  }
  Block& b = blocks_[static_cast<size_t>(open_block_)];
  const size_t offset = (b.used + req.alignment - 1) / req.alignment * req.alignment;
  check(vkBindBufferMemory(device_, raw.buffer, b.memory, offset), "vkBindBufferMemory");
  b.used = offset + req.size;
  b.live += 1;
  raw.block = open_block_;
  return raw;
}

std::unique_ptr<DeviceBuffer> VulkanDevice::create_buffer(size_t bytes) {
  Raw raw = bytes <= kBlockBytes / 4 ? make_pooled(bytes) : make_raw(bytes, Memory::device);
  allocated_ += bytes;
  auto buf = std::make_unique<VulkanBuffer>(this, raw);
  // Zero it in order with the other commands; the barrier orders the fill before later use.
  vkCmdFillBuffer(commands(), raw.buffer, 0, VK_WHOLE_SIZE, 0);
  barrier();
  return buf;
}

bool VulkanDevice::map_host(const void* p, size_t bytes) {
  if (host_pointer_properties_ == nullptr || p == nullptr || bytes == 0) return false;
  const auto at = reinterpret_cast<uintptr_t>(p);
  if (at % host_import_alignment_ != 0 || bytes % host_import_alignment_ != 0) return false;
  VkMemoryHostPointerPropertiesEXT host{VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
  if (host_pointer_properties_(device_, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, p,
                               &host) != VK_SUCCESS)
    return false;
  VkExternalMemoryBufferCreateInfo external{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  external.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.pNext = &external;
  bci.size = bytes;
  bci.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  Imported im;
  im.base = static_cast<const std::byte*>(p);
  im.bytes = bytes;
  if (vkCreateBuffer(device_, &bci, nullptr, &im.buffer) != VK_SUCCESS) return false;
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, im.buffer, &req);
  const uint32_t types = req.memoryTypeBits & host.memoryTypeBits;
  uint32_t type = 0;
  while (type < memory_props_.memoryTypeCount && !(types & (1u << type))) ++type;
  VkImportMemoryHostPointerInfoEXT import{VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT};
  import.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  import.pHostPointer = const_cast<void*>(p);  // the API's type; the device only reads it
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.pNext = &import;
  ai.allocationSize = bytes;
  ai.memoryTypeIndex = type;
  if (type == memory_props_.memoryTypeCount ||
      vkAllocateMemory(device_, &ai, nullptr, &im.memory) != VK_SUCCESS ||
      vkBindBufferMemory(device_, im.buffer, im.memory, 0) != VK_SUCCESS) {
    if (im.memory) vkFreeMemory(device_, im.memory, nullptr);
    vkDestroyBuffer(device_, im.buffer, nullptr);
    return false;
  }
  imported_.push_back(im);
  return true;
}

void VulkanDevice::unmap_host(const void* p) {
  auto it = std::find_if(imported_.begin(), imported_.end(),
                         [&](const Imported& im) { return im.base == p; });
  if (it == imported_.end()) return;
  flush();  // recorded copies may still read it
  vkDestroyBuffer(device_, it->buffer, nullptr);
  vkFreeMemory(device_, it->memory, nullptr);
  imported_.erase(it);
}

void VulkanDevice::write(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  std::optional<HostTimer> timer(std::in_place, host_.record_ms);
  auto& d = static_cast<VulkanBuffer&>(dst);
  if (offset + bytes > d.raw.bytes) throw std::logic_error("gpu write outside the buffer");
  const auto from_host = reinterpret_cast<uintptr_t>(src);
  for (const Imported& im : imported_) {
    const auto base = reinterpret_cast<uintptr_t>(im.base);
    if (from_host < base || from_host - base > im.bytes - bytes || bytes > im.bytes) continue;
    const VkBufferCopy region{static_cast<VkDeviceSize>(from_host - base), offset, bytes};
    vkCmdCopyBuffer(commands(), im.buffer, d.raw.buffer, 1, &region);
    return;
  }
  VkBuffer from;
  size_t from_offset = 0;
  if (bytes <= kArenaBytes / 4) {
    if (arena_used_ + bytes > kArenaBytes) flush();
    from = arena_.buffer;
    from_offset = arena_used_;
    std::memcpy(static_cast<std::byte*>(arena_.mapped) + arena_used_, src, bytes);
    arena_used_ = (arena_used_ + bytes + 15) / 16 * 16;
  } else {
    staging_.push_back(make_raw(bytes, Memory::upload));
    std::memcpy(staging_.back().mapped, src, bytes);
    from = staging_.back().buffer;
  }
  VkBufferCopy region{from_offset, offset, bytes};
  vkCmdCopyBuffer(commands(), from, d.raw.buffer, 1, &region);
  timer.reset();
  // Large uploads (weights) are submitted at once so their staging memory does not pile up.
  if (bytes > kArenaBytes / 4) flush();
}

void VulkanDevice::read(const DeviceBuffer& src, size_t offset, void* dst, size_t bytes) {
  if (bytes == 0) return;
  const auto& s = static_cast<const VulkanBuffer&>(src);
  if (offset + bytes > s.raw.bytes) throw std::logic_error("gpu read outside the buffer");
  if (readback_.bytes < bytes) {
    flush();  // the old readback buffer may not be in use by recorded commands
    destroy_raw(readback_);
    readback_ = make_raw(std::max<size_t>(bytes, 1u << 20), Memory::readback);
  }
  barrier();
  std::optional<HostTimer> timer(std::in_place, host_.record_ms);
  VkBufferCopy region{offset, 0, bytes};
  vkCmdCopyBuffer(commands(), s.raw.buffer, readback_.buffer, 1, &region);
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(commands(), VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                       &mb, 0, nullptr, 0, nullptr);
  timer.reset();
  flush();
  VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE};
  range.memory = readback_.memory;
  range.size = VK_WHOLE_SIZE;
  vkInvalidateMappedMemoryRanges(device_, 1, &range);
  std::memcpy(dst, readback_.mapped, bytes);
}

void VulkanDevice::prepare_kernels() {
  if (preparing_.joinable()) return;
  try {
    preparing_ = std::thread([this] {
      for (int k = 0; k < static_cast<int>(Kernel::count); ++k) {
        VkPipeline& p = pipelines_[static_cast<size_t>(k)];
        if (p) continue;
        try {
          p = build_pipeline(static_cast<Kernel>(k));
        } catch (...) {
          // Left for pipeline(), which builds it again at first use and reports the error there.
        }
      }
    });
  } catch (const std::system_error&) {
    // No thread to spare: every kernel builds at first use, as without this call.
  }
}

VkPipeline VulkanDevice::pipeline(Kernel k) {
  if (preparing_.joinable()) preparing_.join();
  VkPipeline& p = pipelines_[static_cast<size_t>(k)];
  if (!p) p = build_pipeline(k);
  return p;
}

VkPipeline VulkanDevice::build_pipeline(Kernel k) const {
  const auto code = kernel_spirv(k);
  VkShaderModuleCreateInfo smci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  smci.codeSize = code.size_bytes();
  smci.pCode = code.data();
  VkShaderModule module;
  check(vkCreateShaderModule(device_, &smci, nullptr, &module), "vkCreateShaderModule");
  VkComputePipelineCreateInfo cpci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  cpci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  cpci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  cpci.stage.module = module;
  cpci.stage.pName = "main";
  // Specialization constant 0: the workgroup size (device.h); 1 to 4: the experts' down
  // product's shape (matvec_teams.glsl); 5: the other decode products' subgroup sums; 6: the
  // looping grid's blocks at once (matvec.glsl). Kernels that do not declare a constant ignore
  // its entry.
  const MatvecShape& shape = info_.matvec_down;
  const std::array<uint32_t, 7> constants = {
      info_.workgroup_threads,         shape.rows_per_team, shape.lanes,
      shape.subgroup_reduce ? 1u : 0u, shape.unroll,        info_.matvec_subgroup_reduce ? 1u : 0u,
      info_.matvec_loop_rows};
  std::array<VkSpecializationMapEntry, 7> entries{};
  for (uint32_t i = 0; i < entries.size(); ++i)
    entries[i] = {i, static_cast<uint32_t>(i * sizeof(uint32_t)), sizeof(uint32_t)};
  VkSpecializationInfo spec{static_cast<uint32_t>(entries.size()), entries.data(), sizeof constants,
                            constants.data()};
  cpci.stage.pSpecializationInfo = &spec;
  cpci.layout = pipeline_layout_;
  VkPipeline p = VK_NULL_HANDLE;
  VkResult r = vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &cpci, nullptr, &p);
  vkDestroyShaderModule(device_, module, nullptr);
  check(r, (std::string("vkCreateComputePipelines ") + kernel_name(k)).c_str());
  return p;
}

void VulkanDevice::dispatch(Kernel kernel, std::span<const Binding> bindings, const void* push,
                            size_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
  if (gx == 0 || gy == 0 || gz == 0 || info_.knockout.drops(kernel)) return;
  if (bindings.size() > kMaxBindings || push_bytes > kMaxPushBytes)
    throw std::logic_error("gpu dispatch: too many bindings or push constants");
  if ((!push_descriptors_ && sets_used_ == kSetsPerPool) ||
      (timestamps_ && queries_used_ + 2 > kMaxQueries))
    flush();
  std::optional<HostTimer> timer(std::in_place, host_.record_ms);
  VkPipeline pipe = pipeline(kernel);
  VkCommandBuffer cmd = commands();

  VkDescriptorSet set = VK_NULL_HANDLE;  // unused with push descriptors
  if (!push_descriptors_) {
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = descriptor_pool_;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &set_layout_;
    check(vkAllocateDescriptorSets(device_, &ai, &set), "vkAllocateDescriptorSets");
    ++sets_used_;
  }
  std::array<VkDescriptorBufferInfo, kMaxBindings> infos{};
  std::array<VkWriteDescriptorSet, kMaxBindings> writes{};
  for (int i = 0; i < kMaxBindings; ++i) {
    auto& info = infos[static_cast<size_t>(i)];
    if (static_cast<size_t>(i) < bindings.size() && bindings[static_cast<size_t>(i)].buffer) {
      const Binding& b = bindings[static_cast<size_t>(i)];
      info.buffer = static_cast<const VulkanBuffer*>(b.buffer)->raw.buffer;
      info.offset = b.offset;
      info.range = std::max<size_t>(b.bytes, 4);
    } else {
      info.buffer = dummy_.buffer;
      info.offset = 0;
      info.range = VK_WHOLE_SIZE;
    }
    auto& w = writes[static_cast<size_t>(i)];
    w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    w.dstSet = set;
    w.dstBinding = static_cast<uint32_t>(i);
    w.descriptorCount = 1;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &info;
  }
  vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
  if (push_descriptors_) {
    push_descriptors_(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout_, 0, kMaxBindings,
                      writes.data());
  } else {
    vkUpdateDescriptorSets(device_, kMaxBindings, writes.data(), 0, nullptr);
    vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout_, 0, 1, &set, 0,
                            nullptr);
  }
  if (push_bytes) {
    std::array<std::byte, kMaxPushBytes> block{};
    std::memcpy(block.data(), push, push_bytes);
    vkCmdPushConstants(cmd, pipeline_layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, kMaxPushBytes,
                       block.data());
  }
  if (timestamps_) {
    vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, query_pool_, queries_used_++);
    query_kernels_.push_back(kernel);
  }
  vkCmdDispatch(cmd, gx, gy, gz);
  if (timestamps_)
    vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, query_pool_, queries_used_++);
  timer.reset();
  if (++dispatches_in_cmd_ >= submit_after_) submit_without_wait();
}

void VulkanDevice::barrier() {
  if (info_.knockout.barriers) return;
  HostTimer timer(host_.record_ms);
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                     VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                     VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags stages =
      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(commands(), stages, stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

void VulkanDevice::collect_timestamps() {
  if (queries_used_ == 0) return;
  std::vector<uint64_t> ticks(queries_used_);
  check(vkGetQueryPoolResults(device_, query_pool_, 0, queries_used_,
                              ticks.size() * sizeof(uint64_t), ticks.data(), sizeof(uint64_t),
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "vkGetQueryPoolResults");
  for (size_t i = 0; i < query_kernels_.size(); ++i) {
    auto& t = times_[static_cast<size_t>(query_kernels_[i])];
    t.dispatches += 1;
    t.ms += static_cast<double>(ticks[2 * i + 1] - ticks[2 * i]) * timestamp_period_ns_ * 1e-6;
  }
  queries_used_ = 0;
  query_kernels_.clear();
}

void VulkanDevice::wait_for_fence() {
  HostTimer timer(host_.wait_ms);
  ++host_.waits;
  if (spin_wait_) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(kSpinMs);
    while (std::chrono::steady_clock::now() < until) {
      const VkResult r = vkGetFenceStatus(device_, fence_);
      if (r == VK_SUCCESS) return;
      if (r != VK_NOT_READY) check(r, "vkGetFenceStatus");
    }
  }
  check(vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
}

void VulkanDevice::flush() {
  submit_after_ = schedule_.first;
  if (recording_ || !in_flight_.empty()) {
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    {
      HostTimer timer(host_.submit_ms);
      if (recording_) {
        check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
        si.commandBufferCount = 1;
        si.pCommandBuffers = &cmd_;
      }
      // With no buffer, the fence still signals once everything submitted before has run.
      check(vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit");
    }
    ++submissions_;
    wait_for_fence();
    check(vkResetFences(device_, 1, &fence_), "vkResetFences");
    if (recording_) check(vkResetCommandBuffer(cmd_, 0), "vkResetCommandBuffer");
    recording_ = false;
    dispatches_in_cmd_ = 0;
    for (VkCommandBuffer c : in_flight_) {
      check(vkResetCommandBuffer(c, 0), "vkResetCommandBuffer");
      spare_.push_back(c);
    }
    in_flight_.clear();
    collect_timestamps();
  }
  if (sets_used_ > 0)
    check(vkResetDescriptorPool(device_, descriptor_pool_, 0), "vkResetDescriptorPool");
  sets_used_ = 0;
  arena_used_ = 0;
  for (auto& r : staging_) destroy_raw(r);
  staging_.clear();
  for (auto& r : garbage_) destroy_raw(r);
  garbage_.clear();
}

}  // namespace

std::vector<DeviceInfo> list_vulkan_devices() {
  std::vector<DeviceInfo> out;
  try {
    const auto instance = process_instance();
    for (VkPhysicalDevice pd : physical_devices(instance->handle)) out.push_back(describe(pd));
  } catch (const std::exception&) {
  }
  return out;
}

int vulkan_instances_created() {
  const std::lock_guard lock(instance_mutex);
  return instances_created;
}

std::unique_ptr<Device> open_vulkan_device(int index, uint32_t workgroup_threads) {
  return std::make_unique<VulkanDevice>(index, workgroup_threads);
}

}  // namespace redwing::gpu
