// The decode product's body, shared by qmatvec.comp and moe_matvec.comp: rows of an MLX
// affine-quantized matrix (4 or 8 bits, any group size of at least 32) against one row of x.
//
// Why this shape (docs/gpu.md, "seventh round"; the shape llama.cpp's Vulkan backend also uses):
// the product is bound by memory latency, and what hides latency is many threads per SM with
// their loads independent. So no shared memory staging of x and no barrier before the sums: x
// is read straight from device memory (L1/L2 serve the repeats), 4 floats per load where x is
// 16-byte aligned. A workgroup of THREADS threads is MV_TEAMS teams of MV_LANES threads; a team
// computes MV_RPT consecutive rows, its lanes splitting the columns word by word (a 32-bit word:
// 8 4-bit or 4 8-bit columns, always inside one quantization group), so each x load serves
// MV_RPT rows. Each thread issues MV_UNROLL words' loads before it uses any. A team's partial
// sums are reduced by subgroupAdd where the device layer enables it (MV_SUBGROUP: arithmetic
// subgroup operations and a subgroup size that divides MV_LANES), else by a tree in shared
// memory. Per word it accumulates s * sum(x q) + b * sum(x), the CPU's arithmetic per group.
//
// The including kernel declares THREADS (constant_id 0, also its local_size_x_id), `packed`
// (uint words), MV_X4(i, aligned) (elements i..i+3 of x as a vec4; aligned: i is a multiple of
// 4 in the binding, so one 16-byte load may serve), MV_X_FACTOR(c) (a factor on column c of x:
// the weight of an RMSNorm folded into the product, else 1.0), MV_SCALE(i) and MV_BIAS(i) (scale
// and bias i as float), and calls mv_rows() then mv_reduce() from every thread (mv_reduce has
// barriers).
//
// Tried and dropped before (docs/gpu.md, fourth to sixth rounds): x staged in shared memory per
// workgroup with 8 rows of 32 lanes (rounds four to six: 15-19 µs per dispatch on the H200), the
// weight loads issued before the staging barrier (slower), 16 rows per workgroup with staging.

#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

// The defaults are what Metal runs (device.h's MatvecShape has the same).
// Rows per team (at most MV_MAX_RPT).
layout(constant_id = 1) const uint MV_RPT = 2u;
// Threads that split one team's columns: a power of two, at most THREADS.
layout(constant_id = 2) const uint MV_LANES = 128u;
// 1: reduce with subgroupAdd (the device layer sets it only where the subgroup size divides
// MV_LANES and THREADS and arithmetic subgroup operations exist); 0: a tree in shared memory.
layout(constant_id = 3) const uint MV_SUBGROUP = 0u;
// Words per thread whose loads are issued together (1, 2 or 4).
layout(constant_id = 4) const uint MV_UNROLL = 4u;

const uint MV_MAX_RPT = 4u;
const uint MV_TEAMS = THREADS / MV_LANES;
const uint MV_ROWS = MV_TEAMS * MV_RPT;  // rows per workgroup
// One slot per thread and reduced value (MV_MAX_RPT rows and a sum of squares); a shared array's
// size must be a literal (256: THREADS at most).
shared float mv_red[(MV_MAX_RPT + 1u) * 256u];

// The thread's index in its workgroup, numbered so that a team of MV_LANES consecutive indices
// is whole subgroups on the subgroup path (the order of gl_LocalInvocationID over subgroups is
// not specified).
uint mv_thread() {
  return MV_SUBGROUP != 0u ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID
                           : gl_LocalInvocationID.x;
}

