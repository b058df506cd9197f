// Stores the keys and values of positions pos0 .. pos0 + rows - 1 into a layer's cache (row
// `pos` or `pos % capacity` for ring buffers), as float32 or as IEEE half rounded to nearest
// even. Caches are uint32 words; one thread writes one pair of values (width is even).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 1) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 2) buffer KCache { uint k_cache[]; };
layout(std430, set = 0, binding = 3) buffer VCache { uint v_cache[]; };
layout(push_constant) uniform Params {
  uint rows;
  uint width;  // kv_heads * head_dim
  uint k_offset;
  uint k_stride;
  uint v_offset;
  uint v_stride;
  uint pos0;
  uint capacity;
  uint ring;
  uint f16;
} p;

void main() {
  const uint idx = linear_group() * 64u + gl_LocalInvocationID.x;
  const uint pairs = p.width / 2u;
  if (idx >= p.rows * pairs) return;
  const uint t = idx / pairs;
  const uint j = idx % pairs;
  const uint pos = p.pos0 + t;
  const uint slot = p.ring != 0u ? pos % p.capacity : pos;
  const uint ks = p.k_offset + t * p.k_stride + 2u * j;
  const uint vs = p.v_offset + t * p.v_stride + 2u * j;
  if (p.f16 != 0u) {
    const uint w = slot * pairs + j;
    k_cache[w] = f16_pair_bits(k[ks], k[ks + 1u]);
    v_cache[w] = f16_pair_bits(v[vs], v[vs + 1u]);
  } else {
    const uint e = slot * p.width + 2u * j;
    k_cache[e] = floatBitsToUint(k[ks]);
    k_cache[e + 1u] = floatBitsToUint(k[ks + 1u]);
    v_cache[e] = floatBitsToUint(v[vs]);
    v_cache[e + 1u] = floatBitsToUint(v[vs + 1u]);
  }
}
