// qmatvec.comp's looping grid with 4 blocks of rows at once, whatever the device's
// matvec_loop_rows: for products of many blocks per workgroup (the output head, 124 blocks a
// workgroup on the 26B-A4B), where 4 blocks' loads in flight together pay (H100: the head 305 ->
// 270 us) while the products of a few blocks a workgroup are faster at 2 (docs/gpu.md,
// "Twenty-sixth round"). Each row's sum is qmatvec's, in the same order.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define MV_LOOP_ROWS_FIXED 4u
#include "common.glsl"
#include "qmatvec.glsl"

void main() { qmatvec_blocks(p.loop_groups); }
