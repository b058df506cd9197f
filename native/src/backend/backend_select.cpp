#include "backend/backend_select.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#if defined(REDWING_HAVE_VULKAN) || defined(REDWING_HAVE_METAL)
#include "backend/gpu/gpu_backend.h"
#endif
#if defined(REDWING_HAVE_METAL)
#include "backend/gpu/metal/metal_device.h"
#endif

namespace redwing {

namespace {

// The kinds a plan may name, in activation_plan_name's order ("other" is only ever int8 as part
// of "int8": products the model does not classify).
constexpr std::pair<ProductKind, const char*> kNamedKinds[] = {
    {ProductKind::attention, "attention"},
    {ProductKind::mlp, "mlp"},
    {ProductKind::router, "router"},
    {ProductKind::experts, "experts"},
    {ProductKind::head, "head"}};

}  // namespace

ActivationPlan parse_activation_plan(const std::string& s) {
  if (s == "exact") return ActivationPlan::exact();
  if (s == "int8") return ActivationPlan::all_int8();
  const auto fail = [&] {
    return std::invalid_argument("unknown activations \"" + s +
                                 "\" (exact, int8, or a comma-separated list of attention, mlp, "
                                 "router, experts, head)");
  };
  ActivationPlan plan;
  size_t begin = 0;
  while (begin <= s.size()) {
    const size_t end = std::min(s.find(',', begin), s.size());
    const std::string name = s.substr(begin, end - begin);
    bool known = false;
    for (const auto& [kind, kind_name] : kNamedKinds)
      if (name == kind_name) {
        const ActivationPlan one = ActivationPlan::int8_on({kind});
        if (plan.int8(kind)) throw fail();  // named twice
        plan.int8_kinds |= one.int8_kinds;
        known = true;
      }
    if (!known) throw fail();
    begin = end + 1;
  }
  return plan;
}

std::string activation_plan_name(ActivationPlan p) {
  if (p == ActivationPlan::all_int8()) return "int8";
  std::string out;
  for (const auto& [kind, kind_name] : kNamedKinds)
    if (p.int8(kind)) {
      if (!out.empty()) out += ',';
      out += kind_name;
    }
  return out.empty() ? "exact" : out;
}

bool vulkan_built() {
#if defined(REDWING_HAVE_VULKAN)
  return true;
#else
  return false;
#endif
}

bool metal_built() {
#if defined(REDWING_HAVE_METAL)
  return true;
#else
  return false;
#endif
}

namespace {

#if defined(REDWING_HAVE_METAL)
// REDWING_METAL_DEVICE=<index> picks a Metal device; the system default (0) otherwise.
int pick_metal_device(size_t count) {
  int i = 0;
  if (const char* env = std::getenv("REDWING_METAL_DEVICE")) i = std::atoi(env);
  if (i < 0 || i >= static_cast<int>(count))
    throw std::runtime_error("backend \"metal\": no Metal device " + std::to_string(i) +
                             " (this machine has " + std::to_string(count) + ")");
  return i;
}
#endif

#if defined(REDWING_HAVE_VULKAN)
// The index of the Vulkan device to use, or -1 when there is none. `hardware_only`: skip
// software devices (for auto).
int pick_vulkan_device(const std::vector<gpu::DeviceInfo>& devices, bool hardware_only) {
  if (const char* env = std::getenv("REDWING_VULKAN_DEVICE")) {
    const int i = std::atoi(env);
    if (i < 0 || i >= static_cast<int>(devices.size()))
      throw std::runtime_error("REDWING_VULKAN_DEVICE=" + std::string(env) +
                               " but this machine has " + std::to_string(devices.size()) +
                               " Vulkan device(s)");
    if (hardware_only && devices[static_cast<size_t>(i)].software) return -1;
    return i;
  }
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i].discrete && !devices[i].software) return static_cast<int>(i);
  if (hardware_only) return -1;
  for (size_t i = 0; i < devices.size(); ++i)
    if (!devices[i].software) return static_cast<int>(i);
  return devices.empty() ? -1 : 0;
}
#endif

}  // namespace

std::vector<BackendInfo> available_backends() {
  std::vector<BackendInfo> out;
  out.push_back({"cpu", cpu::cpu_features(), 0, false, false});
#if defined(REDWING_HAVE_METAL)
  for (const auto& d : gpu::list_metal_devices())
    out.push_back({"metal", d.name, d.memory_bytes, d.software, d.discrete});
#endif
#if defined(REDWING_HAVE_VULKAN)
  for (const auto& d : gpu::list_vulkan_devices())
    out.push_back({"vulkan", d.name, d.memory_bytes, d.software, d.discrete});
#endif
  return out;
}

std::string resolve_backend(const std::string& kind) {
  if (kind == "cpu" || kind == "vulkan" || kind == "metal") return kind;
  if (kind != "auto")
    throw std::invalid_argument("unknown backend \"" + kind + "\" (cpu, metal, vulkan or auto)");
#if defined(REDWING_HAVE_METAL)
  // On a Mac, Metal first: Vulkan there runs through MoltenVK, about 3x slower (docs/macos.md).
  for (const auto& d : gpu::list_metal_devices())
    if (d.discrete) return "metal";
#endif
#if defined(REDWING_HAVE_VULKAN)
  if (pick_vulkan_device(gpu::list_vulkan_devices(), true) >= 0) return "vulkan";
#endif
  return "cpu";
}

std::unique_ptr<Backend> make_backend(const std::string& kind, int threads) {
  const std::string chosen = resolve_backend(kind);
  if (chosen == "cpu") return make_cpu_backend(threads);
  if (chosen == "metal") {
#if defined(REDWING_HAVE_METAL)
    return make_gpu_backend(
        gpu::open_metal_device(pick_metal_device(gpu::list_metal_devices().size())));
#else
    throw std::runtime_error("backend \"metal\": this build has no Metal support (macOS only)");
#endif
  }
#if defined(REDWING_HAVE_VULKAN)
  const auto devices = gpu::list_vulkan_devices();
  const int index = pick_vulkan_device(devices, kind == "auto");
  if (index < 0) throw std::runtime_error("backend \"vulkan\": no Vulkan device on this machine");
  return make_gpu_backend(gpu::open_vulkan_device(index));
#else
  throw std::runtime_error("backend \"vulkan\": this build has no Vulkan support");
#endif
}

}  // namespace redwing
