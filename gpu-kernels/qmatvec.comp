// y[t, row0 + r] = sum_c W[r, c] x[t, c] for an MLX affine-quantized W (4 or 8 bits, any group
// size, bf16/f16/f32 scales and biases): the decode product, used for up to 4 rows of x (one
// z-slice each). Each workgroup computes 8 rows with THREADS / 8 threads per row (32 on a GPU), each thread reading 4
// weight words at once; every weight word is read once per token (matvec.glsl says why).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "qmatvec.glsl"

// p.loop_groups: 0, one workgroup per block of rows; else the grid has that many workgroups per
// token, each looping over blocks (qmatvec_blocks; the host sets it only for rows of at most
// MV_CHUNK columns).
void main() {
  if (p.loop_groups == 0u)
    qmatvec_product();
  else
    qmatvec_blocks(p.loop_groups);
  chain_signal(p.chain_signal);
}
