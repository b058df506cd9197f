// The routed experts' grouped prefill product, 8 x 4 outputs per thread (tiles of 2,048 at a CPU
// device's 64 threads, 8,192 at 256), fewer shared-memory reads per multiply-add than
// moe_matmul_tiled.comp's 4 x 4: a CPU device's choice where the experts' rows fill its tiles
// (moe_matmul_tiled_kernel.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

#define TILE_RM 8u
#define TILE_RN 4u
#define TILE_SLAB 16u
#include "moe_matmul_tiled_kernel.glsl"
