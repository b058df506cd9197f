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
// flags: bits 0-1 the target, then has_weight, v_norm, also_v, ring, f16 (one word, so that the
// block leaves room for chain.glsl's fields).
#define QMATVEC_EXTRA_PARAMS \
  uint half_dim;             \
  uint heads;                \
  uint flags;                \
  float weight_offset;       \
  float eps;                 \
  uint pos0;                 \
  uint capacity;             \
  uint counter0;
#include "qmatvec.glsl"

layout(std430, set = 0, binding = 6) readonly buffer HeadWeight { float head_weight[]; };
layout(std430, set = 0, binding = 7) readonly buffer Table { float cos_sin[]; };
// The key cache (target 1) and the value cache (target 2, and target 1 with also_v).
layout(std430, set = 0, binding = 8) coherent buffer KeyCache { uint cache[]; };
layout(std430, set = 0, binding = 9) coherent buffer ValueCache { uint value_cache[]; };
#define TARGET (p.flags & 3u)
#define HAS_WEIGHT ((p.flags & 4u) != 0u)
#define V_NORM ((p.flags & 8u) != 0u)
#define ALSO_V ((p.flags & 16u) != 0u)
#define RING ((p.flags & 32u) != 0u)
#define F16 ((p.flags & 64u) != 0u)
// One arrival counter per (token, head) from counter0 on, 0 between dispatches: the last arrival
// resets it.
layout(std430, set = 0, binding = 10) coherent buffer Counters { uint counters[]; };
#include "arrival.glsl"

const uint VALUE_STAGE = 512u;  // where the also_v value waits in mv_x4 (head_dim is at most 512)

float weight_factor(uint c) { return HAS_WEIGHT ? p.weight_offset + head_weight[c] : 1.0; }

// The d values staged in mv_x4 from `stage` on, into the head's row `first` of the cache (or of
// value_cache), as float32 or as IEEE half (kv_store.comp's rounding).
void store_head(bool to_value_cache, uint first, uint stage, uint d) {
  const uint tid = gl_LocalInvocationID.x;
  if (F16) {
    for (uint i = tid; i < d / 2u; i += THREADS) {
      const uint word = f32_to_f16_bits(mv_x_get(stage + 2u * i)) |
                        (f32_to_f16_bits(mv_x_get(stage + 2u * i + 1u)) << 16);
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

void end_head();
void main() {
  qmatvec_product();
  end_head();
  chain_signal(p.chain_signal);
}

// The norm, RoPE and store of this workgroup's head where it is the head's last to finish.
void end_head() {
  const uint d = 2u * p.half_dim;
  const uint head = linear_group() * MV_ROWS / d;
  if (head >= p.heads) return;  // the grid's padding (uniform over the workgroup)
  const uint t = gl_WorkGroupID.z;
  if (!last_of_arrivals(p.counter0 + t * p.heads + head, d / MV_ROWS)) return;  // uniform

  const uint tid = gl_LocalInvocationID.x;
  const uint base = p.y_offset + t * p.y_stride + head * d;
  float inv = 1.0;
  if (TARGET != 2u || V_NORM) {  // uniform over the workgroup
    float ss = 0.0;
    for (uint c = tid; c < d; c += THREADS) ss += y[base + c] * y[base + c];
    inv = 1.0 / sqrt(mv_workgroup_sum(ss) / float(d) + p.eps);
  }
  barrier();  // the product's readers of mv_x4 are done
  if (TARGET != 2u) {  // the head normed and rotated, into mv_x4
    for (uint j = tid; j < p.half_dim; j += THREADS) {
      const float a = y[base + j] * inv * weight_factor(j);
      const float b = y[base + j + p.half_dim] * inv * weight_factor(j + p.half_dim);
      const float c = cos_sin[t * d + j];
      const float s = cos_sin[t * d + p.half_dim + j];
      mv_x_set(j, a * c - b * s);
      mv_x_set(j + p.half_dim, b * c + a * s);
    }
  }
  if (TARGET == 0u) {  // back into y, in place
    barrier();
    for (uint j = tid; j < d; j += THREADS) y[base + j] = mv_x_get(j);
    return;
  }
  if (TARGET == 2u || ALSO_V) {  // the raw row's norm is the value's too
    const uint stage = TARGET == 2u ? 0u : VALUE_STAGE;
    for (uint j = tid; j < d; j += THREADS)
      mv_x_set(stage + j, V_NORM ? y[base + j] * inv : y[base + j]);
  }
  barrier();
  const uint pos = p.pos0 + t;
  const uint slot = RING ? pos % p.capacity : pos;
  const uint first = slot * p.heads * d + head * d;  // the head's first element in the cache
  store_head(TARGET == 2u, first, 0u, d);
  if (TARGET == 1u && ALSO_V) store_head(true, first, VALUE_STAGE, d);
}
