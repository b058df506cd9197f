// Shared helpers of the Redwing compute kernels (included by every .comp file).
//
// Portability rules (docs/gpu.md): no 16-bit storage types (16-bit data is read and written as
// uint32 words), no subgroup operations except row sums by subgroupAdd behind specialization
// constants with shared-memory fallbacks (matvec_teams.glsl, matvec.glsl; no subgroup size
// assumed), no 64-bit types or atomics (32-bit ones only: arrival counters, arrival.glsl),
// specialization constants never as array sizes (constant_id 0: threads per workgroup, chosen
// per device; 1-4: the down product's shape; 5: matvec.glsl's subgroup sums), every binding in
// set 0.

// Workgroups are laid out over x and y so that more than 65535 fit in one dispatch; this is the
// linear index of the current one.
uint linear_group() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }

// A 16-bit value (bf16 or IEEE half bits) as float32. scale_type: 0 bf16, 1 f16, 2 f32.
float half_bits_to_float(uint h, uint scale_type) {
  return scale_type == 0u ? uintBitsToFloat(h << 16) : unpackHalf2x16(h).x;
}

// Scale or bias i of a quantized matrix whose scales are stored as raw uint32 words.
#define LOAD_SCALE(BUF, I, TYPE)                                                          \
  ((TYPE) == 2u ? uintBitsToFloat(BUF[(I)])                                               \
                : half_bits_to_float((BUF[(I) >> 1u] >> (((I)&1u) * 16u)) & 0xffffu, (TYPE)))

// float32 -> IEEE half bits, round to nearest even (as the CPU backend's f32_to_f16: GLSL's
// packHalf2x16 may round toward zero).
uint f32_to_f16_bits(float x) {
  uint bits = floatBitsToUint(x);
  uint sign = (bits >> 16) & 0x8000u;
  uint magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {
    if (magnitude == 0x7f800000u) return sign | 0x7c00u;
    return sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude < 0x38800000u) {
    uint exponent = magnitude >> 23;
    uint shift = 126u - exponent;
    if (shift > 24u) return sign;
    uint mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    uint q = mantissa >> shift;
    uint rest = mantissa & ((1u << shift) - 1u);
    uint half_unit = 1u << (shift - 1u);
    if (rest > half_unit || (rest == half_unit && (q & 1u) != 0u)) ++q;
    return sign | q;
  }
  uint h = (magnitude >> 13) - (112u << 10);
  uint rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) ++h;
  return sign | h;
}

// Two floats as IEEE halves in one word, the first in the low half: an f16 KV cache's layout.
uint f16_pair_bits(float lo, float hi) { return f32_to_f16_bits(lo) | (f32_to_f16_bits(hi) << 16); }

// Every RMSNorm's factor: 1 / sqrt(mean square + eps) of n values whose squares sum to ss.
float inv_rms(float ss, uint n, float eps) { return 1.0 / sqrt(ss / float(n) + eps); }

// RoPE's rotation of the pair (a, b) (elements j and j + half of a head) by the angle whose
// cosine is c and sine s.
vec2 rotate_pair(float a, float b, float c, float s) { return vec2(a * c - b * s, b * c + a * s); }

// tanh that stays finite for any input (some drivers compute tanh through exp and overflow).
float safe_tanh(float x) {
  float e = exp(-2.0 * abs(x));
  float t = (1.0 - e) / (1.0 + e);
  return x < 0.0 ? -t : t;
}

// GeGLU: gelu_tanh(a) * b (elementwise.comp's op 5, and moe_matvec's input staging).
float gelu_tanh_mul(float a, float b) {
  const float k_sqrt_2_over_pi = 0.7978845608028654;
  const float t = safe_tanh(k_sqrt_2_over_pi * (a + 0.044715 * a * a * a));
  return 0.5 * a * (1.0 + t) * b;
}
