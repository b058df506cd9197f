// The embedded SPIR-V of the kernels in gpu-kernels/ (compiled by glslangValidator at build
// time into headers of uint32 arrays, see native/CMakeLists.txt).
#include <stdexcept>

#include "backend/gpu/device.h"
#include "gpu_kernels/attention_combine.h"
#include "gpu_kernels/attention_partial.h"
#include "gpu_kernels/elementwise.h"
#include "gpu_kernels/embed.h"
#include "gpu_kernels/gather_rows.h"
#include "gpu_kernels/kv_store.h"
#include "gpu_kernels/qmatmul.h"
#include "gpu_kernels/qmatvec.h"
#include "gpu_kernels/rms_norm.h"
#include "gpu_kernels/rope.h"
#include "gpu_kernels/route.h"
#include "gpu_kernels/scatter_add_rows.h"

namespace redwing::gpu {

#define REDWING_KERNELS(X)                                                                         \
  X(qmatvec)                                                                                       \
  X(qmatmul)                                                                                       \
  X(embed)                                                                                         \
  X(rms_norm)                                                                                      \
  X(elementwise)                                                                                   \
  X(rope) X(gather_rows) X(scatter_add_rows) X(kv_store) X(attention_partial) X(attention_combine) \
      X(route)

const char* kernel_name(Kernel k) {
#define NAME_CASE(n) \
  case Kernel::n:    \
    return #n;
  switch (k) { REDWING_KERNELS(NAME_CASE) case Kernel::count : break; }
#undef NAME_CASE
  return "?";
}

std::span<const uint32_t> kernel_spirv(Kernel k) {
#define CODE_CASE(n) \
  case Kernel::n:    \
    return {spirv_##n, sizeof(spirv_##n) / sizeof(uint32_t)};
  switch (k) { REDWING_KERNELS(CODE_CASE) case Kernel::count : break; }
#undef CODE_CASE
  throw std::logic_error("no such kernel");
}

}  // namespace redwing::gpu
