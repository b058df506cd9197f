// Prefill attention in tiles: a workgroup takes BR consecutive query rows of one head and walks
// the keys those rows see (the first row's first visible key to the last row's position) in
// blocks of BC keys, keeping each row's running max m, sum l and output o (the online softmax:
// a new block's max M rescales what came before by exp(m - M)). Each block's keys and values are
// loaded once for BR rows, where attention_partial.comp loads them once per row: at thousands of
// rows that kernel spent most of prefill's attention time reloading the same keys (docs/gpu.md,
// "Sixteenth round"). No score matrix larger than BR x BC is held.
//
// Per block, three phases share the workgroup:
//   scores  BR x BC, each thread a 2 x 2 block in registers, over head_dim in slabs of 64 columns
//           (both tiles' rows staged as 16 vec4s plus one pad vec4, as qmatmul_tiled.glsl does);
//   softmax the L = THREADS / BR lanes of a row take 4 of its keys each: the block's max, the
//           new m, the factor exp(m_old - m_new) for what came before, the weights and their sum;
//   values  o += P V, each thread owning 4 rows' vec4 of the output per chunk of 16 L columns, the
//           chunk's values staged once for the BR rows, the weights kept key-major so that one
//           vec4 load gives a key's weights for the thread's 4 rows.
// BC = 4 L, so a row's lanes cover a block's keys in the softmax. What limits this kernel is
// shared-memory traffic, not arithmetic: threads of a subgroup-sized group of 32 take a 4 x 8
// block of the scores and 4 row quads x 8 lanes of the values, so that each of their shared loads
// touches few distinct addresses (a first version, with one row per thread and consecutive
// threads along one row, moved about 2.5 times the bytes per multiply-add). The grouping is only
// an order of the threads: any subgroup size gives the same results.
//
// The host picks BR (tile_rows, a power of two, THREADS / 8 <= BR <= 32) so that o fits 16 vec4s
// (BR head_dim <= 64 THREADS). Shared memory is sized for the largest tiles (25 KB), never by a
// specialization constant (SPIRV-Cross translates it as is). Masked scores are a large negative
// number and weigh exactly 0: no infinity, which Metal's fast math does not promise to keep.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer KCache { uint k_cache[]; };
layout(std430, set = 0, binding = 2) readonly buffer VCache { uint v_cache[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float out_values[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint n_heads;
  uint group;  // query heads per KV head
  uint head_dim;
  uint width;  // kv_heads * head_dim
  uint q_offset;
  uint q_stride;
  uint pos0;
  uint capacity;
  uint ring;
  uint window;  // 0: full attention
  uint f16;
  float scale;
  uint out_offset;
  uint out_stride;
  uint tile_rows;  // BR
} p;

const uint SLAB = 64u;                 // head_dim columns per step of the scores
const uint ROW_VEC4 = SLAB / 4u + 1u;  // a staged row's stride in vec4s (one pad)
const uint MAX_ROWS = 32u;             // BR at most
const uint MAX_STAGED_ROWS = 64u;      // BR + BC at most
const uint VALUE_STAGE = 1024u;        // vec4s of values staged at once (16 KB)
const uint OUT_VEC4 = 16u;             // o's vec4s per thread: 4 rows x 4 chunks at most
const float MASKED = -3.0e38;          // a score no key may take; weighs 0

// The scores' slabs (BR + BC rows of ROW_VEC4), then the values' chunks (BC x 4L vec4s each, as
// many as VALUE_STAGE holds at once).
shared vec4 stage[MAX_STAGED_ROWS * ROW_VEC4];
// The block's scores, then weights, key-major: key k's rows 4i..4i+3 at [k * (BR / 4 + 1) + i]
// (one pad vec4 per key). BC (BR + 4) <= 4 THREADS + 4 BC floats.
shared vec4 weights[(4u * 256u + 4u * 32u) / 4u];
shared float lane_max[256];  // THREADS at most
shared float lane_sum[256];
shared float row_max[MAX_ROWS];
shared float row_sum[MAX_ROWS];
shared float row_scale[MAX_ROWS];  // exp(m_old - m_new) of the latest block

#include "kv_read.glsl"

// Four elements j..j+3 of a head's row starting at element base of a cache, zeros from d on.
// Where head_dim is a multiple of 4 (every real model), base + j is too: two whole words of an
// f16 cache or four of an f32 one, with no per-element test.
vec4 cache_vec4(uint base, uint j, uint d, bool is_k) {
  if (d % 4u == 0u) {
    if (j >= d) return vec4(0.0);
    const uint e = base + j;
    if (p.f16 != 0u) {
      const uint w = e >> 1u;
      return is_k ? vec4(unpackHalf2x16(k_cache[w]), unpackHalf2x16(k_cache[w + 1u]))
                  : vec4(unpackHalf2x16(v_cache[w]), unpackHalf2x16(v_cache[w + 1u]));
    }
    return is_k ? uintBitsToFloat(uvec4(k_cache[e], k_cache[e + 1u], k_cache[e + 2u], k_cache[e + 3u]))
                : uintBitsToFloat(uvec4(v_cache[e], v_cache[e + 1u], v_cache[e + 2u], v_cache[e + 3u]));
  }
  vec4 v = vec4(0.0);
  [[unroll]] for (uint u = 0u; u < 4u; ++u)
    if (j + u < d) v[u] = cache_value(base + j + u, is_k);
  return v;
}

// Thread tid's place in a grid of `across` x `down` threads (across * down = THREADS, both powers
// of two), in blocks of 32 threads that are `wide` across where the grid allows: x, y.
uvec2 grid_place(uint tid, uint across, uint down, uint wide) {
  uint w = min(wide, across);
  if (32u / w > down) w = 32u / down;
  const uint tall = 32u / w;
  const uint blocks_across = across / w;
  const uint block = tid / 32u, i = tid % 32u;
  return uvec2((block % blocks_across) * w + i % w, (block / blocks_across) * tall + i / w);
}

void main() {
  const uint id = linear_group();  // tile * n_heads + h: the heads of one KV head side by side
  const uint br = p.tile_rows;
  const uint tiles = (p.rows + br - 1u) / br;
  if (id >= tiles * p.n_heads) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint h = id % p.n_heads;
  const uint t0 = (id / p.n_heads) * br;
  const uint d = p.head_dim;
  const uint kv_head = h / p.group;
  const uint lanes = THREADS / br;      // L
  const uint bc = 4u * lanes;           // keys per block
  const uint quad_lanes = 4u * lanes;   // threads per 4 rows in the values phase
  const uint chunk = 4u * quad_lanes;   // o's columns per chunk
  const uint quads_stride = br / 4u + 1u;  // weights' vec4s per key

  // Scores: thread (sc, sr) holds rows sr, sr + br/2 and keys sc, sc + bc/2 of the block.
  const uvec2 s_at = grid_place(tid, bc / 2u, br / 2u, 8u);
  const uint sc = s_at.x, sr = s_at.y;
  // Softmax: row r, lane `lane`.
  const uint r = tid / lanes;
  const uint lane = tid % lanes;
  // Values: rows 4 vq .. 4 vq + 3, columns vl * 4 .. + 3 of each chunk.
  const uvec2 v_at = grid_place(tid, quad_lanes, br / 4u, 8u);
  const uint vl = v_at.x, vq = v_at.y;

  const uint t_last = min(t0 + br, p.rows) - 1u;
  const uint k_first = first_visible(p.pos0 + t0);
  const uint k_end = p.pos0 + t_last + 1u;  // one past the last key any row sees
  const uint head_base = kv_head * d;

  if (tid < br) {
    row_max[tid] = MASKED;
    row_sum[tid] = 0.0;
  }
  vec4 o[OUT_VEC4];  // o[c * 4 + i]: row 4 vq + i, chunk c
  [[unroll]] for (uint c = 0u; c < OUT_VEC4; ++c) o[c] = vec4(0.0);

  for (uint kb = k_first; kb < k_end; kb += bc) {
    // ---- scores ----
    // acc[i * 2 + j]: row sr + i * br/2, key sc + j * bc/2, as 4 independent partial sums (one
    // dot product's 4 dependent multiply-adds per step left the multipliers waiting)
    vec4 acc[4];
    [[unroll]] for (uint i = 0u; i < 4u; ++i) acc[i] = vec4(0.0);
    for (uint c0 = 0u; c0 < d; c0 += SLAB) {
      barrier();  // the previous slab (or block's values and weights) read
      for (uint v = tid; v < (br + bc) * (SLAB / 4u); v += THREADS) {
        const uint row = v / (SLAB / 4u);
        const uint j = c0 + (v % (SLAB / 4u)) * 4u;
        vec4 x = vec4(0.0);
        if (row < br) {
          const uint t = t0 + row;
          if (t < p.rows) {
            const uint base = p.q_offset + t * p.q_stride + h * d;
            if (d % 4u == 0u) {
              if (j < d) x = vec4(q[base + j], q[base + j + 1u], q[base + j + 2u], q[base + j + 3u]);
            } else {
              [[unroll]] for (uint u = 0u; u < 4u; ++u)
                if (j + u < d) x[u] = q[base + j + u];
            }
          }
        } else {
          const uint key = kb + row - br;
          if (key < k_end) {
            const uint slot = p.ring != 0u ? key % p.capacity : key;
            x = cache_vec4(slot * p.width + head_base, j, d, true);
          }
        }
        stage[row * ROW_VEC4 + (v % (SLAB / 4u))] = x;
      }
      barrier();
      [[unroll]] for (uint k = 0u; k < SLAB / 4u; ++k) {
        const vec4 qa = stage[sr * ROW_VEC4 + k];
        const vec4 qb = stage[(sr + br / 2u) * ROW_VEC4 + k];
        const vec4 ka = stage[(br + sc) * ROW_VEC4 + k];
        const vec4 kb4 = stage[(br + sc + bc / 2u) * ROW_VEC4 + k];
        acc[0] += qa * ka;
        acc[1] += qa * kb4;
        acc[2] += qb * ka;
        acc[3] += qb * kb4;
      }
    }
    [[unroll]] for (uint i = 0u; i < 2u; ++i) {
      const uint row = sr + i * (br / 2u);
      const uint pos = p.pos0 + t0 + row;
      [[unroll]] for (uint j = 0u; j < 2u; ++j) {
        const uint col = sc + j * (bc / 2u);
        const uint key = kb + col;
        const bool seen = t0 + row < p.rows && key <= pos && key >= first_visible(pos);
        const vec4 a = acc[i * 2u + j];
        const float score = (a.x + a.y) + (a.z + a.w);
        weights[col * quads_stride + row / 4u][row % 4u] = seen ? score * p.scale : MASKED;
      }
    }
    barrier();

    // ---- softmax: row r's lanes take keys lane + u * L ----
    float local_max = MASKED;
    [[unroll]] for (uint u = 0u; u < 4u; ++u)
      local_max = max(local_max, weights[(lane + u * lanes) * quads_stride + r / 4u][r % 4u]);
    lane_max[tid] = local_max;
    barrier();
    float block_max = MASKED;
    for (uint i = 0u; i < lanes; ++i) block_max = max(block_max, lane_max[r * lanes + i]);
    const float m_old = row_max[r];
    const float m_new = max(m_old, block_max);
    float local_sum = 0.0;
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
      const uint at = (lane + u * lanes) * quads_stride + r / 4u;
      const float s = weights[at][r % 4u];
      const float w = s > 0.5 * MASKED ? exp(s - m_new) : 0.0;
      weights[at][r % 4u] = w;
      local_sum += w;
    }
    lane_sum[tid] = local_sum;
    barrier();  // every lane's m_old read, weights and sums written
    if (lane == 0u) {
      const float rescale = exp(m_old - m_new);
      float sum = 0.0;
      for (uint i = 0u; i < lanes; ++i) sum += lane_sum[r * lanes + i];
      row_sum[r] = row_sum[r] * rescale + sum;
      row_max[r] = m_new;
      row_scale[r] = rescale;
    }

    // ---- values: o's chunk c is columns c * chunk + vl * 4 .. + 3 of rows 4 vq .. + 3;
    // `together` chunks are staged at once, as many as VALUE_STAGE holds ----
    const uint together = clamp(VALUE_STAGE / (bc * quad_lanes), 1u, OUT_VEC4 / 4u);
    [[unroll]] for (uint c = 0u; c < OUT_VEC4 / 4u; ++c) {
      if (c * chunk < d) {  // uniform
        const uint at = (c % together) * bc * quad_lanes;
        if (at == 0u) {
          barrier();  // the previous chunks' values read; the row scales written
          for (uint v = tid; v < together * bc * quad_lanes; v += THREADS) {
            const uint col = (c + v / (bc * quad_lanes)) * chunk + (v % quad_lanes) * 4u;
            const uint key = kb + (v / quad_lanes) % bc;
            vec4 x = vec4(0.0);
            if (key < k_end) {
              const uint slot = p.ring != 0u ? key % p.capacity : key;
              x = cache_vec4(slot * p.width + head_base, col, d, false);
            }
            stage[v] = x;
          }
          barrier();
        }
        if (c == 0u) {
          [[unroll]] for (uint i = 0u; i < OUT_VEC4; ++i) o[i] *= row_scale[4u * vq + i % 4u];
        }
        vec4 s0 = o[c * 4u], s1 = o[c * 4u + 1u], s2 = o[c * 4u + 2u], s3 = o[c * 4u + 3u];
        for (uint k = 0u; k < bc; ++k) {
          const vec4 w = weights[k * quads_stride + vq];
          const vec4 v = stage[at + k * quad_lanes + vl];
          s0 += w.x * v;
          s1 += w.y * v;
          s2 += w.z * v;
          s3 += w.w * v;
        }
        o[c * 4u] = s0;
        o[c * 4u + 1u] = s1;
        o[c * 4u + 2u] = s2;
        o[c * 4u + 3u] = s3;
      }
    }
  }

  barrier();  // the last block's row sums written
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    const uint row = 4u * vq + i;
    const uint t = t0 + row;
    if (t < p.rows) {
      const float inv = 1.0 / row_sum[row];
      const uint out_base = p.out_offset + t * p.out_stride + h * d;
      [[unroll]] for (uint c = 0u; c < OUT_VEC4 / 4u; ++c) {
        [[unroll]] for (uint u = 0u; u < 4u; ++u) {
          const uint j = c * chunk + vl * 4u + u;
          if (j < d) out_values[out_base + j] = o[c * 4u + i][u] * inv;
        }
      }
    }
  }
}
