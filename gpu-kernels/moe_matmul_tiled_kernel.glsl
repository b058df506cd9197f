// The routed experts' grouped prefill product over register tiles: the tile table's binding, the
// push constants and main of moe_matmul_tiled.comp (4 x 4 per thread) and
// moe_matmul_tiled_r8.comp (8 x 4), which define TILE_RM, TILE_RN and TILE_SLAB and include this.
// moe_matmul.comp with the register tiles of qmatmul_tiled.glsl: each workgroup takes one BM-row
// tile of an expert's matrix (x; BM = tile_rows) and one entry of the tile table (y + tile0):
// (e, first, count), up to BN = TILE_RM * TILE_RN * THREADS / BM consecutive rows first.. of the
// grouped input that expert e (a slot index for streamed experts) computes. The bank is read
// through one binding per section as moe_matvec.comp reads it: expert e's packed rows start at
// word e * packed_stride, its scales and biases at element e * scale_stride of their sections.

layout(std430, set = 0, binding = 5) readonly buffer Tiles { uint tiles[]; };  // 3 words each
layout(push_constant) uniform Params {
  uint rows;           // rows of one expert's matrix
  uint cols;
  uint bits;
  uint group_size;
  uint scale_type;
  uint packed_stride;  // words from one expert's packed rows to the next (a multiple of 4)
  uint scale_stride;   // scales (and biases) from one expert's to the next
  uint x_offset;       // element of x for grouped row 0
  uint x_stride;
  uint y_offset;       // element of y for grouped row 0, weight row 0
  uint y_stride;
  uint tile0;          // the table entry of workgroup y = 0 (dispatches of 65535 tiles at most)
  uint tile_rows;      // BM (qmatmul_tiled_kernel.glsl's rules)
} p;

#include "qmatmul_tiled.glsl"

void main() {
  const uint t = (p.tile0 + gl_WorkGroupID.y) * 3u;
  const uint e = tiles[t];
  const uint first = tiles[t + 1u];
  const uint count = tiles[t + 2u];  // 1 to BN
  tiled_product(p.rows, p.cols, p.bits, p.group_size, p.scale_type, e * p.packed_stride,
                e * p.scale_stride, p.x_offset + first * p.x_stride, p.x_stride,
                p.y_offset + first * p.y_stride, p.y_stride, count, p.tile_rows, 0u);
}
