// The experts' down product's body (moe_matvec_down.comp): rows of an MLX affine-quantized
// matrix (4 or 8 bits, any group size of at least 32) against one row of x, x read straight from
// device memory instead of staged in shared memory.
//
// Why a body of its own (docs/gpu.md, seventh and eighth rounds): the down product's rows are
// narrow (704 columns on Gemma 4 26B-A4B: 88 4-bit words), so matvec.glsl's 32 threads per row
// over uvec4s leave most threads idle and its x staging costs a barrier for little reuse. Here a
// workgroup of THREADS threads is MV_TEAMS teams of MV_LANES threads; a team computes MV_RPT
// consecutive rows, its lanes splitting the columns word by word (a 32-bit word: 8 4-bit or 4
// 8-bit columns, always inside one quantization group), so each x load serves MV_RPT rows. Each
// thread issues MV_UNROLL words' loads before it uses any. A team's partial sums are reduced by
// subgroupAdd where the device layer enables it (MV_SUBGROUP: arithmetic subgroup operations and
// a subgroup size that divides MV_LANES), else by a tree in shared memory; no subgroup size is
// assumed. Per word it accumulates s * sum(x q) + b * sum(x), the CPU's arithmetic per group.
// On the H200 this body at 4 rows x 32 lanes x 2 words took the down product from 73.0 to
// 48.4 ms per 65 tokens; for the wide products (qmatvec) it was 27% slower than matvec.glsl's
// staged x, so those keep the staged body.
//
// The including kernel declares THREADS (constant_id 0, also its local_size_x_id), `packed`
// (uint words), MV_X4(i, aligned) (elements i..i+3 of x as a vec4; aligned: i is a multiple of
// 4 in the binding, so one 16-byte load may serve), MV_SCALE(i) and MV_BIAS(i) (scale and bias i
// as float), and calls mv_rows() then mv_reduce() from every thread (mv_reduce has barriers).

#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

// The defaults are what Metal runs (device.h's MatvecShape has the same).
// Rows per team (at most MV_MAX_RPT).
layout(constant_id = 1) const uint MV_RPT = 4u;
// Threads that split one team's columns: a power of two, at most THREADS.
layout(constant_id = 2) const uint MV_LANES = 32u;
// 1: reduce with subgroupAdd (the device layer sets it only where the subgroup size divides
// MV_LANES and THREADS and arithmetic subgroup operations exist); 0: a tree in shared memory.
layout(constant_id = 3) const uint MV_SUBGROUP = 0u;
// Words per thread whose loads are issued together (1, 2 or 4).
layout(constant_id = 4) const uint MV_UNROLL = 1u;

const uint MV_MAX_RPT = 4u;
const uint MV_TEAMS = THREADS / MV_LANES;
const uint MV_ROWS = MV_TEAMS * MV_RPT;  // rows per workgroup
// One slot per thread and row; a shared array's size must be a literal (256: THREADS at most).
shared float mv_red[MV_MAX_RPT * 256u];

// The thread's index in its workgroup, numbered so that a team of MV_LANES consecutive indices
// is whole subgroups on the subgroup path (the order of gl_LocalInvocationID over subgroups is
// not specified).
uint mv_thread() {
  return MV_SUBGROUP != 0u ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID
                           : gl_LocalInvocationID.x;
}

// acc[i] = this thread's share of row (row0 + i)'s dot product with x[xb ..], for i < MV_RPT;
// the row's words start at word_base + i * row_words, its scales at scale_base + i * groups.
// active_rows: 0 for a team with nothing to do (its sums stay 0).
void mv_rows(uint word_base, uint scale_base, uint xb, bool x_aligned, uint cols, uint bits,
             uint group_size, uint lane, uint active_rows, out float acc[MV_MAX_RPT]) {
  [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i) acc[i] = 0.0;
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
      // x: 8 (4-bit) or 4 (8-bit) columns.
      const vec4 xa = MV_X4(xb + c, x_aligned);
      vec4 xz = vec4(0.0);  // columns 4-7 of a 4-bit word (an 8-bit word has 4 columns)
      if (bits == 4u) xz = MV_X4(xb + c + 4u, x_aligned);
      const float sx = dot(xa, vec4(1.0)) + dot(xz, vec4(1.0));
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
          sxq = dot(xa, qa) + dot(xz, qz);
        } else {
          sxq = dot(xa, vec4(uvec4(w, w >> 8u, w >> 16u, w >> 24u) & 255u));
        }
        acc[i] += in_row ? s * sxq + b * sx : 0.0;
      }
    }
  }
}

// Sums each of the MV_RPT values of v over the team's MV_LANES threads; the team's lane 0 gets
// the sums. Every thread of the workgroup must call it (barriers inside).
void mv_reduce(inout float v[MV_MAX_RPT], uint thread, uint lane) {
  if (MV_SUBGROUP != 0u) {
    [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i)
      if (i < MV_RPT) v[i] = subgroupAdd(v[i]);
    if (MV_LANES == gl_SubgroupSize) return;  // a team is one subgroup (uniform)
    // A team spans MV_LANES / gl_SubgroupSize subgroups: their sums meet in shared memory.
    const uint sub = thread / gl_SubgroupSize;
    if (subgroupElect()) {
      [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i)
        if (i < MV_RPT) mv_red[i * 256u + sub] = v[i];
    }
    barrier();
    if (lane == 0u) {
      const uint per_team = MV_LANES / gl_SubgroupSize;
      [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i) {
        if (i >= MV_RPT) break;
        float total = 0.0;
        for (uint k = 0u; k < per_team; ++k) total += mv_red[i * 256u + sub + k];
        v[i] = total;
      }
    }
    return;
  }
  [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i)
    if (i < MV_RPT) mv_red[i * 256u + thread] = v[i];
  barrier();
  for (uint s = MV_LANES / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i)
        if (i < MV_RPT) mv_red[i * 256u + thread] += mv_red[i * 256u + thread + s];
    }
    barrier();
  }
  [[unroll]] for (uint i = 0u; i < MV_MAX_RPT; ++i)
    if (i < MV_RPT) v[i] = mv_red[i * 256u + thread];
}
