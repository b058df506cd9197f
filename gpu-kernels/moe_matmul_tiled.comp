// The routed experts' grouped prefill product, 4 x 4 outputs per thread (tiles of 4,096 at 256
// threads): a GPU's, and a CPU device's where the experts' rows are too few for
// moe_matmul_tiled_r8's tiles (moe_matmul_tiled_kernel.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

#define TILE_RM 4u
#define TILE_RN 4u
#define TILE_SLAB 32u
#include "moe_matmul_tiled_kernel.glsl"
