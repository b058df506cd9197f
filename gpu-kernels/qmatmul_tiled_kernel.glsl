// Y[t, row0 + r] = sum_c W[r, c] X[t, c] for many tokens (prefill), register-tiled: the push
// constants and main of qmatmul_tiled.comp (4 x 4 per thread) and qmatmul_tiled_r8.comp
// (8 x 8), which define TILE_RM, TILE_RN and TILE_SLAB and include this (the body,
// qmatmul_tiled.glsl, is shared with the routed experts' grouped products). The tile is chosen per
// dispatch (push constant tile_rows, BM; BN = TILE_RM * TILE_RN * THREADS / BM): the host fits it
// to the token count (device.h's choose_matmul_tile).

// The block of qmatvec.comp (the host fills one struct for both), then the tile.
layout(push_constant) uniform Params {
  uint rows;        // rows in this chunk (the bindings start at its first row)
  uint cols;        // a multiple of the group size, so of 32
  uint bits;
  uint group_size;
  uint scale_type;
  uint scale0;      // index of the chunk's first scale inside the scale/bias bindings
  uint x_offset;
  uint x_stride;
  uint y_offset;    // element of y for token 0, row 0 of the chunk
  uint y_stride;
  uint tokens;
  uint norm_mode;   // (qmatvec's; 0 here)
  float norm_offset;
  float norm_eps;
  float col_scale;
  uint geglu_half;  // (qmatvec's; 0 here)
  uint tile_rows;   // BM: a power of two, BM / TILE_RM <= THREADS, BM + BN <= 5120 / TILE_SLAB
} p;

#include "qmatmul_tiled.glsl"

void main() {
  const uint bn = TILE_RM * TILE_RN * THREADS / p.tile_rows;
  tiled_product(p.rows, p.cols, p.bits, p.group_size, p.scale_type, 0u, p.scale0, p.x_offset,
                p.x_stride, p.y_offset, p.y_stride, p.tokens, p.tile_rows, gl_WorkGroupID.y * bn);
}
