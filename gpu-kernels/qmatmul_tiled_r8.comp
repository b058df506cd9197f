// The register-tiled prefill product, 8 x 8 outputs per thread in tiles of 4,096 at a CPU device's
// 64 threads (64 x 64 to 256 x 16; 16,384 at 256): half the shared-memory reads per multiply-add
// of qmatmul_tiled.comp's 4 x 4. A CPU device's choice where the tokens fill its tiles
// (qmatmul_tiled_kernel.glsl, qmatmul_tiled.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

#define TILE_RM 8u
#define TILE_RN 8u
#define TILE_SLAB 16u
#include "qmatmul_tiled_kernel.glsl"
