// The decode product's body, shared by qmatvec.comp and moe_matvec.comp: one row of an MLX
// affine-quantized matrix (4 or 8 bits, any group size of at least 32) against one row of x.
//
// Why this shape (docs/gpu.md, "fourth round"): the product is bound by memory latency, not
// bandwidth, unless many independent loads are in flight. A workgroup of THREADS threads (a
// specialization constant the device layer picks: 256 on a GPU, 64 on a CPU device such as
// lavapipe, where idle lanes and barriers cost real time) computes MV_ROWS = 8 rows,
// MV_LANES = THREADS / 8 threads per row (32 on a GPU); each thread reads one uvec4 (4 weight words:
// 32 4-bit or 16 8-bit columns, always inside one quantization group) per step, so a row of
// 2,816 4-bit columns is under 3 steps per thread instead of 22. x is staged once per workgroup
// in shared memory (all 8 rows read it), in chunks of MV_CHUNK columns, with one pad vec4 per
// 32 columns so that the 32 threads of a row, each reading its own 32 consecutive columns, hit 32
// different banks. Per group it accumulates s * sum(x q) + b * sum(x), the CPU's arithmetic.
//
// The including kernel declares: THREADS (constant_id 0, also its local_size_x_id), `packed4`
// (uvec4 words), MV_X(i) (element i of x as float), MV_X_FACTOR(c) (a factor on column c of x
// as it is staged: the weight of an RMSNorm folded into the product, else 1.0),
// MV_SCALE(i) and MV_BIAS(i) (scale and bias i as float), and calls mv_row() from every thread
// of the workgroup (it has barriers), then mv_reduce().
//
// (A variant that issued each thread's staging loads and its quads' loads in batches before
// using any, and converted codes to float by exponent bits instead of int-to-float, measured the
// same on the H200 and was dropped: docs/gpu.md, fourth round.)

#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

const uint MV_ROWS = 8u;
const uint MV_LANES = THREADS / MV_ROWS;
// 1 where the device layer found a row's MV_LANES threads to be one subgroup with arithmetic
// operations (DeviceInfo::matvec_subgroup_reduce): mv_reduce then sums a row by subgroupAdd, no
// barrier, instead of a shared-memory tree with a workgroup barrier per level.
layout(constant_id = 5) const uint MV_ROW_SUBGROUP = 0u;
// Blocks of MV_ROWS rows a workgroup of the looping grid (qmatvec_blocks) computes at once: 1, 2
// or 4 (DeviceInfo::matvec_loop_rows). With more, each thread reads its quads of that many rows
// against one read of x from shared memory and one sum(x), and their weight loads are in flight
// together (mv_chunk_rows). A kernel may fix it instead (MV_LOOP_ROWS_FIXED: qmatvec_wide.comp).
#ifdef MV_LOOP_ROWS_FIXED
const uint MV_LOOP_ROWS = MV_LOOP_ROWS_FIXED;
#else
layout(constant_id = 6) const uint MV_LOOP_ROWS = 2u;
#endif
const uint MV_CHUNK = 4096u;  // columns of x per staging pass (a multiple of every group size)
// x is held as vec4s, with a pad vec4 after every 32 columns: a thread's quad (32 or 16
// consecutive columns) starts on a vec4, so its x comes in 8 or 4 16-byte shared loads instead
// of 32 or 16 scalar ones, and the 8 threads of a quarter warp, 36 floats apart, still hit 32
// different banks.
const uint MV_PAD = 4u;
shared vec4 mv_x4[(MV_CHUNK + MV_CHUNK / 32u * MV_PAD) / 4u];
shared float mv_partial[256];  // THREADS at most (a shared array's size must be a literal)

// Each thread's sum of squares of the raw x it staged (for an RMSNorm folded into the product:
// mv_norm_factor() reduces it).
float mv_ss = 0.0;

// The thread's index in its workgroup, from which the including kernel takes its row and lane:
// numbered by subgroup on the subgroup path, so that a row's lanes are one subgroup (the order of
// gl_LocalInvocationID over subgroups is not specified).
uint mv_thread() {
  return MV_ROW_SUBGROUP != 0u ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID
                               : gl_LocalInvocationID.x;
}

// Position of column c (inside the chunk) in mv_x4's floats: a pad vec4 after every 32.
uint mv_slot(uint c) { return c + (c >> 5u) * MV_PAD; }

