// Y[t, row0 + r] = sum_c W[r, c] X[t, c] for many tokens (prefill): each workgroup computes a
// tile of 16 weight rows by 8 tokens (the body, qmatmul_narrow.glsl, is shared with the routed
// experts' grouped product, moe_matmul.comp).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Packed { uvec4 packed4[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Biases { uint biases[]; };
layout(std430, set = 0, binding = 3) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 4) buffer Y { float y[]; };
#include "quant_params.glsl"

#include "qmatmul_narrow.glsl"

void main() {
  narrow_product(p.rows, p.cols, p.bits, p.group_size, p.scale_type, 0u, p.scale0, p.x_offset,
                 p.x_stride, p.y_offset, p.y_stride, p.tokens, gl_WorkGroupID.y * TILE_TOKENS);
}
