// The narrow prefill product's body, shared by qmatmul.comp (one matrix) and moe_matmul.comp
// (the routed experts' grouped product: each workgroup one expert's tile): Y[t, r] =
// sum_c W[r, c] X[t, c] over a tile of 16 weight rows by 8 tokens. LANES = THREADS / 16 threads
// share a row (16 on a GPU); each reads one uvec4 of weight words (32 4-bit or 16 8-bit columns
// of one quantization group) per step, adjacent threads adjacent uvec4s, dequantizes s * q + b
// (as the CPU's qmatmul and MLX's qmm) and multiplies each value with the 8 tokens' inputs, which
// the workgroup stages in shared memory 512 columns at a time (as vec4s, one pad vec4 per 8 so
// that the 8 threads of a quarter warp hit different banks). The per-row partial sums of the 16
// threads are then added in shared memory. Each weight word is read once per 8 tokens. The
// portable path: no cooperative matrices.
//
// (The first version gave each thread a whole weight row: adjacent threads read words a row
// apart, one word per step, which left a large GPU waiting on memory.)
//
// The including kernel declares THREADS (constant_id 0) and the bindings packed4 (uvec4),
// scales, biases (uint words), x and y (float), then calls narrow_product from main.

const uint TILE_ROWS = 16u;
const uint LANES = THREADS / TILE_ROWS;  // threads per row
const uint TILE_TOKENS = 8u;
const uint SLAB = 512u;  // columns staged per step (a multiple of every group size)
const uint SLAB_VEC4 = SLAB / 4u;
const uint PADDED_VEC4 = SLAB_VEC4 + SLAB_VEC4 / 8u;
shared vec4 xs[TILE_TOKENS][PADDED_VEC4];
shared float partial[TILE_TOKENS][256];  // [token][THREADS at most]
const uint STAGED = TILE_TOKENS * SLAB_VEC4 / THREADS;  // vec4s each thread stages per slab
const uint MAX_STAGED = TILE_TOKENS * SLAB_VEC4 / 64u;  // at the fewest threads the host picks

// Position of vec4 v (columns 4v..4v+3 of the slab) in xs: one pad after every 8.
uint slot(uint v) { return v + (v >> 3u); }

// The tile of weight rows gl_WorkGroupID.x * 16.. and tokens t0..t0 + 7 (those below `tokens`)
// of a rows x cols matrix whose packed rows start at uvec4 quad_base of packed4 and whose scales
// (and biases) start at element scale0. Token t's input starts at x[x_offset + t * x_stride],
// its output row at y[y_offset + t * y_stride].
void narrow_product(uint rows, uint cols, uint bits, uint group_size, uint scale_type,
                    uint quad_base, uint scale0, uint x_offset, uint x_stride, uint y_offset,
                    uint y_stride, uint tokens, uint t0) {
  const uint tid = gl_LocalInvocationID.x;
  const uint lane = tid % LANES;
  const uint r = gl_WorkGroupID.x * TILE_ROWS + tid / LANES;
  const bool row_ok = r < rows;
  const uint cols_per_quad = bits == 4u ? 32u : 16u;
  const uint row_quads = cols / cols_per_quad;
  const uint groups = cols / group_size;
  float acc[TILE_TOKENS];
  [[unroll]] for (uint j = 0u; j < TILE_TOKENS; ++j) acc[j] = 0.0;

  for (uint c0 = 0u; c0 < cols; c0 += SLAB) {
    const uint width = min(SLAB, cols - c0);  // a multiple of 32
    barrier();  // the previous slab's readers are done
    // Stage 8 tokens x 512 columns: each thread STAGED vec4s (4 on a GPU), all loads issued
    // before any store.
    vec4 staged[MAX_STAGED];
    [[unroll]] for (uint i = 0u; i < STAGED; ++i) {
      const uint v = tid + i * THREADS;  // vec4 index over [token][SLAB_VEC4]
      const uint j = v / SLAB_VEC4;
      const uint c = (v % SLAB_VEC4) * 4u;
      const bool ok = t0 + j < tokens && c < width;
      const uint base = x_offset + min(t0 + j, tokens - 1u) * x_stride + c0 + min(c, width - 4u);
      vec4 xv = vec4(x[base], x[base + 1u], x[base + 2u], x[base + 3u]);
      staged[i] = ok ? xv : vec4(0.0);
    }
    [[unroll]] for (uint i = 0u; i < STAGED; ++i) {
      const uint v = tid + i * THREADS;
      xs[v / SLAB_VEC4][slot(v % SLAB_VEC4)] = staged[i];
    }
    barrier();
    if (row_ok) {
      const uint quads = width / cols_per_quad;
      const uint quad0 = quad_base + r * row_quads + c0 / cols_per_quad;
      for (uint q = lane; q < quads; q += LANES) {
        const uvec4 w = packed4[quad0 + q];
        const uint si = scale0 + r * groups + (c0 + q * cols_per_quad) / group_size;
        const float s = LOAD_SCALE(scales, si, scale_type);
        const float b = LOAD_SCALE(biases, si, scale_type);
        const uint v0 = q * cols_per_quad / 4u;  // the quad's first vec4 in the slab
        // 4-bit: each word is 8 columns (two vec4s); 8-bit: 4 columns (one vec4).
        [[unroll]] for (uint h = 0u; h < 8u; ++h) {
          if (bits == 8u && h >= 4u) break;
          const uint word = bits == 4u ? w[h / 2u] >> ((h % 2u) * 16u) : w[h];
          vec4 wv;
          if (bits == 4u) {
            wv = vec4(float(word & 15u), float((word >> 4u) & 15u), float((word >> 8u) & 15u),
                      float((word >> 12u) & 15u));
          } else {
            wv = vec4(float(word & 255u), float((word >> 8u) & 255u), float((word >> 16u) & 255u),
                      float(word >> 24u));
          }
          wv = s * wv + b;
          const uint xi = slot(v0 + h);
          [[unroll]] for (uint j = 0u; j < TILE_TOKENS; ++j) acc[j] += dot(wv, xs[j][xi]);
        }
      }
    }
  }
  [[unroll]] for (uint j = 0u; j < TILE_TOKENS; ++j) partial[j][tid] = acc[j];
  barrier();
  for (uint s = LANES / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      [[unroll]] for (uint j = 0u; j < TILE_TOKENS; ++j) partial[j][tid] += partial[j][tid + s];
    }
    barrier();
  }
  if (row_ok) {
    const uint row_tid = tid - lane;  // lane 0 of this row holds the sums
    for (uint j = lane; j < TILE_TOKENS; j += LANES) {
      if (t0 + j < tokens) y[y_offset + (t0 + j) * y_stride + r] = partial[j][row_tid];
    }
  }
}