// acc[i] = this thread's share of row (row0 + i)'s dot product with x[xb ..], for i < MV_RPT;
// the row's words start at word_base + i * row_words, its scales at scale_base + i * groups.
// ss: this thread's sum of squares of the raw x it read (once per column over the team; for an
// RMSNorm folded into the product). words: 0 for a team with nothing to do (its sums stay 0).
void mv_rows(uint word_base, uint scale_base, uint xb, bool x_aligned, uint cols, uint bits,
             uint group_size, uint lane, uint active_rows, out float acc[MV_MAX_RPT],
             out float ss) {
  [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i) acc[i] = 0.0;
  ss = 0.0;
  const uint row_words = cols * bits / 32u;
  const uint groups = cols / group_size;
  const uint words = active_rows == 0u ? 0u : row_words;
  const uint cols_per_word = 32u / bits;
  for (uint u0 = lane; u0 < words; u0 += MV_UNROLL * MV_LANES) {
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      if (j >= MV_UNROLL) break;  // (a literal bound, so that every compiler unrolls it)
      const uint u = u0 + j * MV_LANES;
      const bool in_row = u < words;
      const uint uw = in_row ? u : u0;  // a word inside the row; its sums are dropped
      const uint c = uw * cols_per_word;
      const uint si = c / group_size;
      // x: 8 (4-bit) or 4 (8-bit) columns, scaled by the folded norm's weight.
      const vec4 xa = MV_X4(xb + c, x_aligned);
      vec4 xz = vec4(0.0);  // columns 4-7 of a 4-bit word (an 8-bit word has 4 columns)
      if (bits == 4u) xz = MV_X4(xb + c + 4u, x_aligned);
      if (in_row) ss += dot(xa, xa) + dot(xz, xz);
      const vec4 fa = xa * vec4(MV_X_FACTOR(c), MV_X_FACTOR(c + 1u), MV_X_FACTOR(c + 2u),
                                MV_X_FACTOR(c + 3u));
      vec4 fz = vec4(0.0);
      if (bits == 4u)
        fz = xz * vec4(MV_X_FACTOR(c + 4u), MV_X_FACTOR(c + 5u), MV_X_FACTOR(c + 6u),
                       MV_X_FACTOR(c + 7u));
      const float sx = dot(fa, vec4(1.0)) + dot(fz, vec4(1.0));
      [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i) {
        if (i >= MV_RPT) break;
        // Rows past the last are read as the last (inside the binding) and dropped.
        const uint row = min(i, active_rows - 1u);
        const uint w = packed[word_base + row * row_words + uw];
        const uint gi = scale_base + row * groups + si;
        const float s = MV_SCALE(gi);
        const float b = MV_BIAS(gi);
        float sxq;
        if (bits == 4u) {
          const vec4 qa = vec4(uvec4(w, w >> 4u, w >> 8u, w >> 12u) & 15u);
          const vec4 qz = vec4(uvec4(w >> 16u, w >> 20u, w >> 24u, w >> 28u) & 15u);
          sxq = dot(fa, qa) + dot(fz, qz);
        } else {
          sxq = dot(fa, vec4(uvec4(w, w >> 8u, w >> 16u, w >> 24u) & 255u));
        }
        acc[i] += in_row ? s * sxq + b * sx : 0.0;
      }
    }
  }
}

// Sums each of the first `n` values of v over the team's MV_LANES threads; the team's lane 0
// gets the sums. Every thread of the workgroup must call it (barriers inside).
void mv_reduce(inout float v[MV_MAX_RPT + 1u], uint n, uint thread, uint lane) {
  if (MV_SUBGROUP != 0u) {
    [[unroll]] for (uint i = 0u; i <= MV_MAX_RPT; ++i)
      if (i < n) v[i] = subgroupAdd(v[i]);
    if (MV_LANES == gl_SubgroupSize) return;  // a team is one subgroup
    // A team spans MV_LANES / gl_SubgroupSize subgroups: their sums meet in shared memory.
    const uint sub = thread / gl_SubgroupSize;
    if (subgroupElect()) {
      [[unroll]] for (uint i = 0u; i <= MV_MAX_RPT; ++i)
        if (i < n) mv_red[i * 256u + sub] = v[i];
    }
    barrier();
    if (lane == 0u) {
      const uint per_team = MV_LANES / gl_SubgroupSize;
      [[unroll]] for (uint i = 0u; i <= MV_MAX_RPT; ++i) {
        if (i >= n) break;
        float total = 0.0;
        for (uint k = 0u; k < per_team; ++k) total += mv_red[i * 256u + sub + k];
        v[i] = total;
      }
    }
    return;
  }
  [[unroll]] for (uint i = 0u; i <= MV_MAX_RPT; ++i)
    if (i < n) mv_red[i * 256u + thread] = v[i];
  barrier();
  for (uint s = MV_LANES / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      [[unroll]] for (uint i = 0u; i <= MV_MAX_RPT; ++i)
        if (i < n) mv_red[i * 256u + thread] += mv_red[i * 256u + thread + s];
    }
    barrier();
  }
  [[unroll]] for (uint i = 0u; i <= MV_MAX_RPT; ++i)
    if (i < n) v[i] = mv_red[i * 256u + thread];
}