// Float i of mv_x4 (scratch use by including kernels: mv_x_get(i), mv_x_set(i, v)).
float mv_x_get(uint i) { return mv_x4[i >> 2u][i & 3u]; }
void mv_x_set(uint i, float v) { mv_x4[i >> 2u][i & 3u] = v; }

// Stages columns [c0, c0 + n) of x's row starting at xb into mv_x4 (n <= MV_CHUNK), each scaled
// by MV_X_FACTOR, and adds the squares of the raw values to mv_ss. Every thread of the workgroup
// must call it (barriers inside: before, so that earlier readers of mv_x4 are done, and after).
void mv_stage(uint xb, uint c0, uint n) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();
  for (uint c = tid; c < n; c += THREADS) {
    const float xv = MV_X(xb + c0 + c);
    mv_ss += xv * xv;
    mv_x_set(mv_slot(c), xv * MV_X_FACTOR(c0 + c));
  }
  barrier();
}

// acc plus the dot product of row `row_quad0` (its first uvec4 in packed4) with the staged
// columns [c0, c0 + n) (mv_stage), or acc where `row_ok` is false.
float mv_chunk(float acc, bool row_ok, uint row_quad0, uint scale_base, uint c0, uint n, uint bits,
               uint group_size, uint lane) {
  if (!row_ok) return acc;
  const uint cols_per_quad = bits == 4u ? 32u : 16u;
  const uint quads = n / cols_per_quad;
  const uint quad0 = row_quad0 + c0 / cols_per_quad;
  for (uint q = lane; q < quads; q += MV_LANES) {
    const uvec4 w = packed4[quad0 + q];
    const uint cl = q * cols_per_quad;  // first column inside the chunk
    const uint si = scale_base + (c0 + cl) / group_size;
    // The quad's columns are consecutive in mv_x4 (no pad inside) from a vec4 boundary.
    const uint xs4 = mv_slot(cl) >> 2u;
    float sxq = 0.0;
    float sx = 0.0;
    if (bits == 4u) {
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        const vec4 lo = mv_x4[xs4 + 2u * j];
        const vec4 hi = mv_x4[xs4 + 2u * j + 1u];
        [[unroll]] for (uint k = 0u; k < 8u; ++k) {
          const float xv = k < 4u ? lo[k] : hi[k - 4u];
          sxq += xv * float((w[j] >> (k * 4u)) & 15u);
          sx += xv;
        }
      }
    } else {
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        const vec4 xq = mv_x4[xs4 + j];
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
          const float xv = xq[k];
          sxq += xv * float((w[j] >> (k * 8u)) & 255u);
          sx += xv;
        }
      }
    }
    acc += MV_SCALE(si) * sxq + MV_BIAS(si) * sx;
  }
  return acc;
}

// mv_chunk for MV_LOOP_ROWS rows at once over the staged columns [0, n) (the looping grid's
// rows of at most MV_CHUNK columns): acc[r] plus row r's dot product, row r starting at its
// uvec4 row_quad0[r] with its scales at scale_base[r]. Each row adds mv_chunk's terms in
// mv_chunk's order, so its sum has the same bits.
void mv_chunk_rows(inout float acc[4], const uint row_quad0[4], const uint scale_base[4], uint n,
                   uint bits, uint group_size, uint lane) {
  const uint cols_per_quad = bits == 4u ? 32u : 16u;
  const uint quads = n / cols_per_quad;
  for (uint q = lane; q < quads; q += MV_LANES) {
    uvec4 w[4];
    [[unroll]] for (uint r = 0u; r < 4u; ++r) {
      if (r < MV_LOOP_ROWS) w[r] = packed4[row_quad0[r] + q];
    }
    const uint cl = q * cols_per_quad;
    const uint xs4 = mv_slot(cl) >> 2u;
    float sxq[4] = float[4](0.0, 0.0, 0.0, 0.0);
    float sx = 0.0;
    if (bits == 4u) {
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        const vec4 lo = mv_x4[xs4 + 2u * j];
        const vec4 hi = mv_x4[xs4 + 2u * j + 1u];
        [[unroll]] for (uint k = 0u; k < 8u; ++k) {
          const float xv = k < 4u ? lo[k] : hi[k - 4u];
          [[unroll]] for (uint r = 0u; r < 4u; ++r) {
            if (r < MV_LOOP_ROWS) sxq[r] += xv * float((w[r][j] >> (k * 4u)) & 15u);
          }
          sx += xv;
        }
      }
    } else {
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        const vec4 xq = mv_x4[xs4 + j];
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
          const float xv = xq[k];
          [[unroll]] for (uint r = 0u; r < 4u; ++r) {
            if (r < MV_LOOP_ROWS) sxq[r] += xv * float((w[r][j] >> (k * 8u)) & 255u);
          }
          sx += xv;
        }
      }
    }
    [[unroll]] for (uint r = 0u; r < 4u; ++r) {
      if (r < MV_LOOP_ROWS) {
        const uint si = scale_base[r] + cl / group_size;
        acc[r] += MV_SCALE(si) * sxq[r] + MV_BIAS(si) * sx;
      }
    }
  }
}

