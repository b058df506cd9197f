// The register-tiled prefill product, 4 x 4 outputs per thread in tiles of 4,096 at 256 threads
// (32 x 128 to 128 x 32): a GPU's, and a CPU device's where the tokens are too few for
// qmatmul_tiled_r8's tiles (qmatmul_tiled_kernel.glsl, qmatmul_tiled.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

#define TILE_RM 4u
#define TILE_RN 4u
#define TILE_SLAB 32u
#include "qmatmul_tiled_kernel.glsl"
