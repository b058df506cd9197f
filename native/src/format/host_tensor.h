// Tensors as the runtime format lays them out in host memory (docs/format.md). Backends import
// weights from these descriptions; they say nothing about where a backend keeps its copy.
#pragma once

#include <cstdint>

namespace redwing {

enum class DType : uint8_t { bf16, f16, f32 };

inline int dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
const char* dtype_name(DType t);

// An MLX affine-quantized matrix [rows, cols] in host memory: element (r, c) is
// scales[r, c / group_size] * q + biases[r, c / group_size], q packed low bits first into
// little-endian uint32 words, rows of cols * bits / 32 words.
struct HostQuantMatrix {
  const uint32_t* packed = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  DType scale_dtype = DType::bf16;
  int bits = 4;
  int group_size = 64;
  int64_t rows = 0;
  int64_t cols = 0;
  // 1: rows one after another, as the format stores them. 4: the CPU backend's row-group layout
  // (backend/cpu/kernels.h), which only a source asked for it by the backend delivers
  // (Backend::preferred_row_group).
  int row_group = 1;
};

}  // namespace redwing
