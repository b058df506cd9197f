// The embedded SPIR-V of the kernels in gpu-kernels/ (compiled by glslangValidator at build
// time into headers of uint32 arrays, see native/CMakeLists.txt).
#include <cstdlib>
#include <iterator>
#include <stdexcept>
#include <string>

#include "backend/gpu/device.h"
#include "gpu_kernels/attention_combine.h"
#include "gpu_kernels/attention_partial.h"
#include "gpu_kernels/elementwise.h"
#include "gpu_kernels/embed.h"
#include "gpu_kernels/ffn_tail.h"
#include "gpu_kernels/gather_rows.h"
#include "gpu_kernels/kv_store.h"
#include "gpu_kernels/moe_combine.h"
#include "gpu_kernels/moe_matvec.h"
#include "gpu_kernels/norm_rope.h"
#include "gpu_kernels/penalize.h"
#include "gpu_kernels/qmatmul.h"
#include "gpu_kernels/qmatvec.h"
#include "gpu_kernels/rms_norm.h"
#include "gpu_kernels/rope.h"
#include "gpu_kernels/route.h"
#include "gpu_kernels/scatter_add_rows.h"
#include "gpu_kernels/topk_merge.h"
#include "gpu_kernels/topk_partial.h"

namespace redwing::gpu {
namespace {

struct KernelCode {
  const char* name;
  std::span<const uint32_t> spirv;
  const char* source = name;  // gpu-kernels/<source>.comp
};

// Indexed by Kernel (the order of the enum in device.h).
const KernelCode kKernels[] = {
    {"qmatvec", spirv_qmatvec},
    {"qmatmul", spirv_qmatmul},
    {"embed", spirv_embed},
    {"rms_norm", spirv_rms_norm},
    {"elementwise", spirv_elementwise},
    {"rope", spirv_rope},
    {"gather_rows", spirv_gather_rows},
    {"scatter_add_rows", spirv_scatter_add_rows},
    {"kv_store", spirv_kv_store},
    {"attention_partial", spirv_attention_partial},
    {"attention_combine", spirv_attention_combine},
    {"route", spirv_route},
    {"moe_matvec", spirv_moe_matvec},
    {"moe_combine", spirv_moe_combine},
    {"penalize", spirv_penalize},
    {"topk_partial", spirv_topk_partial},
    {"topk_merge", spirv_topk_merge},
    {"norm_rope", spirv_norm_rope},
    {"moe_matvec_down", spirv_moe_matvec, "moe_matvec"},
    {"ffn_tail", spirv_ffn_tail},
};
static_assert(std::size(kKernels) == static_cast<size_t>(Kernel::count));

}  // namespace

bool valid_workgroup_threads(uint32_t n) { return n == 64 || n == 128 || n == 256; }

uint32_t choose_workgroup_threads(bool software) {
  if (const char* forced = std::getenv("REDWING_GPU_WORKGROUP"); forced && *forced) {
    const auto n = static_cast<uint32_t>(std::strtoul(forced, nullptr, 10));
    if (!valid_workgroup_threads(n))
      throw std::invalid_argument(std::string("REDWING_GPU_WORKGROUP=") + forced +
                                  ": expected 64, 128 or 256");
    return n;
  }
  return software ? kCpuWorkgroupThreads : kGpuWorkgroupThreads;
}

const char* kernel_name(Kernel k) {
  const auto i = static_cast<size_t>(k);
  return i < std::size(kKernels) ? kKernels[i].name : "?";
}

const char* kernel_source_name(Kernel k) {
  const auto i = static_cast<size_t>(k);
  return i < std::size(kKernels) ? kKernels[i].source : "?";
}

std::span<const uint32_t> kernel_spirv(Kernel k) {
  const auto i = static_cast<size_t>(k);
  if (i >= std::size(kKernels)) throw std::logic_error("no such kernel");
  return kKernels[i].spirv;
}

}  // namespace redwing::gpu
