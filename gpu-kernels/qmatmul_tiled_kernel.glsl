// Y[t, row0 + r] = sum_c W[r, c] X[t, c] for many tokens (prefill), register-tiled: the push
// constants and main of qmatmul_tiled.comp (4 x 4 per thread) and qmatmul_tiled_r8.comp
// (8 x 8), which define TILE_RM, TILE_RN and TILE_SLAB and include this (the body,
// qmatmul_tiled.glsl, is shared with the routed experts' grouped products). The tile is chosen per
// dispatch (push constant tile_rows, BM; BN = TILE_RM * TILE_RN * THREADS / BM): the host fits it
// to the token count (device.h's choose_matmul_tile).

// The dense products' push constants (one block, one host struct), then the tile.
#include "quant_params.glsl"

#include "qmatmul_tiled.glsl"

void main() {
  const uint bn = TILE_RM * TILE_RN * THREADS / p.tile_rows;
  tiled_product(p.rows, p.cols, p.bits, p.group_size, p.scale_type, 0u, p.scale0, p.x_offset,
                p.x_stride, p.y_offset, p.y_stride, p.tokens, p.tile_rows, gl_WorkGroupID.y * bn);
}