// The dot product of row `row_quad0` (its first uvec4 in packed4) with x[xb ..], or 0 where
// `row_ok` is false. Every thread of the workgroup must call it (barriers inside).
float mv_row(bool row_ok, uint row_quad0, uint scale_base, uint xb, uint cols, uint bits,
             uint group_size, uint lane) {
  float acc = 0.0;
  for (uint c0 = 0u; c0 < cols; c0 += MV_CHUNK) {
    const uint n = min(MV_CHUNK, cols - c0);
    mv_stage(xb, c0, n);
    acc = mv_chunk(acc, row_ok, row_quad0, scale_base, c0, n, bits, group_size, lane);
  }
  return acc;
}

// The sum of the MV_LANES partials of each row; the row's lane 0 gets it.
float mv_reduce(float acc, uint lane) {
  // (The subgroup size a pipeline runs with may differ from the one the device reports:
  // checked here, uniformly.)
  if (MV_ROW_SUBGROUP != 0u && gl_SubgroupSize == MV_LANES) return subgroupAdd(acc);
  const uint tid = mv_thread();
  mv_partial[tid] = acc;
  barrier();
  for (uint s = MV_LANES / 2u; s > 0u; s >>= 1u) {
    if (lane < s) mv_partial[tid] += mv_partial[tid + s];
    barrier();
  }
  return mv_partial[tid];
}

// MV_LOOP_ROWS whole blocks of MV_ROWS rows, b, b + step, ..., of a matrix whose row r starts at
// uvec4 quad_base + r * row_quads with its scales at scale_base + r * row_groups, against the
// staged columns [0, n): sums[i] is this thread's row's sum in block b + i * step (mv_reduce:
// every lane of the row holds it where subgroups sum, lane 0 otherwise). Every thread of the
// workgroup must call it (barriers inside where mv_reduce has them).
void mv_blocks_at_once(out float sums[4], uint b, uint step, uint quad_base, uint scale_base,
                       uint row_quads, uint row_groups, uint n, uint bits, uint group_size,
                       uint tid, uint lane) {
  uint quad0[4];
  uint scales0[4];
  float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    const uint r = (b + min(i, MV_LOOP_ROWS - 1u) * step) * MV_ROWS + tid / MV_LANES;
    quad0[i] = quad_base + r * row_quads;
    scales0[i] = scale_base + r * row_groups;
  }
  mv_chunk_rows(acc, quad0, scales0, n, bits, group_size, lane);
  sums = float[4](0.0, 0.0, 0.0, 0.0);
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    if (i < MV_LOOP_ROWS) sums[i] = mv_reduce(acc[i], lane);
  }
}

// The sum over the workgroup of every thread's v, by a shared-memory tree (mv_partial, free
// once mv_reduce's readers are done). Every thread of the workgroup must call it.
float mv_workgroup_sum(float v) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();  // earlier readers of mv_partial are done
  mv_partial[tid] = v;
  barrier();
  for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
    if (tid < s) mv_partial[tid] += mv_partial[tid + s];
    barrier();
  }
  return mv_partial[0];
}

// (mean(x^2) + eps)^-1/2 of the row of x the workgroup staged, from every thread's mv_ss: the
// factor of an RMSNorm folded into the product (sum_c W[r, c] x[c] f[c] times it is the product
// with the normed x). Every thread of the workgroup must call it (barriers inside).
float mv_norm_factor(uint cols, float eps) {
  return inv_rms(mv_workgroup_sum(mv_ss), cols, eps);
}
