// Attention's keys and values into the layer's cache in one pass: for row t (position pos0 + t)
// and KV head h, the key is normed and rotated as norm_rope.comp does (the k norm with its weight,
// then RoPE from the host's [rows, 2 * half] cos/sin table), the value normed without a weight as
// rms_norm.comp does (v_norm; else copied), and both stored at the position's row of the caches
// (`pos % capacity` on ring buffers) as float32 or as IEEE half rounded to nearest even, as
// kv_store.comp stores them. The same arithmetic in the same order as those three kernels, in
// one dispatch and one dependent step instead of two (docs/gpu.md, "Eleventh round"); k and v are
// only read. One workgroup per (row, head, key or value).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(constant_id = 0) const uint THREADS = 256u;  // 256, fewer on a CPU device (docs/gpu.md)
layout(local_size_x = 256, local_size_x_id = 0) in;
layout(std430, set = 0, binding = 0) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 1) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 2) readonly buffer KWeight { float k_weight[]; };
layout(std430, set = 0, binding = 3) readonly buffer Table { float cos_sin[]; };
layout(std430, set = 0, binding = 4) buffer KCache { uint k_cache[]; };
layout(std430, set = 0, binding = 5) buffer VCache { uint v_cache[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint kv_heads;
  uint half_dim;
  uint k_offset;
  uint k_stride;
  uint v_offset;
  uint v_stride;
  uint has_weight;  // the k norm's weight (weight_offset + k_weight[c]); 0: none
  float weight_offset;
  float eps;
  uint v_norm;  // 1: the value is normed (no weight); 0: stored as it is
  uint pos0;
  uint capacity;
  uint ring;
  uint f16;
} p;

const uint MAX_HEAD_DIM = 512u;
shared float partial[256];        // THREADS at most
shared float row[MAX_HEAD_DIM];  // the head's values as they go into the cache

float weight_factor(uint c) { return p.has_weight != 0u ? p.weight_offset + k_weight[c] : 1.0; }

float source(bool is_k, uint i) { return is_k ? k[i] : v[i]; }

void main() {
  const uint g = linear_group();
  if (g >= p.rows * p.kv_heads * 2u) return;  // uniform over the workgroup
  const uint tid = gl_LocalInvocationID.x;
  const bool is_k = (g & 1u) == 0u;
  const uint t = (g >> 1u) / p.kv_heads;
  const uint h = (g >> 1u) % p.kv_heads;
  const uint d = 2u * p.half_dim;
  const uint base = is_k ? p.k_offset + t * p.k_stride + h * d : p.v_offset + t * p.v_stride + h * d;

  float inv = 1.0;
  if (is_k || p.v_norm != 0u) {  // uniform over the workgroup
    float ss = 0.0;
    for (uint c = tid; c < d; c += THREADS) ss += source(is_k, base + c) * source(is_k, base + c);
    partial[tid] = ss;
    barrier();
    for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
      if (tid < s) partial[tid] += partial[tid + s];
      barrier();
    }
    inv = inv_rms(partial[0], d, p.eps);
  }
  if (is_k) {
    for (uint j = tid; j < p.half_dim; j += THREADS) {
      const float a = k[base + j] * inv * weight_factor(j);
      const float b = k[base + j + p.half_dim] * inv * weight_factor(j + p.half_dim);
      const vec2 r = rotate_pair(a, b, cos_sin[t * d + j], cos_sin[t * d + p.half_dim + j]);
      row[j] = r.x;
      row[j + p.half_dim] = r.y;
    }
  } else {
    for (uint j = tid; j < d; j += THREADS) row[j] = p.v_norm != 0u ? v[base + j] * inv : v[base + j];
  }
  barrier();

  const uint pos = p.pos0 + t;
  const uint slot = p.ring != 0u ? pos % p.capacity : pos;
  const uint first = slot * p.kv_heads * d + h * d;  // the head's first element in the cache
  if (p.f16 != 0u) {
    for (uint i = tid; i < p.half_dim; i += THREADS) {
      const uint word = f16_pair_bits(row[2u * i], row[2u * i + 1u]);
      if (is_k)
        k_cache[first / 2u + i] = word;
      else
        v_cache[first / 2u + i] = word;
    }
  } else {
    for (uint j = tid; j < d; j += THREADS) {
      if (is_k)
        k_cache[first + j] = floatBitsToUint(row[j]);
      else
        v_cache[first + j] = floatBitsToUint(row[j]);
    }
  }
}
