// One of attention's input products and what follows it per head, in one dispatch: y = W x
// (qmatvec.comp, the layer's input norm folded in or not), then for each (token, head) the
// workgroup that finishes the head's rows last (an arrival counter per token and head: a head is
// head_dim / 8 workgroups of 8 rows) does what norm_rope.comp and kv_norm_store.comp do to that
// head, with their arithmetic in their order:
//   target 0 (the queries): the head normed with its weight and rotated, in place in y;
//   target 1 (the keys): the same into the key cache at the token's position, and with also_v
//     (a layer whose values are the keys' raw product) the value from the same raw row, normed
//     without a weight where v_norm, into the value cache;
//   target 2 (the values): normed without a weight where v_norm, into the value cache.
// As separate dispatches the norms, RoPE and store were one more dependent step between the
// products and attention (docs/gpu.md, "Fourteenth round").
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#define QMATVEC_Y_COHERENT
#define QMATVEC_EXTRA_PARAMS \
  uint half_dim;             \
  uint heads;                \
  uint target;               \
  uint has_weight;           \
  float weight_offset;       \
  float eps;                 \
  uint v_norm;               \
  uint also_v;               \
  uint pos0;                 \
  uint capacity;             \
  uint ring;                 \
  uint f16;                  \
  uint counter0;
#include "qmatvec.glsl"

layout(std430, set = 0, binding = 6) readonly buffer HeadWeight { float head_weight[]; };
layout(std430, set = 0, binding = 7) readonly buffer Table { float cos_sin[]; };
// The key cache (target 1) and the value cache (target 2, and target 1 with also_v).
layout(std430, set = 0, binding = 8) buffer KeyCache { uint cache[]; };
layout(std430, set = 0, binding = 9) buffer ValueCache { uint value_cache[]; };
// One arrival counter per (token, head) from counter0 on, 0 between dispatches: the last arrival
// resets it.
layout(std430, set = 0, binding = 10) coherent buffer Counters { uint counters[]; };
#include "arrival.glsl"

const uint VALUE_STAGE = 512u;  // where the also_v value waits in mv_x4 (head_dim is at most 512)

float weight_factor(uint c) { return p.has_weight != 0u ? p.weight_offset + head_weight[c] : 1.0; }

// The d values staged in mv_x4 from `stage` on, into the head's row `first` of the cache (or of
// value_cache), as float32 or as IEEE half (kv_store.comp's rounding).
void store_head(bool to_value_cache, uint first, uint stage, uint d) {
  const uint tid = gl_LocalInvocationID.x;
  if (p.f16 != 0u) {
    for (uint i = tid; i < d / 2u; i += THREADS) {
      const uint word = f16_pair_bits(mv_x_get(stage + 2u * i), mv_x_get(stage + 2u * i + 1u));
      if (to_value_cache)
        value_cache[first / 2u + i] = word;
      else
        cache[first / 2u + i] = word;
    }
  } else {
    for (uint j = tid; j < d; j += THREADS) {
      if (to_value_cache)
        value_cache[first + j] = floatBitsToUint(mv_x_get(stage + j));
      else
        cache[first + j] = floatBitsToUint(mv_x_get(stage + j));
    }
  }
}

void main() {
  qmatvec_product();
  const uint d = 2u * p.half_dim;
  const uint head = linear_group() * MV_ROWS / d;
  if (head >= p.heads) return;  // the grid's padding (uniform over the workgroup)
  const uint t = gl_WorkGroupID.z;
  if (!last_of_arrivals(p.counter0 + t * p.heads + head, d / MV_ROWS)) return;  // uniform

  const uint tid = gl_LocalInvocationID.x;
  const uint base = p.y_offset + t * p.y_stride + head * d;
  float inv = 1.0;
  if (p.target != 2u || p.v_norm != 0u) {  // uniform over the workgroup
    float ss = 0.0;
    for (uint c = tid; c < d; c += THREADS) ss += y[base + c] * y[base + c];
    inv = inv_rms(mv_workgroup_sum(ss), d, p.eps);
  }
  barrier();  // the product's readers of mv_x4 are done
  if (p.target != 2u) {  // the head normed and rotated, into mv_x4
    for (uint j = tid; j < p.half_dim; j += THREADS) {
      const float a = y[base + j] * inv * weight_factor(j);
      const float b = y[base + j + p.half_dim] * inv * weight_factor(j + p.half_dim);
      const vec2 r = rotate_pair(a, b, cos_sin[t * d + j], cos_sin[t * d + p.half_dim + j]);
      mv_x_set(j, r.x);
      mv_x_set(j + p.half_dim, r.y);
    }
  }
  if (p.target == 0u) {  // back into y, in place
    barrier();
    for (uint j = tid; j < d; j += THREADS) y[base + j] = mv_x_get(j);
    return;
  }
  if (p.target == 2u || p.also_v != 0u) {  // the raw row's norm is the value's too
    const uint stage = p.target == 2u ? 0u : VALUE_STAGE;
    for (uint j = tid; j < d; j += THREADS)
      mv_x_set(stage + j, p.v_norm != 0u ? y[base + j] * inv : y[base + j]);
  }
  barrier();
  const uint pos = p.pos0 + t;
  const uint slot = p.ring != 0u ? pos % p.capacity : pos;
  const uint first = slot * p.heads * d + head * d;  // the head's first element in the cache
  store_head(p.target == 2u, first, 0u, d);
  if (p.target == 1u && p.also_v != 0u) store_head(true, first, VALUE_STAGE, d);
}
